"""Generation requests that have arrived but not yet reached an engine: how the API tells an idle
engine that more are on their way, so it prefills a burst in one step.

Why: clients that start together (a benchmark's sessions, an agent's parallel calls, the next
turn of sessions that finished together) send their requests within a millisecond or two, and
the host handles them one after another. An idle engine starts a step with the first alone;
the others wait for the next step — a whole prefill later — and stay a step apart from then
on. llama-server's HTTP threads hand a burst over within a fraction of a millisecond, so its
loop usually prefills it together. Here each request counts itself when the HTTP server hands
it to the app (before its body is read) and settles when it is submitted. Sessions that finished
together also come back together, a few milliseconds apart (each client reads its last chunk,
then sends the next turn): a session that finished in the last :data:`RETURN_WINDOW_S` counts
as on its way until its next request is submitted. A request submitted while others are on
their way asks the engine to gather (``Generate.gather``): an idle engine then waits for the
burst's last request (one submitted with nothing on its way after it), at most
:data:`~skippyctl.engine.generation.GATHER_MAX_S`. A lone client never waits: its own session is
the only one that finished.

Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["GENERATION_PATHS", "RETURN_WINDOW_S", "GenerationArrivals", "count_arrivals"]

GENERATION_PATHS: Final = frozenset({"/v1/completions", "/v1/chat/completions"})
_ARRIVAL: Final = "skippyctl.arrival"
RETURN_WINDOW_S: Final = 0.05
"""How long a session that just finished a request counts as coming back: clients that run
sessions side by side send the next turn within milliseconds of reading the last."""


Recently = tuple[str, str | None]
"""A generation's model and session key (None: the request named no session)."""


class _Arrival:
    __slots__ = ("settled",)

    def __init__(self) -> None:
        self.settled = False


class GenerationArrivals:
    """How many generation requests have arrived and not yet settled, and which sessions
    finished a request in the last :data:`RETURN_WINDOW_S` and have not sent the next yet."""

    __slots__ = ("_clock", "_returning", "pending")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.pending = 0
        self._clock = clock
        self._returning: deque[tuple[float, Recently]] = deque()

    def arrive(self, scope: Scope) -> _Arrival:
        arrival = _Arrival()
        scope.setdefault("extensions", {})[_ARRIVAL] = arrival
        self.pending += 1
        return arrival

    def settle(self, arrival: _Arrival) -> None:
        if not arrival.settled:
            arrival.settled = True
            self.pending -= 1

    def finished(self, model: str, session: str | None) -> None:
        """A generation of `session` on `model` ended: its client may send the next soon."""
        self._returning.append((self._clock(), (model, session)))

    def submitting(self, scope: Scope, model: str, session: str | None) -> bool:
        """Settle the request of `scope` (for `session` on `model`) as it is submitted: whether
        more are on their way — others have arrived, or other sessions of this model finished
        moments ago and have not come back yet (the engine should gather)."""
        arrival = (scope.get("extensions") or {}).get(_ARRIVAL)
        if isinstance(arrival, _Arrival):
            self.settle(arrival)
        returning = self._returning
        horizon = self._clock() - RETURN_WINDOW_S
        while returning and returning[0][0] < horizon:
            returning.popleft()
        key = (model, session)
        for index, (_, waiting) in enumerate(returning):
            if waiting == key:
                del returning[index]
                break
        return self.pending > 0 or any(waiting[0] == model for _, waiting in returning)


def count_arrivals(app: ASGIApp, arrivals: GenerationArrivals) -> ASGIApp:
    """`app` counting each generation request from its arrival until it is submitted (or
    answered without being submitted)."""

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in GENERATION_PATHS:
            await app(scope, receive, send)
            return
        arrival = arrivals.arrive(scope)
        try:
            await app(scope, receive, send)
        finally:
            arrivals.settle(arrival)

    return counted
