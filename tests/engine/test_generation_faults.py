"""BatchEngine under an injected llama.cpp fault: every submitted request still gets exactly one
gen_done, and the decode thread serves on. Real llama.cpp (tiny.gguf) under a thin wrapper."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import orjson
import pytest

from skippyctl.engine.generation import BatchEngine, GenerateRequest, SamplingParams
from skippyctl.engine.protocol import encode
from skippyctl.engine.protocol_messages import EngineMessage

WAIT_S = 60.0


class FaultyLlama:
    """llama_cpp, except that an armed `llama_memory_seq_rm` raises once — after doing its work,
    so the KV stays consistent. Injected: llama.cpp reports failures by return value, so an
    exception at this point cannot be produced for real."""

    def __init__(self) -> None:
        self.armed = False
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_memory_seq_rm(self, *args: Any) -> Any:
        result = llama_cpp.llama_memory_seq_rm(*args)
        if self.armed:
            self.armed = False
            self.raised += 1
            raise RuntimeError("injected fault")
        return result


class Done:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, message: EngineMessage) -> None:
        with self._cond:
            self.messages.append(orjson.loads(encode(message)))  # the payload the host receives
            self._cond.notify_all()

    def wait(self, request_id: str) -> list[dict[str, Any]]:
        with self._cond:
            assert self._cond.wait_for(lambda: self.of(request_id), WAIT_S), request_id
            return self.of(request_id)

    def of(self, request_id: str) -> list[dict[str, Any]]:
        return [
            m for m in self.messages if m["msg"] == "gen_done" and m["request_id"] == request_id
        ]


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(fixture_dir / "tiny.gguf"), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


def test_a_fault_while_admitting_fails_that_request_and_the_engine_serves_on(model: Any) -> None:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 512
    params.n_seq_max = 1
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    llama = FaultyLlama()
    done = Done()
    engine = BatchEngine(llama, model, context, lanes=1, emit=done, n_threads=1)  # type: ignore[arg-type]  # a duck-typed llama_cpp
    engine.start()
    greedy = SamplingParams(temperature=0.0)
    try:
        engine.submit(GenerateRequest("a", prompt="one two", session="s1", sampling=greedy))
        assert done.wait("a")[0]["outcome"] == "completed"  # lane 0 keeps s1 warm
        # b needs the lane: s1 is evicted, and clearing its KV raises.
        llama.armed = True
        engine.submit(GenerateRequest("b", prompt="three", session="s2", sampling=greedy))
        (b,) = done.wait("b")
        assert llama.raised == 1
        assert (b["outcome"], b["reason"]) == ("failed", "internal_runtime_failure")
        engine.submit(GenerateRequest("c", prompt="four five", max_tokens=3, sampling=greedy))
        assert [m["outcome"] for m in done.wait("c")] == ["completed"]
        assert len(done.of("b")) == 1
    finally:
        engine.stop()
        llama_cpp.llama_free(context)
