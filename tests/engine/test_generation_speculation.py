"""BatchEngine on real llama.cpp with n-gram speculation: the same text, counts and limits as one
token a step, and a session's KV left as plain decoding leaves it.

On the successor model: verifying a window is another computation shape than one token a step,
and tiny.gguf's flat logits let a long greedy text flip with the shape (by a rounding, on some
CPUs), so equal texts there would test the CPU. The successor model's margin is wide."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.load_options import SpecMode
from skippyctl.engine.generation import GenerateRequest
from skippyctl.engine.speculation import SpecConfig
from tests.engine.conftest import loaded_model
from tests.engine.generation_harness import PROMPT, EngineFactory, Recorder, greedy

NGRAM = SpecConfig(SpecMode.NGRAM, draft_tokens=8)
SPEC_PROMPTS = ("The quick brown fox", "Once upon a time", "one two three four five")


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    yield from loaded_model(fixture_dir / "tiny-successor.gguf")


def _both_modes(
    make_engine: EngineFactory,
    requests: list[GenerateRequest],
    sequential: bool = False,
    **engine: Any,
) -> tuple[Recorder, Recorder]:
    """The same requests on an engine without and one with n-gram speculation."""
    recorders = []
    for spec in (SpecConfig(), NGRAM):
        h = make_engine(speculation=spec, **engine)
        if sequential:
            for count, request in enumerate(requests, 1):
                h.engine.submit(request)
                h.recorder.wait_done(count)
        else:
            for request in requests:
                h.engine.submit(request)
            h.recorder.wait_done(len(requests))
        recorders.append(h.recorder)
    return recorders[0], recorders[1]


@pytest.mark.parametrize("lanes", [1, 3])
def test_speculation_commits_exactly_what_one_token_a_step_gives(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...], lanes: int
) -> None:
    requests = [
        GenerateRequest(f"s{i}", prompt=p, max_tokens=120, sampling=greedy(eog_ban))
        for i, p in enumerate(SPEC_PROMPTS[:lanes])
    ]
    plain, speculated = _both_modes(make_engine, requests, lanes=lanes, n_threads=2)
    accepted = 0
    for request in requests:
        off = plain.one(request.request_id, "gen_done")["figures"]
        on = speculated.one(request.request_id, "gen_done")["figures"]
        assert speculated.text(request.request_id) == plain.text(request.request_id)
        assert on["generated_tokens"] == off["generated_tokens"] == 120
        assert off["spec_windows"] == off["spec_proposed"] == off["spec_accepted"] == 0
        assert 0 <= on["spec_accepted"] <= on["spec_proposed"] <= 8 * on["spec_windows"]
        accepted += on["spec_accepted"]
    # The successor model's greedy text is a cycle: some proposals must have been right.
    assert accepted > 0


def test_a_session_continues_from_speculated_kv_as_from_plain_kv(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """Rejected proposals leave no KV behind: the session's next request, which reuses the
    lane's KV, continues exactly as without speculation."""
    first = GenerateRequest(
        "k1", prompt=PROMPT, session="s", max_tokens=60, sampling=greedy(eog_ban)
    )
    plain, speculated = _both_modes(make_engine, [first], lanes=1)
    follow = PROMPT + plain.text("k1") + " and"
    second = GenerateRequest(
        "k2", prompt=follow, session="s", max_tokens=40, sampling=greedy(eog_ban)
    )
    plain2, speculated2 = _both_modes(make_engine, [first, second], sequential=True, lanes=1)
    assert speculated2.text("k1") == plain2.text("k1") == plain.text("k1")
    assert speculated2.text("k2") == plain2.text("k2")
    on, off = speculated2.one("k2", "gen_started"), plain2.one("k2", "gen_started")
    assert on["reused_tokens"] == off["reused_tokens"] > 0


def test_speculation_keeps_the_lane_limit_stop_strings_and_max_tokens(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    plain, _ = _both_modes(
        make_engine,
        [GenerateRequest("p", prompt=PROMPT, max_tokens=40, sampling=greedy(eog_ban))],
        lanes=1,
    )
    text = plain.text("p")
    stop = text[25:28]  # somewhere inside the generation, likely inside a window
    requests = [
        GenerateRequest("full", prompt=PROMPT, max_tokens=500, sampling=greedy(eog_ban)),
        GenerateRequest(
            "stop", prompt=PROMPT, max_tokens=40, stop=(stop,), sampling=greedy(eog_ban)
        ),
        GenerateRequest("short", prompt=PROMPT, max_tokens=13, sampling=greedy(eog_ban)),
    ]
    # 128 cells a lane: "full" runs into the lane's end.
    off, on = _both_modes(make_engine, requests, lanes=3, n_ctx=3 * 128, n_threads=2)
    for request_id in ("full", "stop", "short"):
        assert on.text(request_id) == off.text(request_id), request_id
        done_on, done_off = on.one(request_id, "gen_done"), off.one(request_id, "gen_done")
        for key in ("stop_reason", "reason"):
            assert done_on[key] == done_off[key], (request_id, key)
        generated = done_on["figures"]["generated_tokens"]
        assert generated == done_off["figures"]["generated_tokens"], request_id
    assert on.one("full", "gen_done")["reason"] == "context_exhausted"
    assert on.one("stop", "gen_done")["stop_reason"] == "stop"
    assert on.one("short", "gen_done")["figures"]["generated_tokens"] == 13
