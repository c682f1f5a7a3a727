"""Terminal presenters for an event stream: NDJSON on stdout, one line per event, or a Rich
progress bar on stderr.

Presentation lives with the CLI (it needs Rich); the projections it shows (the `--json` record,
the human summary) come from skippyctl.output, which imports no UI framework.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import BinaryIO, Final, Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from skippyctl.cli.feeds import StreamItem
from skippyctl.cli.output import emit_json
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category, Severity
from skippyctl.output.codec import dumps_line, event_record
from skippyctl.output.summary import render_summary


class Presenter(Protocol):
    def show(self, event: Event, seq: int | None) -> None: ...
    def close(self) -> None: ...


class NdjsonPresenter:
    """One JSON object per line on stdout, flushed per line so `jq` sees it live."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream or sys.stdout.buffer

    def show(self, event: Event, seq: int | None) -> None:
        self._stream.write(dumps_line(event_record(event, seq)))
        self._stream.flush()

    def close(self) -> None:
        self._stream.flush()


_SEVERITY_STYLES: Final[dict[Severity, str]] = {
    Severity.TRACE: "dim",
    Severity.DEBUG: "dim",
    Severity.INFO: "default",
    Severity.WARNING: "yellow",
    Severity.ERROR: "red",
    Severity.FATAL: "bold red",
}


def event_line(event: Event, console: Console, node: str | None = None) -> None:
    """One coloured line per event: time, (the fleet node,) severity, id, scope, summary."""
    record = event_record(event)
    stamp = record["ts"][11:23]
    style = _SEVERITY_STYLES[event.severity]
    scope = " ".join(
        f"{key.removesuffix('_id')}={record[key]}"
        for key in ("model_id", "session_id", "request_id", "device_id", "stage_id", "plugin_id")
        if key in record
    )
    console.print(
        f"[dim]{stamp}[/] {'[bold]' + escape(node) + '[/] ' if node else ''}"
        f"[{style}]{event.severity.value:<7} {event.id.value}[/]"
        f"{' [cyan]' + escape(scope) + '[/]' if scope else ''} [dim]·[/] "
        f"{escape(str(record['summary']))}"
    )


def records_or_lines(json_output: bool, console: Console) -> Callable[[StreamItem], None]:
    """The presenter of `events` and `unload`: each followed event as its record (with `seq`
    and `cursor`) on stdout under `--json`, else as one line on `console`."""

    def show(item: StreamItem) -> None:
        if json_output:
            emit_json(event_record(item.event, item.sequence, item.cursor))
        else:
            event_line(item.event, console)

    return show


_PHASES: Final[dict[EventId, str]] = {
    EventId.MODEL_LOAD_REQUESTED: "requested",
    EventId.MODEL_LOAD_STARTED: "loading weights",
    EventId.BACKEND_DEVICE_SELECTED: "loading weights",
    EventId.NATIVE_MODEL_LOAD_COMPLETED: "weights loaded",
    EventId.SERVING_BACKEND_INITIALIZATION_STARTED: "creating context",
    EventId.MODEL_AVAILABLE: "available",
}


_WARNINGS: Final = frozenset({Severity.WARNING, Severity.ERROR, Severity.FATAL})
"""Severities printed above the load bar (the load's own failure is the command's message)."""


class LoadProgressPresenter:
    """A live load bar with the current phase on stderr; warnings printed above it."""

    def __init__(self, model_label: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.fields[model]}[/]"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task: TaskID = self._progress.add_task(
            "load", total=1000, model=model_label, phase="starting"
        )
        self._progress.start()

    def show(self, event: Event, seq: int | None) -> None:
        phase = _PHASES.get(event.id)
        if phase is not None:
            self._progress.update(self._task, phase=phase)
        if event.id is EventId.MODEL_LOAD_PROGRESS and event.progress is not None:
            total = event.progress.total or 1000
            self._progress.update(self._task, completed=1000 * event.progress.current / total)
        if event.id is EventId.NATIVE_MODEL_LOAD_COMPLETED:
            self._progress.update(self._task, completed=1000)
        if event.severity in _WARNINGS and event.id not in (
            EventId.MODEL_LOAD_FAILED,
            EventId.MODEL_LOAD_CANCELLED,
        ):
            self._progress.console.print(f"[yellow]{event.id.value}[/]: {render_summary(event)}")

    def close(self) -> None:
        self._progress.stop()


_PULL_PHASES: Final[dict[EventId, str]] = {
    EventId.MODEL_QUEUED: "queued",
    EventId.MODEL_RESOLUTION_STARTED: "resolving",
    EventId.MODEL_RESOLUTION_COMPLETED: "resolved",
    EventId.MODEL_DOWNLOAD_STARTED: "downloading",
    EventId.MODEL_DOWNLOAD_COMPLETED: "downloaded",
    EventId.MODEL_PREPARATION_STARTED: "verifying",
}
_PULL_TERMINALS: Final = frozenset(
    {
        EventId.MODEL_RESOLUTION_FAILED,
        EventId.MODEL_DOWNLOAD_FAILED,
        EventId.MODEL_DOWNLOAD_CANCELLED,
        EventId.MODEL_PREPARATION_FAILED,
        EventId.MODEL_PREPARATION_CANCELLED,
    }
)


class PullProgressPresenter:
    """A live download bar (bytes, rate) with the pull's phase on stderr; warnings above it.

    The pull's own failure is the command's closing message, so it is not printed here."""

    def __init__(self, label: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.fields[model]}[/]"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task: TaskID = self._progress.add_task("pull", total=None, model=label, phase="")
        self._progress.start()

    def show(self, event: Event, seq: int | None) -> None:
        phase = _PULL_PHASES.get(event.id)
        if phase is not None:
            self._progress.update(self._task, phase=phase)
        if event.scope.model_id is not None:
            self._progress.update(self._task, model=str(event.scope.model_id))
        if event.progress is not None and event.category is Category.MODEL_PREPARATION:
            self._progress.update(
                self._task, completed=event.progress.current, total=event.progress.total
            )
        if event.severity in _WARNINGS and event.id not in _PULL_TERMINALS:
            self._progress.console.print(f"[yellow]{event.id.value}[/]: {render_summary(event)}")

    def close(self) -> None:
        self._progress.stop()
