"""Where the dashboard's events come from: the `EventSource` protocol and three sources.

Contract of an `EventSource`:

- `start(sink)` returns at once; the source then calls `sink(item)` from a thread it owns (never the
  UI thread), one item at a time, in order. An item is an `Event` or a connection fact:
  `RuntimeDown` (the stream broke; the source is reconnecting), `RuntimeBack` (the stream is back,
  optionally with a freshly fetched reduced state to resynchronise from), `DecodeSkipped` (input it
  could not take, counted by reason), `SourceEnded` (a finite source ran out) or
  `LoadableModels` (what the runtime may load on demand, read from its state document: no
  event says it).
- The sink is the dashboard's `SnapshotStore.deliver`: it reduces under a short lock and returns;
  it never blocks on the UI. A source must not call it again after `stop()` returns.
- `stop(timeout_s)` is idempotent and bounded.
- `description` is a short human label for the header ("replay load.ndjson ×4").

Sources here:

- `ScriptedSource`: a list of (delay_s, item) for tests and demos; zero delays deliver as fast as
  the sink takes them.
- `ReplaySource`: plays an NDJSON file of `--json` records with a speed factor; lines that do not
  decode are skipped and counted (`DecodeSkipped`), never fatal.
- `PushSource`: for code that already owns a thread (an in-process runtime subscriber, a test):
  `push(item)` delivers on the caller's thread.

Seam for the live source (the runtime's HTTP/SSE API): implement this same protocol on its own
thread — read SSE frames, decode each event with the wire codec (`skippyctl.output.codec`:
`decode_frame_event` for an SSE frame, `decode_line` for a `--json` line), deliver the event, and a
`DecodeSkipped` for each frame or field it could not take; on a broken stream deliver
`RuntimeDown(attempt)`, reconnect with backoff resuming from the last cursor, then deliver
`RuntimeBack(state=...)` with a reduced state when the cursor fell out of the replay window (or
`RuntimeBack()` when the stream resumed without a gap). Nothing in the dashboard changes.

The fleet dashboard's sources (`skippy_tui.fleet_source`, `skippy_tui.fleet_live`) follow the
same contract with items that name their node; `ThreadedSource` is the plumbing both share.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, Protocol, TypeVar

from skippyctl.events.envelope import Event
from skippyctl.output.codec import SkipReason, decode_line
from skippyctl.output.state_reader import LoadableEntry
from skippyctl.reducer.state import RuntimeView


@dataclass(frozen=True, slots=True)
class RuntimeDown:
    """The source lost the runtime and is reconnecting (attempt counts from 1)."""

    attempt: int = 1


@dataclass(frozen=True, slots=True)
class RuntimeBack:
    """The source reached the runtime again; `state` replaces the client's reduced copy if given."""

    state: RuntimeView | None = None


@dataclass(frozen=True, slots=True)
class DecodeSkipped:
    """Input the source could not take as it came (whole records or single fields)."""

    reason: SkipReason
    count: int = 1


@dataclass(frozen=True, slots=True)
class SourceEnded:
    """A finite source (script, replay) delivered its last item."""


@dataclass(frozen=True, slots=True)
class LoadableModels:
    """The models the runtime may load on demand that were neither loaded nor loading when
    the source last read its state document (``loadable_models``); replaces the last list."""

    models: tuple[LoadableEntry, ...] = ()


SourceItem = Event | RuntimeDown | RuntimeBack | DecodeSkipped | SourceEnded | LoadableModels
Sink = Callable[[SourceItem], None]


