"""The event feeds a command follows (`skippyctl.cli.follow`).

A feed (`EventFeed`) hands out `StreamItem`s and raises `StreamEnded` once it is over. Two feeds:
`LiveStream`, the runtime's SSE stream (attached mode: frames decoded by the wire codec, state
frames read by the typed state reader), and `SubscriptionFeed`, an in-process pipeline
subscription (embedded mode). Frames or events the codec cannot take are skipped and counted by
reason (`LiveStream.skipped`), never fatal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from skippyctl.events.envelope import Event
from skippyctl.output.codec import SkipReason, decode_frame_event
from skippyctl.output.state_reader import StateDocumentView, read_state_document
from skippyctl.pipeline.dispatch import Subscription, SubscriptionClosed

if TYPE_CHECKING:
    from collections.abc import Callable

    from skippyctl.client.http import FrameReader, RuntimeClient


class StreamEnded(Exception):
    """The event feed ended (runtime gone or stream cut); the message says why."""


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One decoded event with its dispatcher sequence and resume cursor."""

    event: Event
    sequence: int
    cursor: str | None


class EventFeed(Protocol):
    def next(self, timeout_s: float) -> StreamItem | None:
        """The next event, None on timeout; raises StreamEnded when the feed has ended."""
        ...


class SubscriptionFeed:
    """Events from an in-process pipeline (embedded mode)."""

    def __init__(self, subscription: Subscription, cursor: Callable[[int], str]) -> None:
        self._subscription = subscription
        self._cursor = cursor

    def next(self, timeout_s: float) -> StreamItem | None:
        try:
            item = self._subscription.get(timeout_s)
        except SubscriptionClosed as closed:
            raise StreamEnded(f"the runtime stopped ({closed.reason.value})") from closed
        if item is None:
            return None
        return StreamItem(item.event, item.sequence, self._cursor(item.sequence))


class LiveStream:
    """The runtime's SSE stream read on a background thread (attached mode).

    `state` is the typed reading of the `runtime_state` frame's document (None until it
    arrived), `state_sequence` the dispatcher position it describes; `last_cursor` is where to
    resume (the cursor of the last event frame read, or the cursor the stream was opened with);
    `skipped` counts what the codec did not take, by reason.
    """

    def __init__(self, client: RuntimeClient, since: str | None = None) -> None:
        from skippyctl.client.http import FrameReader

        self.reader: FrameReader = FrameReader(client, since)
        self.state: StateDocumentView | None = None
        self.state_sequence: int | None = None
        self.state_at = 0.0
        self.last_cursor: str | None = since
        self.last_sequence = 0
        self.gaps: list[dict[str, Any]] = []
        self.skipped: dict[SkipReason, int] = {}

    def wait_connected(self, timeout_s: float = 10.0) -> None:
        self.reader.connected.wait(timeout_s)

    def next(self, timeout_s: float) -> StreamItem | None:
        """The next event (None when none arrived within `timeout_s` or the frame carried no
        event); raises StreamEnded when the stream is over."""
        frame = self.reader.get(timeout_s)
        if frame is False:
            return None
        if frame is None:
            raise StreamEnded("the runtime closed the event stream")
        if isinstance(frame, Exception):
            raise StreamEnded(str(frame))
        assert not isinstance(frame, bool)
        if frame.name == "runtime_state":
            state = frame.data.get("state")
            self.state = read_state_document(state if isinstance(state, dict) else {})
            self.state_sequence = int(frame.data.get("sequence", 0))
            self.state_at = time.monotonic()
            return None
        if frame.name == "runtime_replay_gap":
            gap = frame.data.get("gap")
            self.gaps.append(gap if isinstance(gap, dict) else {})
            return None
        if frame.name != "runtime_event":
            return None
        sequence = int(frame.data.get("sequence", 0))
        self.last_cursor = frame.cursor or self.last_cursor
        self.last_sequence = max(self.last_sequence, sequence)
        event, skipped = decode_frame_event(frame.data)
        for reason in skipped:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if event is None:
            return None
        return StreamItem(event, sequence, frame.cursor)
