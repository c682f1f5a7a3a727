"""Where a fleet dashboard's items come from: node-tagged items, the `FleetEventSource` protocol,
and the sources that need no network (a fleet recording's replay, a script).

Contract of a `FleetEventSource` (the `EventSource` contract of `skippy_tui.sources`, with items
that say which node they are about):

- `start(sink)` returns at once; the source then calls `sink(item)` from a thread it owns, one
  item at a time, and each node's items in that node's order. An item is one of:
  `NodeItem(node, item)` — one of a node's own `SourceItem`s (an `Event`, a `DecodeSkipped`
  attributed to that node, its `LoadableModels`); `NodeUp` / `NodeDown` (the node's stream
  opened, with its instance and version and whether it restarted; or it cannot be followed,
  with a reason code, the attempt and the wait before the next: the vocabulary of
  `skippyctl.client.fleet`, which live and recorded streams share); `NodeGap` (the node
  resumed past what it retained); `DecodeSkipped` (input attributed to no node); `SourceEnded`.
- `nodes` names the members known before anything arrives (the fleet file's, in its order); a
  replay learns them from the recording, so it names none.
- `stop(timeout_s)` is idempotent and bounded; nothing is delivered after it returns.

Sources here:

- `FleetReplaySource`: plays a fleet recording — what `skippyctl events --follow --fleet --json`
  writes: a `node_status` record per reachability change (`skippyctl.client.fleet`'s
  `node_status_record`), a `replay_gap` record when a node's stream resumed past what it
  retained (`{"record": "replay_gap", "node", "reason", …}`: a `NodeGap`) and, for each event,
  the single-runtime `--json` record with one more key, `node`. Lines that do not decode are
  counted (`DecodeSkipped`, attributed to the line's node when it names one), never fatal;
  records are paced by their `ts` as `ReplaySource` paces.
- `FleetScriptedSource`: a list of (delay_s, item) for tests and demos.

The live source is `skippy_tui.fleet_live.FleetLiveSource` (over `skippyctl.client.fleet`'s
`FleetStream`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from skippy_tui.sources import (
    MAX_REPLAY_GAP_S,
    DecodeSkipped,
    SourceEnded,
    SourceItem,
    ThreadedSource,
    replay_delay_s,
)
from skippyctl.client.fleet import NODE_RECORD, NodeDown, NodeUp, read_node_status
from skippyctl.config.fleet import NODE_NAME
from skippyctl.output.codec import SkipReason, decode_record

REPLAY_GAP_RECORD: Final = "replay_gap"
"""The `record` of a fleet recording's replay gap line (`skippyctl events --fleet --json`)."""

__all__ = [
    "FleetEventSource",
    "FleetReplaySource",
    "FleetScriptedSource",
    "FleetSink",
    "FleetSourceItem",
    "NodeDown",
    "NodeGap",
    "NodeItem",
    "NodeUp",
    "decode_fleet_line",
]


@dataclass(frozen=True, slots=True)
class NodeItem:
    """One of a node's own items: an `Event`, a `DecodeSkipped` of its stream, its
    `LoadableModels`."""

    node: str
    item: SourceItem


@dataclass(frozen=True, slots=True)
class NodeGap:
    """The node's stream resumed past what the runtime retained (`runtime_replay_gap`):
    `reason` is the runtime's (`evicted`, `stale_instance`)."""

    node: str
    reason: str


FleetSourceItem = NodeItem | NodeUp | NodeDown | NodeGap | DecodeSkipped | SourceEnded
FleetSink = Callable[[FleetSourceItem], None]


class FleetEventSource(Protocol):
    """Something that runs on its own thread and delivers `FleetSourceItem`s to a sink."""

    @property
    def description(self) -> str:
        """A short label for the header."""
        ...

    @property
    def nodes(self) -> Sequence[str]:
        """The members known before anything arrives (empty when the source learns them)."""
        ...

    def start(self, sink: FleetSink) -> None:
        """Begin delivering to `sink` from the source's own thread; returns at once."""
        ...

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop delivering; idempotent, waits at most `timeout_s`."""
        ...


def _wall_ns(value: object) -> int | None:
    """A record's `ts` (RFC 3339, UTC) in ns since the epoch; None when it has none."""
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    seconds = int(stamp.timestamp())
    return seconds * 1_000_000_000 + stamp.microsecond * 1000


