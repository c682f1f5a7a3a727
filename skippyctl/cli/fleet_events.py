"""`skippyctl events --fleet` in one process: one node's events (several nodes: one such
process each, merged by `skippyctl.cli.fleet_children`), or, from code, several nodes'.

Each node's stream is followed on a thread of its own (`skippyctl.client.fleet.FleetStream`)
and its events are printed as they come, each with its node's name: under `--json` the event's
record (`seq` and `cursor` are that node's) plus `"node"`; a node that cannot be reached, or is
reached again, is a `{"record": "node_status"}` line with a reason code, and it is retried for
as long as the command runs. A replay gap (a node lost records before they were read) is a
`{"record": "replay_gap"}` line. Records of one node come in its cursor order; nodes interleave
as their events arrive.

Without `--follow` the command ends once every node has replayed what it retained (or could
not be reached). `--since` takes a duration, or the `NODE=CURSOR,…` list this command prints at
exit, which resumes every node where this run stopped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson
from rich.markup import escape

from skippyctl.cli.events import REPLAY_IDLE_S, sequence_of
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.follow import InterruptRequests
from skippyctl.cli.output import stderr_console
from skippyctl.client.fleet import (
    FleetStream,
    NodeDown,
    NodeFrame,
    NodeUp,
    Prepare,
    node_status_record,
)
from skippyctl.client.http import Frame
from skippyctl.events.envelope import Event
from skippyctl.output.codec import decode_frame_event, event_record

if TYPE_CHECKING:
    from rich.console import Console

POLL_S: Final = 0.1
BATCH_RECORDS: Final = 64
BATCH_AGE_S: Final = 0.01


@dataclass(slots=True)
class _NodeProgress:
    """How far a node's replay got (without --follow: when it is over)."""

    state_sequence: int | None = None
    last_sequence: int = 0
    quiet_since: float = field(default_factory=time.monotonic)
    unreachable: bool = False

    def replayed(self, now: float) -> bool:
        if self.unreachable:
            return True
        if self.state_sequence is None:
            return False
        return self.last_sequence >= self.state_sequence or now - self.quiet_since > REPLAY_IDLE_S


def parse_fleet_since(value: str) -> dict[str, str]:
    """`NODE=CURSOR,NODE=CURSOR` → {node: cursor}; ValueError when it is not that."""
    cursors: dict[str, str] = {}
    for part in value.split(","):
        node, sep, cursor = part.strip().partition("=")
        if not sep or not node or sequence_of(cursor) is None:
            raise ValueError(part)
        cursors[node] = cursor
    return cursors


def follow_fleet(
    stream: FleetStream,
    *,
    follow_on: bool,
    limit: int | None,
    json_output: bool,
    console: Console,
) -> ExitCode:
    """Print the merged stream (made with `prepare=shown_events(…)`) until the replay is over
    (or, with --follow, Ctrl-C or the --limit-th event). Exit 0; 3 when a node could not be
    reached without --follow; 130 on Ctrl-C."""
    progress = {node: _NodeProgress() for node in stream.nodes}
    shown = 0
    err = stderr_console()
    out = _Lines()
    with InterruptRequests() as interrupts, out:
        while True:
            if interrupts.count:
                return ExitCode.CANCELLED
            # Records already waiting are written together; stdout is flushed whenever the
            # stream has nothing more at hand, so a reader sees every record as it comes.
            item = stream.next(0)
            if item is None:
                out.flush()
                item = stream.next(POLL_S)
            now = time.monotonic()
            if item is None:
                if not follow_on and all(p.replayed(now) for p in progress.values()):
                    break
                continue
            node = progress[item.node]
            if isinstance(item, NodeUp | NodeDown):
                node.unreachable = isinstance(item, NodeDown)
                _node_status(item, out if json_output else None)
                continue
            node.quiet_since = now
            _note_frame(item, node, out if json_output else None, err)
            shown_event: Shown | None = item.prepared
            if shown_event is None:
                continue
            shown += 1
            if json_output:
                out.write_line(shown_event.line)
            else:
                from skippyctl.cli.presenters import event_line

                event_line(shown_event.event, console, node=item.node)
            if limit is not None and shown >= limit:
                return ExitCode.SUCCESS
            if not follow_on and all(p.replayed(now) for p in progress.values()):
                break
    if any(p.unreachable for p in progress.values()):
        return ExitCode.RUNTIME_UNREACHABLE
    return ExitCode.SUCCESS


