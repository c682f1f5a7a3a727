"""A failed llama_decode becomes one ``compute_failed`` message with its return code mapped to a
reason, the batch's requests fail, and the decode thread serves on. Real llama.cpp (tiny.gguf)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import orjson
import pytest

from skippyctl.engine.decode_core import DECODE_RETURN_REASONS
from skippyctl.engine.generation import BatchEngine, GenerateRequest, SamplingParams
from skippyctl.engine.protocol import encode
from skippyctl.engine.protocol_messages import EngineMessage

WAIT_S = 60.0
GREEDY = SamplingParams(temperature=0.0)


class CorruptingLlama:
    """llama_cpp, except that an armed ``llama_decode`` first writes a token id beyond the
    vocabulary into the batch: llama.cpp itself then refuses the batch (returns -1, "invalid
    token"), a real failure of the real call. With ``fake_return`` set the call is not made
    and that value is returned instead — for the codes (-2, -3, 1) a tiny CPU model cannot be
    driven into for real (a failed buffer allocation or backend compute, no KV slot behind the
    lane accounting)."""

    def __init__(self) -> None:
        self.armed = False
        self.fake_return: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, context: Any, batch: Any) -> Any:
        if not self.armed:
            return llama_cpp.llama_decode(context, batch)
        self.armed = False
        if self.fake_return is not None:
            return self.fake_return
        batch.token[0] = 1 << 30
        return llama_cpp.llama_decode(context, batch)


class Messages:
    def __init__(self) -> None:
        self.all: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, message: EngineMessage) -> None:
        with self._cond:
            self.all.append(orjson.loads(encode(message)))  # the payload the host receives
            self._cond.notify_all()

    def done(self, request_id: str) -> dict[str, Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: self._done(request_id), WAIT_S), request_id
            return self._done(request_id)[0]

    def _done(self, request_id: str) -> list[dict[str, Any]]:
        return [m for m in self.all if m["msg"] == "gen_done" and m["request_id"] == request_id]

    def of(self, tag: str) -> list[dict[str, Any]]:
        with self._cond:
            return [m for m in self.all if m["msg"] == tag]


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(fixture_dir / "tiny.gguf"), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


@pytest.fixture
def engine(model: Any) -> Iterator[tuple[BatchEngine, CorruptingLlama, Messages]]:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 512
    params.n_seq_max = 1
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    llama = CorruptingLlama()
    messages = Messages()
    batch = BatchEngine(llama, model, context, lanes=1, emit=messages, n_threads=1)  # type: ignore[arg-type]  # a duck-typed llama_cpp
    batch.start()
    try:
        yield batch, llama, messages
    finally:
        batch.stop()
        llama_cpp.llama_free(context)


def test_a_batch_llama_cpp_refuses_is_a_compute_failure_and_the_engine_serves_on(
    engine: tuple[BatchEngine, CorruptingLlama, Messages],
) -> None:
    batch, llama, messages = engine
    llama.armed = True
    batch.submit(GenerateRequest("a", prompt="one two", sampling=GREEDY))
    a = messages.done("a")
    assert (a["outcome"], a["reason"]) == ("failed", "internal_runtime_failure")
    (failed,) = messages.of("compute_failed")
    assert failed == {
        "msg": "compute_failed",
        "return_code": -1,
        "reason": "invalid_configuration",
        "requests": 1,
    }
    batch.submit(GenerateRequest("b", prompt="three four", max_tokens=3, sampling=GREEDY))
    assert messages.done("b")["outcome"] == "completed"
    assert len(messages.of("compute_failed")) == 1


@pytest.mark.parametrize(("code", "reason"), sorted(DECODE_RETURN_REASONS.items()))
def test_each_decode_return_code_maps_to_its_reason(
    engine: tuple[BatchEngine, CorruptingLlama, Messages], code: int, reason: Any
) -> None:
    batch, llama, messages = engine
    llama.fake_return = code
    llama.armed = True
    batch.submit(GenerateRequest("a", prompt="one two", sampling=GREEDY))
    assert messages.done("a")["outcome"] == "failed"
    (failed,) = messages.of("compute_failed")
    assert (failed["return_code"], failed["reason"]) == (code, reason.value)


def test_an_aborted_decode_is_reported_as_a_cancellation(
    engine: tuple[BatchEngine, CorruptingLlama, Messages],
) -> None:
    batch, llama, messages = engine
    llama.fake_return = 2  # the abort callback's return value
    llama.armed = True
    batch.submit(GenerateRequest("a", prompt="one two", sampling=GREEDY))
    assert messages.done("a")["outcome"] == "cancelled"
    (aborted,) = messages.of("compute_failed")
    assert (aborted["return_code"], aborted["reason"]) == (2, "cancellation")
