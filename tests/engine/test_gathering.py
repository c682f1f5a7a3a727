"""An idle engine gathering the sessions that come back together (real llama.cpp, tiny.gguf):
when several generations ended just before and only some of their sessions' next requests have
arrived, the engine waits a moment (``GATHER_WAIT_S``) so one step prefills them all, instead of
a step for the first and another for the rest. Nothing waits after a single generation ended,
and the wait is bounded when the others never come.

``llama_decode`` is wrapped to record each step's sequences; the gathering itself is observed on
the core (``gather_until``), so the second request is submitted while the engine is known to be
waiting (no timing is assumed)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine import decode_core
from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import EngineFactory, Harness, greedy, llama_with_decode

TOKENS = 6


def _recording(
    make_engine: EngineFactory, lanes: int = 3, start: bool = True
) -> tuple[Harness, list[Counter[int]]]:
    steps: list[Counter[int]] = []

    def decode(context: Any, batch: Any) -> int:
        steps.append(Counter(int(batch.seq_id[i][0]) for i in range(batch.n_tokens)))
        return int(llama_cpp.llama_decode(context, batch))

    proxy = llama_with_decode(decode)
    return make_engine(lanes=lanes, llama=proxy, start=start), steps


def _two_end_together(h: Harness, ban: tuple[tuple[int, float], ...]) -> None:
    """Requests a and b end in the same step: queued before the decode thread starts (this thread
    tokenizes each as it submits it, and a loaded machine could start a alone)."""
    h.engine.submit(_request("a", ban))
    h.engine.submit(_request("b", ban))
    h.engine.start()
    h.recorder.wait_done(2)


def _request(request_id: str, ban: tuple[tuple[int, float], ...]) -> GenerateRequest:
    return GenerateRequest(
        request_id, prompt=f"once upon {request_id}", max_tokens=TOKENS, sampling=greedy(ban)
    )


def _wait_gathering(h: Harness, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while h.engine._core.gather_until is None:
        assert time.monotonic() < deadline, "the engine did not wait for the others"
        time.sleep(0.0002)


def _c_completes(h: Harness, terminals: int) -> None:
    """The request "c" ends completed, the last of `terminals` (without waiting out a gather
    the test made 30 s long)."""
    done = h.recorder.wait_done(terminals, timeout_s=10.0)
    assert done[-1]["request_id"] == "c" and done[-1]["outcome"] == "completed"


def _lane(h: Harness, request_id: str) -> int:
    return int(h.recorder.one(request_id, "gen_started")["lane"])


def test_sessions_that_come_back_together_share_their_first_step(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decode_core, "GATHER_WAIT_S", 30.0)  # only the arrival ends the wait
    h, steps = _recording(make_engine, start=False)
    _two_end_together(h, eog_ban)
    h.engine.submit(_request("c", eog_ban))
    _wait_gathering(h)
    h.engine.submit(_request("d", eog_ban))
    h.recorder.wait_done(4)
    first_with_c = next(rows for rows in steps if _lane(h, "c") in rows)
    assert _lane(h, "d") in first_with_c
    done = {m["request_id"]: m for m in h.recorder.done()}
    assert all(done[r]["figures"]["generated_tokens"] == TOKENS for r in "abcd")


def test_nothing_waits_after_a_single_generation_ended(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decode_core, "GATHER_WAIT_S", 30.0)  # a wait would outlast the test
    h, _steps = _recording(make_engine)
    h.engine.submit(_request("a", eog_ban))
    h.recorder.wait_done(1)
    h.engine.submit(_request("c", eog_ban))
    _c_completes(h, 2)


def test_the_wait_ends_when_the_others_never_come(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decode_core, "GATHER_WAIT_S", 0.05)
    h, _steps = _recording(make_engine, start=False)
    _two_end_together(h, eog_ban)
    h.engine.submit(_request("c", eog_ban))
    _wait_gathering(h)
    _c_completes(h, 3)


def test_nothing_waits_after_generations_that_ended_one_after_another(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A lone client's requests (a warm-up, then the next) end in different steps: no session
    # is on its way.
    monkeypatch.setattr(decode_core, "GATHER_WAIT_S", 30.0)  # a wait would outlast the test
    h, _steps = _recording(make_engine)
    h.engine.submit(_request("a", eog_ban))
    h.recorder.wait_done(1)
    h.engine.submit(_request("b", eog_ban))
    h.recorder.wait_done(2)
    h.engine.submit(_request("c", eog_ban))
    _c_completes(h, 3)