class _Lines:
    """NDJSON records for stdout, written in batches: when the caller has nothing more at
    hand, at `BATCH_RECORDS` records or `BATCH_AGE_S` after the oldest, and at exit."""

    def __init__(self) -> None:
        self._stream = sys.stdout.buffer
        self._pending: list[bytes] = []
        self._oldest = 0.0

    def write(self, record: dict[str, Any]) -> None:
        self.write_line(orjson.dumps(record) + b"\n")

    def write_line(self, line: bytes) -> None:
        if not self._pending:
            self._oldest = time.monotonic()
        self._pending.append(line)
        if len(self._pending) >= BATCH_RECORDS or time.monotonic() - self._oldest > BATCH_AGE_S:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._stream.write(b"".join(self._pending))
            self._pending.clear()
            self._stream.flush()

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


@dataclass(frozen=True, slots=True)
class Shown:
    """An event to show, decoded (and under --json encoded) on its node's thread."""

    event: Event
    line: bytes


def shown_events(relevant: Callable[[Event], bool], json_output: bool) -> Prepare:
    """The `FleetStream.prepare` of `events --fleet`: a `Shown` for a relevant event's frame,
    None for anything else."""

    def prepare(node: str, frame: Frame) -> Shown | None:
        if frame.name != "runtime_event":
            return None
        event, _skipped = decode_frame_event(frame.data)
        if event is None or not relevant(event):
            return None
        line = b""
        if json_output:
            record = event_record(event, int(frame.data.get("sequence", 0)), frame.cursor)
            record["node"] = node
            line = orjson.dumps(record) + b"\n"
        return Shown(event, line)

    return prepare


def _note_frame(item: NodeFrame, node: _NodeProgress, out: _Lines | None, err: Console) -> None:
    """What a frame says about its node's replay (its position, a gap)."""
    frame = item.frame
    if frame.name == "runtime_state":
        node.state_sequence = int(frame.data.get("sequence", 0))
        return
    if frame.name == "runtime_replay_gap":
        gap = frame.data.get("gap")
        gap = gap if isinstance(gap, dict) else {}
        if out is not None:
            out.write({"schema_version": 1, "record": "replay_gap", "node": item.node, **gap})
        err.print(
            f"[yellow]![/] {escape(item.node)}: replay gap ({gap.get('reason')}): the oldest "
            f"retained event is {gap.get('oldest_available')}"
        )
    elif frame.name == "runtime_event":
        node.last_sequence = max(node.last_sequence, int(frame.data.get("sequence", 0)))


def _node_status(item: NodeUp | NodeDown, out: _Lines | None) -> None:
    if out is not None:
        out.write(node_status_record(item))
    else:
        node_status_line(item)


def node_status_line(item: NodeUp | NodeDown) -> None:
    """A node's reachability for people, on stderr (a node retried for long: every tenth
    attempt)."""
    err = stderr_console()
    if isinstance(item, NodeUp):
        again = " (restarted: a new instance)" if item.restarted else ""
        err.print(f"[green]●[/] {escape(item.node)} reachable, {escape(item.version)}{again}")
    elif item.attempt == 1 or item.attempt % 10 == 0:
        err.print(
            f"[red]●[/] {escape(item.node)} unreachable ({item.reason_code}): "
            f"{escape(item.message)}; retrying"
        )


def resume_hint(cursors: Mapping[str, str]) -> str:
    return ",".join(f"{node}={cursor}" for node, cursor in cursors.items())