def decode_fleet_line(line: bytes | str) -> tuple[list[FleetSourceItem], int | None]:
    """The items one fleet recording line holds, and its time (ns) when it has one to pace by.

    A `node_status` record is a `NodeUp` or `NodeDown`, a `replay_gap` record a `NodeGap`; any
    other record must name its `node` and is decoded, without that key, as a single-runtime
    `--json` record (each skip a `DecodeSkipped` of that node). A line that is not a JSON
    object, or names no node (or not a fleet member's name: `skippyctl.config.fleet.NODE_NAME`),
    is a `DecodeSkipped` of no node."""
    try:
        record: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        return [DecodeSkipped(SkipReason.MALFORMED_LINE)], None
    if not isinstance(record, dict):
        return [DecodeSkipped(SkipReason.MALFORMED_LINE)], None
    node = record.pop("node", None)
    if not isinstance(node, str) or not NODE_NAME.match(node):
        return [DecodeSkipped(SkipReason.INVALID_RECORD)], None
    if record.get("record") == NODE_RECORD:
        status = read_node_status({**record, "node": node})
        if status is None:
            return [NodeItem(node, DecodeSkipped(SkipReason.INVALID_RECORD))], None
        return [status], _wall_ns(record.get("ts"))
    if record.get("record") == REPLAY_GAP_RECORD:
        reason = record.get("reason")
        return [NodeGap(node, reason if isinstance(reason, str) else "unknown")], None
    event, skipped = decode_record(record)
    items: list[FleetSourceItem] = [NodeItem(node, DecodeSkipped(r)) for r in skipped]
    if event is None:
        return items, None
    items.append(NodeItem(node, event))
    return items, event.wall_ns


class FleetReplaySource(ThreadedSource[FleetSourceItem]):
    """Plays a fleet recording, paced by its records' `ts` divided by `speed` (see
    `ReplaySource`: `math.inf` is as fast as possible, a gap is capped at `max_gap_s`)."""

    thread_name = "skippy-tui-fleet-replay"

    def __init__(self, path: Path, speed: float = 1.0, max_gap_s: float = MAX_REPLAY_GAP_S) -> None:
        super().__init__()
        if not speed > 0:
            raise ValueError("speed must be > 0")
        self.path = path
        self.speed = speed
        self.max_gap_s = max_gap_s
        self.delivered = 0
        """Events and reachability changes delivered."""
        self.skipped = 0

    @property
    def description(self) -> str:
        speed = "" if self.speed == 1.0 else f" ×{self.speed:g}"
        return f"fleet replay {self.path.name}{speed}"

    @property
    def nodes(self) -> Sequence[str]:
        return ()

    def _run(self, sink: FleetSink) -> None:
        # A file that goes away or cannot be read ends the replay; it never kills the app.
        with contextlib.suppress(OSError):
            self._play(sink)
        if not self._stop.is_set():
            sink(SourceEnded())

    def _play(self, sink: FleetSink) -> None:
        previous_ns: int | None = None
        with self.path.open("rb") as lines:
            for line in lines:
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                items, wall_ns = decode_fleet_line(line)
                if wall_ns is not None:
                    if previous_ns is not None and not self._wait(
                        replay_delay_s(previous_ns, wall_ns, self.speed, self.max_gap_s)
                    ):
                        return
                    previous_ns = wall_ns if previous_ns is None else max(previous_ns, wall_ns)
                for item in items:
                    skip = item.item if isinstance(item, NodeItem) else item
                    if isinstance(skip, DecodeSkipped):
                        self.skipped += 1
                    else:
                        self.delivered += 1
                    sink(item)


class FleetScriptedSource(ThreadedSource[FleetSourceItem]):
    """Delivers a fixed script of (delay_s, item): wait `delay_s`, deliver `item`, next."""

    thread_name = "skippy-tui-fleet-scripted"

    def __init__(
        self,
        script: Iterable[tuple[float, FleetSourceItem]],
        *,
        nodes: Sequence[str] = (),
        announce_end: bool = False,
        description: str = "scripted fleet",
    ) -> None:
        super().__init__()
        self._script: Sequence[tuple[float, FleetSourceItem]] = tuple(script)
        self._nodes = tuple(nodes)
        self._announce_end = announce_end
        self._description = description
        self.delivered = 0

    @property
    def description(self) -> str:
        return self._description

    @property
    def nodes(self) -> Sequence[str]:
        return self._nodes

    def _run(self, sink: FleetSink) -> None:
        for delay_s, item in self._script:
            if not self._wait(delay_s):
                return
            sink(item)
            self.delivered += 1
        if self._announce_end and not self._stop.is_set():
            sink(SourceEnded())
