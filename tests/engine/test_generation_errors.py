"""BatchEngine on real llama.cpp (tiny.gguf): an invalid or duplicate request, or an exception
inside one request, fails only that request; the engine serves on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine.generation import ChatMessage, GenerateRequest, SamplingParams
from tests.engine.generation_harness import PROMPT, EngineFactory, greedy


@pytest.mark.parametrize(
    "request_",
    [
        GenerateRequest("x"),
        GenerateRequest("x", prompt="a", messages=(ChatMessage("user", "b"),)),
        GenerateRequest("x", prompt="a", max_tokens=0),
        GenerateRequest("x", messages=()),
        GenerateRequest("x", prompt="a", stop=["a"]),  # type: ignore[arg-type]  # wrong type on purpose
        GenerateRequest("x", prompt="a", sampling=SamplingParams(logit_bias=((10**6, 1.0),))),
        GenerateRequest("x", messages=(ChatMessage("user", "nul\x00"),)),
        GenerateRequest("", prompt="a"),
    ],
    ids=[
        "no-prompt", "both", "zero-tokens", "empty-chat", "stop-list", "bias-vocab", "nul",
        "empty-id",
    ],
)  # fmt: skip
def test_invalid_requests_fail_with_invalid_configuration(
    make_engine: EngineFactory, request_: GenerateRequest
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(request_)
    h.engine.submit(GenerateRequest("after", prompt=PROMPT, max_tokens=2))
    h.recorder.wait_done(2)
    bad = h.recorder.one(request_.request_id, "gen_done")
    assert (bad["outcome"], bad["reason"]) == ("failed", "invalid_configuration")
    assert h.recorder.one("after", "gen_done")["outcome"] == "completed"


def test_duplicate_in_flight_request_id_is_refused(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, start=False)
    h.engine.submit(GenerateRequest("dup", prompt=PROMPT, max_tokens=3, sampling=greedy(eog_ban)))
    h.engine.submit(GenerateRequest("dup", prompt=PROMPT, max_tokens=3, sampling=greedy(eog_ban)))
    h.engine.start()
    done = h.recorder.wait_done(2)
    assert sorted(m["outcome"] for m in done) == ["completed", "failed"]


def test_an_exception_inside_one_request_fails_only_that_request(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    calls = {"n": 0}

    def flaky_sample(sampler: Any, context: Any, index: int) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return int(llama_cpp.llama_sampler_sample(sampler, context, index))

    proxy = SimpleNamespace(
        **{name: getattr(llama_cpp, name) for name in dir(llama_cpp) if name.startswith("llama_")}
    )
    proxy.llama_sampler_sample = flaky_sample
    h = make_engine(lanes=2, llama=proxy)
    for rid in ("a", "b"):
        h.engine.submit(GenerateRequest(rid, prompt=PROMPT, max_tokens=8, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    h.engine.submit(GenerateRequest("c", prompt=PROMPT, max_tokens=8, sampling=greedy(eog_ban)))
    done = h.recorder.wait_done(3)
    outcomes = sorted((m["outcome"], m["reason"]) for m in done)
    assert outcomes == [
        ("completed", None),
        ("completed", None),
        ("failed", "internal_runtime_failure"),
    ]
