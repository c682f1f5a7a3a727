"""`events --fleet` over several nodes: one follower process per node, their lines merged.

Each node is followed by a child `skippyctl events --json --node NAME …` (the same command on
one node: `fleet_events.follow_fleet` in that process), and this process merges what the
children print, line by line, as it comes. Why processes, not a thread per node in one: the
merged stream of three busy runtimes is thousands of records a second, each read, decoded and
encoded in Python. In one process every node's reader waits for the same interpreter lock, and
on a machine the runtimes keep busy a reader descheduled while it holds the lock stalls every
node's records behind it: side by side under the same load, one process's p99 lag was 2-3 times
that of one follower per runtime (docs/BENCHMARKS.md section 10). A child per node is one
follower per runtime, and the merge costs a pipe and one JSON parse per line.

A child that cannot reach its node says so in its own `node_status` records and keeps trying
(with --follow), so the merged stream reports every node's reachability as one process would.
Each child resumes its node after its last cursor by itself; records of one node come through
its pipe in that node's order. The children die with this process (PR_SET_PDEATHSIG), and
Ctrl-C (or the --limit-th event) stops them.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson
from rich.markup import escape

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.follow import InterruptRequests
from skippyctl.cli.output import stderr_console

if TYPE_CHECKING:
    from rich.console import Console

Presenter = Callable[[tuple[bytes, dict[str, Any]] | None], None]
"""Shows one merged line (its bytes and its record); None: the children have nothing more at
hand for now."""
POLL_S: Final = 0.1
STOP_WAIT_S: Final = 5.0
READ_BYTES: Final = 1 << 16
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The child gets SIGTERM when this process dies (Linux), so no follower outlives it."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(slots=True)
class _Child:
    node: str
    process: subprocess.Popen[bytes]
    pending: bytearray = field(default_factory=bytearray)
    done: bool = False


class Merged:
    """What the merge saw: events shown, and the last cursor of each node's shown events."""

    def __init__(self) -> None:
        self.shown = 0
        self.cursors: dict[str, str] = {}


def follow_in_children(
    commands: Mapping[str, list[str]],
    *,
    limit: int | None,
    json_output: bool,
    console: Console,
) -> tuple[ExitCode, Merged]:
    """Run each node's follower (`commands`: node → its `skippyctl …` arguments) and print
    their lines merged until every child ended, Ctrl-C, or the --limit-th event."""
    merged = Merged()
    show = _json_lines() if json_output else _human_lines(console)
    children = [_Child(node, _spawn(arguments)) for node, arguments in commands.items()]
    selector = selectors.DefaultSelector()
    for child in children:
        assert child.process.stdout is not None
        os.set_blocking(child.process.stdout.fileno(), False)
        selector.register(child.process.stdout, selectors.EVENT_READ, child)
    outcome: ExitCode | None = None
    try:
        with InterruptRequests() as interrupts:
            while outcome is None and not all(c.done for c in children):
                if interrupts.count:
                    outcome = ExitCode.CANCELLED
                    break
                for key, _ in selector.select(POLL_S):
                    child = key.data
                    if _read(child, selector) and _take_lines(child, show, merged, limit):
                        outcome = ExitCode.SUCCESS  # the --limit-th event: nothing after it
                        break
                show(None)
    finally:
        _stop(children, selector, show, merged, outcome)
    if outcome is not None:
        return outcome, merged
    codes = [c.process.returncode for c in children]
    if ExitCode.RUNTIME_UNREACHABLE in codes:
        return ExitCode.RUNTIME_UNREACHABLE, merged
    unexpected = [c for c in children if c.process.returncode not in (0, ExitCode.CANCELLED)]
    for child in unexpected:
        stderr_console().print(
            f"[red]✗[/] the follower of node {escape(child.node)} exited {child.process.returncode}"
        )
    return (ExitCode.FAILURE if unexpected else ExitCode.SUCCESS), merged


def _spawn(arguments: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "skippyctl", *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its messages are this process's to say
        preexec_fn=_die_with_parent,  # before exec; this process has no threads yet
    )


def _read(child: _Child, selector: selectors.BaseSelector) -> bool:
    """Read what the child wrote; at its end, stop watching it. False when nothing came."""
    assert child.process.stdout is not None
    try:
        data = os.read(child.process.stdout.fileno(), READ_BYTES)
    except BlockingIOError:
        return False
    if not data:
        selector.unregister(child.process.stdout)
        child.done = True
        child.process.wait()
        return False
    child.pending += data
    return True


def _take_lines(child: _Child, show: Presenter, merged: Merged, limit: int | None) -> bool:
    """Show the complete lines the child wrote; True once the --limit-th event was shown."""
    end = child.pending.rfind(b"\n")
    if end < 0:
        return False
    lines = bytes(child.pending[: end + 1]).splitlines(keepends=True)
    del child.pending[: end + 1]
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a child never writes one; nothing else writes to its pipe
        if not isinstance(record, dict):
            continue
        if "event" in record:
            merged.shown += 1
            cursor = record.get("cursor")
            if isinstance(cursor, str):
                merged.cursors[child.node] = cursor
        show((line, record))
        if "event" in record and limit is not None and merged.shown >= limit:
            return True
    return False


def _stop(
    children: list[_Child],
    selector: selectors.BaseSelector,
    show: Presenter,
    merged: Merged,
    outcome: ExitCode | None,
) -> None:
    """Stop every child still running (SIGINT: each flushes what it has and ends), show the
    lines they wrote until then (not past --limit), and make sure none is left."""
    running = [c for c in children if not c.done]
    for child in running:
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGINT)
    if outcome is ExitCode.CANCELLED:
        deadline = time.monotonic() + STOP_WAIT_S
        while not all(c.done for c in running) and time.monotonic() < deadline:
            for key, _ in selector.select(POLL_S):
                child = key.data
                if _read(child, selector):
                    _take_lines(child, show, merged, None)
    for child in running:
        if not child.done:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            child.process.wait()
            child.done = True
    show(None)
    selector.close()


# -- presenting the merged lines -----------------------------------------------------------------


def _json_lines() -> Presenter:
    """Lines as the children wrote them, to stdout, flushed whenever the children have nothing
    more at hand (None)."""
    out = sys.stdout.buffer
    pending: list[bytes] = []

    def show(item: tuple[bytes, dict[str, Any]] | None) -> None:
        if item is not None:
            pending.append(item[0])
        elif pending:
            out.write(b"".join(pending))
            pending.clear()
            out.flush()

    return show


def _human_lines(console: Console) -> Presenter:
    """Each record as a line for people: an event with its node, a node's reachability and a
    replay gap on stderr."""
    from skippyctl.cli.fleet_events import node_status_line
    from skippyctl.cli.presenters import event_line
    from skippyctl.client.fleet import read_node_status
    from skippyctl.output.codec import decode_record

    err = stderr_console()

    def show(item: tuple[bytes, dict[str, Any]] | None) -> None:
        if item is None:
            return
        record = dict(item[1])
        node = str(record.pop("node", ""))
        if "event" in record:
            event, _skipped = decode_record(record)
            if event is not None:
                event_line(event, console, node=node)
        elif record.get("record") == "replay_gap":
            err.print(
                f"[yellow]![/] {escape(node)}: replay gap ({record.get('reason')}): the oldest "
                f"retained event is {record.get('oldest_available')}"
            )
        else:
            status = read_node_status({**record, "node": node})
            if status is not None:
                node_status_line(status)

    return show