class EventSource(Protocol):
    """Something that runs on its own thread and delivers `SourceItem`s to a sink."""

    @property
    def description(self) -> str:
        """A short label for the header."""
        ...

    def start(self, sink: Sink) -> None:
        """Begin delivering to `sink` from the source's own thread; returns at once."""
        ...

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop delivering; idempotent, waits at most `timeout_s`."""
        ...


DEFAULT_STOP_TIMEOUT_S: Final = 2.0

ItemT = TypeVar("ItemT")


class ThreadedSource(Generic[ItemT]):
    """Shared start/stop plumbing: one named daemon thread, a stop flag, a `done` event. The
    item type is the source's (`SourceItem` here; the fleet sources deliver fleet items)."""

    thread_name = "skippy-tui-source"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.done = threading.Event()
        """Set once the source has delivered its last item (or was stopped)."""

    def start(self, sink: Callable[[ItemT], None]) -> None:
        if self._thread is not None:
            raise RuntimeError("source already started")
        self._thread = threading.Thread(
            target=self._main, args=(sink,), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _main(self, sink: Callable[[ItemT], None]) -> None:
        try:
            self._run(sink)
        finally:
            self.done.set()

    def _run(self, sink: Callable[[ItemT], None]) -> None:
        raise NotImplementedError

    def _wait(self, delay_s: float) -> bool:
        """Sleep up to `delay_s`; False when stopped meanwhile."""
        if delay_s > 0:
            return not self._stop.wait(delay_s)
        return not self._stop.is_set()


class ScriptedSource(ThreadedSource[SourceItem]):
    """Delivers a fixed script of (delay_s, item): wait `delay_s`, deliver `item`, next."""

    thread_name = "skippy-tui-scripted"

    def __init__(
        self,
        script: Iterable[tuple[float, SourceItem]],
        *,
        announce_end: bool = False,
        description: str = "scripted",
    ) -> None:
        super().__init__()
        self._script: Sequence[tuple[float, SourceItem]] = tuple(script)
        self._announce_end = announce_end
        self._description = description
        self.delivered = 0

    @property
    def description(self) -> str:
        return self._description

    def _run(self, sink: Sink) -> None:
        for delay_s, item in self._script:
            if not self._wait(delay_s):
                return
            sink(item)
            self.delivered += 1
        if self._announce_end and not self._stop.is_set():
            sink(SourceEnded())


MAX_REPLAY_GAP_S: Final = 5.0


def replay_delay_s(previous_ns: int, wall_ns: int, speed: float, max_gap_s: float) -> float:
    """How long a replay waits before a record stamped `wall_ns` after one stamped
    `previous_ns`: the recorded gap divided by `speed`, never negative, at most `max_gap_s`."""
    gap_s = (wall_ns - previous_ns) / 1e9 / speed
    return min(max(gap_s, 0.0), max_gap_s)


class ReplaySource(ThreadedSource[SourceItem]):
    """Plays an NDJSON file of `event_record` lines, paced by their `ts` divided by `speed`.

    `speed` 1.0 is real time, 10 is ten times faster, `math.inf` is as fast as possible. A gap
    between records is capped at `max_gap_s` (after the speed factor) so an idle stretch in a long
    recording does not stall the replay. Timestamps that go backwards (reducer transitions are
    stamped when made) deliver at once.
    """

    thread_name = "skippy-tui-replay"

    def __init__(self, path: Path, speed: float = 1.0, max_gap_s: float = MAX_REPLAY_GAP_S) -> None:
        super().__init__()
        if not speed > 0:
            raise ValueError("speed must be > 0")
        self.path = path
        self.speed = speed
        self.max_gap_s = max_gap_s
        self.delivered = 0
        self.skipped = 0

    @property
    def description(self) -> str:
        speed = "" if self.speed == 1.0 else f" ×{self.speed:g}"
        return f"replay {self.path.name}{speed}"

    def _run(self, sink: Sink) -> None:
        # A file that goes away or cannot be read ends the replay; it never kills the app.
        with contextlib.suppress(OSError):
            self._play(sink)
        if not self._stop.is_set():
            sink(SourceEnded())

    def _play(self, sink: Sink) -> None:
        previous_ns: int | None = None
        with self.path.open("rb") as lines:
            for line in lines:
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                event, skipped = decode_line(line)
                for reason in skipped:
                    self.skipped += 1
                    sink(DecodeSkipped(reason))
                if event is None:
                    continue
                if previous_ns is not None and not self._wait(self._delay_s(previous_ns, event)):
                    return
                previous_ns = (
                    event.wall_ns if previous_ns is None else max(previous_ns, event.wall_ns)
                )
                sink(event)
                self.delivered += 1

    def _delay_s(self, previous_ns: int, event: Event) -> float:
        return replay_delay_s(previous_ns, event.wall_ns, self.speed, self.max_gap_s)


class PushSource:
    """A source fed by someone else's thread: `push(item)` delivers on the caller's thread.

    Items pushed before `start` or after `stop` are counted in `discarded`, never queued.
    """

    def __init__(self, description: str = "in-process") -> None:
        self._description = description
        self._sink: Sink | None = None
        self._lock = threading.Lock()
        self.discarded = 0

    @property
    def description(self) -> str:
        return self._description

    def start(self, sink: Sink) -> None:
        with self._lock:
            self._sink = sink

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        with self._lock:
            self._sink = None

    def push(self, item: SourceItem) -> None:
        """Deliver `item` now, on this thread (serialised with `stop`: none arrives after it)."""
        with self._lock:
            if self._sink is None:
                self.discarded += 1
                return
            self._sink(item)
