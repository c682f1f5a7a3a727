"""Pieces every command shares: Ctrl-C as a flag, the event feeds (attached or embedded)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from skippyctl.events.envelope import Event
from skippyctl.output.wire import event_from_object
from skippyctl.pipeline.dispatch import Subscription, SubscriptionClosed


class InterruptRequests:
    """Turns SIGINT into a counter the command's loop reads, so Ctrl-C never lands mid-write."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> InterruptRequests:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


class FeedClosed(Exception):
    """The event feed ended (runtime gone or stream cut); the message says why."""


@dataclass(frozen=True, slots=True)
class FedEvent:
    event: Event
    sequence: int
    cursor: str | None


class EventFeed(Protocol):
    def next(self, timeout_s: float) -> FedEvent | None:
        """The next event, None on timeout; raises FeedClosed when the feed has ended."""
        ...


class SubscriptionFeed:
    """Events from an in-process pipeline (embedded mode)."""

    def __init__(self, subscription: Subscription, cursor: Callable[[int], str]) -> None:
        self._subscription = subscription
        self._cursor = cursor

    def next(self, timeout_s: float) -> FedEvent | None:
        try:
            item = self._subscription.get(timeout_s)
        except SubscriptionClosed as closed:
            raise FeedClosed(f"the runtime stopped ({closed.reason.value})") from closed
        if item is None:
            return None
        return FedEvent(item.event, item.sequence, self._cursor(item.sequence))


class StreamFeed:
    """Events from the runtime's live SSE stream (attached mode); skips frames it cannot
    decode (a newer runtime's ids) and keeps the last cursor for resuming."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.last_cursor: str | None = None
        self.state: dict[str, Any] | None = None
        self.gaps = 0

    def next(self, timeout_s: float) -> FedEvent | None:
        frame = self._reader.get(timeout_s)
        if frame is False:
            return None
        if frame is None:
            raise FeedClosed("the runtime closed the event stream")
        if isinstance(frame, Exception):
            raise FeedClosed(str(frame))
        self.last_cursor = frame.cursor or self.last_cursor
        if frame.name == "runtime_state":
            self.state = frame.data.get("state")
            return None
        if frame.name == "runtime_replay_gap":
            self.gaps += 1
            return None
        if frame.name != "runtime_event":
            return None
        event = event_from_object(frame.data.get("event") or {})
        if event is None:
            return None
        return FedEvent(event, int(frame.data.get("sequence", 0)), frame.cursor)
