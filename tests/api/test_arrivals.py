"""Which generation requests ask an idle engine to gather (api/arrivals.py): others that have
arrived and not yet been submitted, and sessions of the same model that finished moments ago
and have not come back; a lone client never asks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skippyctl.api.arrivals import RETURN_WINDOW_S, GenerationArrivals, count_arrivals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _arrived(arrivals: GenerationArrivals) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http", "path": "/v1/completions"}
    arrivals.arrive(scope)
    return scope


def test_requests_that_arrived_together_gather_until_the_last_is_submitted() -> None:
    arrivals = GenerationArrivals(Clock())
    scopes = [_arrived(arrivals) for _ in range(3)]
    assert [arrivals.submitting(s, "m", f"s{i}") for i, s in enumerate(scopes)] == [
        True,
        True,
        False,
    ]
    assert arrivals.pending == 0


def test_a_lone_client_never_gathers_though_its_own_session_just_finished() -> None:
    arrivals = GenerationArrivals(Clock())
    for _ in range(3):
        assert arrivals.submitting(_arrived(arrivals), "m", "alone") is False
        arrivals.finished("m", "alone")
    arrivals = GenerationArrivals(Clock())
    for _ in range(3):  # no session named: one anonymous client
        assert arrivals.submitting(_arrived(arrivals), "m", None) is False
        arrivals.finished("m", None)


def test_sessions_that_finished_together_are_expected_back_until_each_returns() -> None:
    clock = Clock()
    arrivals = GenerationArrivals(clock)
    for session in ("a", "b", "c"):
        arrivals.finished("m", session)
    clock.now += 0.005  # each client reads its last chunk, then sends the next turn
    assert arrivals.submitting(_arrived(arrivals), "m", "a") is True
    assert arrivals.submitting(_arrived(arrivals), "m", "b") is True
    assert arrivals.submitting(_arrived(arrivals), "m", "c") is False


def test_anonymous_clients_count_one_each() -> None:
    arrivals = GenerationArrivals(Clock())
    arrivals.finished("m", None)
    arrivals.finished("m", None)
    assert arrivals.submitting(_arrived(arrivals), "m", None) is True
    assert arrivals.submitting(_arrived(arrivals), "m", None) is False


def test_sessions_of_another_model_or_long_gone_are_not_waited_for() -> None:
    clock = Clock()
    arrivals = GenerationArrivals(clock)
    arrivals.finished("other", "x")
    assert arrivals.submitting(_arrived(arrivals), "m", "a") is False
    arrivals.finished("m", "b")
    clock.now += RETURN_WINDOW_S * 1.5
    assert arrivals.submitting(_arrived(arrivals), "m", "a") is False


def test_the_wrapper_counts_generation_requests_until_they_are_answered() -> None:
    arrivals = GenerationArrivals(Clock())
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(arrivals.pending)
        if scope.get("path") == "/v1/chat/completions":
            raise RuntimeError("a handler that failed before submitting")

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        return None

    async def run() -> None:
        counted = count_arrivals(app, arrivals)
        await counted({"type": "http", "path": "/v1/completions"}, receive, send)
        await counted({"type": "http", "path": "/api/runtime/ps"}, receive, send)
        with pytest.raises(RuntimeError):
            await counted({"type": "http", "path": "/v1/chat/completions"}, receive, send)
        await counted({"type": "lifespan"}, receive, send)

    asyncio.run(run())
    assert seen == [1, 0, 1, 0]
    assert arrivals.pending == 0  # settled by the wrapper, also when the handler raised
