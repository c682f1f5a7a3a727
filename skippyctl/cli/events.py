"""`skippyctl events …`: discover event ids, replay what the runtime retained, follow the stream.

`skippyctl events` (no sub-command) replays the retained events and, with `--follow`, keeps
following; `skippyctl events catalog` lists every event id. The helpers here (`attach_or_exit`,
`emit_json`, `error_record`, `event_line`) are shared by the other attached commands (`ps`,
`wait`, `unload`, `generate`); the event stream itself is `skippyctl.cli.common.LiveStream`.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skippyctl.cli.common import InterruptRequests, LiveStream, StreamEnded
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.settings import runtime_settings
from skippyctl.events.catalog import CATALOG, EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category, Severity
from skippyctl.output.codec import event_record

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient
    from skippyctl.config.runtime_settings import RuntimeSettings

events_app = typer.Typer(invoke_without_command=True)  # help: events_command's docstring
_err = Console(stderr=True, highlight=False, soft_wrap=True)
RECORD_SCHEMA_VERSION: Final = 1
_SEVERITY_STYLES: Final[dict[Severity, str]] = {
    Severity.TRACE: "dim",
    Severity.DEBUG: "dim",
    Severity.INFO: "default",
    Severity.WARNING: "yellow",
    Severity.ERROR: "red",
    Severity.FATAL: "bold red",
}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


# -- shared by the attached commands ------------------------------------------------------------


def emit_json(record: dict[str, Any]) -> None:
    """One JSON object on its own line on stdout, flushed (so `jq` sees it live)."""
    sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    sys.stdout.buffer.flush()


def error_record(command: str, code: ExitCode, message: str, reason: str | None) -> dict[str, Any]:
    """The `--json` record a command prints when it fails without an event saying why."""
    record: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record": "error",
        "command": command,
        "exit_code": int(code),
        "message": message,
    }
    if reason is not None:
        record["reason_code"] = reason
    return record


def fail(
    command: str,
    code: ExitCode,
    message: str,
    json_output: bool,
    reason: str | None = None,
    hint: str | None = None,
) -> NoReturn:
    """Say why on stderr (and as an error record with --json), then exit with `code`.

    `hint` goes to stderr only (it may name a local path, which JSON records never carry)."""
    if json_output:
        emit_json(error_record(command, code, message, reason))
    _err.print(f"[red]✗[/] {escape(message)}")
    if hint:
        _err.print(f"  {escape(hint)}")
    raise typer.Exit(int(code))


def runtime_dir_hint(settings: RuntimeSettings) -> str:
    """Where the runtime directory is, for people (stderr only)."""
    from skippyctl.client.discovery import runtime_dir

    return f"runtime directory: {runtime_dir(settings)} (SKIPPY_RUNTIME_DIR overrides it)"


def attach_or_exit(command: str, json_output: bool, autostart: bool = True) -> RuntimeClient:
    """Launch-or-attach; exit 3 (with a message, never a traceback) when no runtime answers,
    10 when a setting is invalid (SKIPPY_PORT, …: cli/settings.py)."""
    from skippyctl.client.http import RuntimeUnreachable
    from skippyctl.client.launch import connect

    settings = runtime_settings(command, json_output)
    try:
        return connect(settings, autostart=autostart)
    except RuntimeUnreachable as error:
        fail(
            command,
            ExitCode.RUNTIME_UNREACHABLE,
            str(error),
            json_output,
            hint=runtime_dir_hint(settings),
        )


def sequence_of(cursor: str | None) -> int | None:
    """The sequence number in an `rt1:<instance>:<sequence>` cursor."""
    if not cursor:
        return None
    parts = cursor.split(":")
    if len(parts) != 3 or parts[0] != "rt1":
        return None
    try:
        return int(parts[2])
    except ValueError:
        return None


def matches_model(event: Event, model: str | None) -> bool:
    model_id = event.scope.model_id
    return model is None or (model_id is not None and str(model_id) == model)


def event_line(event: Event, console: Console) -> None:
    """One coloured line per event: time, severity, id, scope, summary."""
    record = event_record(event)
    stamp = record["ts"][11:23]
    style = _SEVERITY_STYLES[event.severity]
    scope = " ".join(
        f"{key.removesuffix('_id')}={record[key]}"
        for key in ("model_id", "session_id", "request_id", "device_id", "stage_id", "plugin_id")
        if key in record
    )
    console.print(
        f"[dim]{stamp}[/] [{style}]{event.severity.value:<7} {event.id.value}[/]"
        f"{' [cyan]' + escape(scope) + '[/]' if scope else ''} [dim]·[/] "
        f"{escape(str(record['summary']))}"
    )


# -- `skippyctl events catalog` -----------------------------------------------------------------


@events_app.command("catalog")
def catalog_command(
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per event id on stdout.")
    ] = False,
    category: Annotated[
        list[Category] | None, typer.Option("--category", help="Only these categories.")
    ] = None,
) -> None:
    """List every event id with its category, delivery class, severity and meaning.

    Example:

        skippyctl events catalog --json | jq -r 'select(.category=="model_loading") | .id'
    """
    specs = [s for s in CATALOG.values() if not category or s.category in category]
    if json_output:
        for spec in specs:
            typer.echo(
                orjson.dumps(
                    {
                        "schema_version": 1,
                        "id": spec.id.value,
                        "category": spec.category.value,
                        "class": spec.delivery.value,
                        "severity": spec.severity.value,
                        "description": spec.description,
                    }
                )
            )
        return
    table = Table("id", "category", "class", "severity", "description", box=None)
    for spec in specs:
        table.add_row(
            spec.id.value,
            spec.category.value,
            spec.delivery.value,
            spec.severity.value,
            spec.description,
        )
    Console().print(table)


# -- `skippyctl events [--follow]` --------------------------------------------------------------


def parse_event_ids(values: Iterable[str]) -> frozenset[EventId]:
    """Event ids from `--event` values; a usage error (exit 2) listing the valid ids otherwise."""
    chosen: set[EventId] = set()
    for value in values:
        try:
            chosen.add(EventId(value))
        except ValueError:
            valid = ", ".join(e.value for e in EventId)
            raise typer.BadParameter(
                f"unknown event id {value!r}; valid ids: {valid}", param_hint="--event"
            ) from None
    return frozenset(chosen)


def _since(value: str | None, instance: str) -> tuple[str, float | None]:
    """(the cursor to connect with, the earliest wall time in seconds to show or None)."""
    if value is None:
        return f"rt1:{instance}:0", None
    if sequence_of(value) is not None:
        return value, None
    match = _DURATION.match(value)
    if match is None:
        raise typer.BadParameter(
            f"{value!r} is neither a cursor (rt1:<instance>:<sequence>) nor a duration "
            "like 30s, 5m, 2h",
            param_hint="--since",
        )
    seconds = float(match.group(1)) * _UNITS_S[match.group(2)]
    return f"rt1:{instance}:0", time.time() - seconds


REPLAY_IDLE_S: Final = 0.5


@events_app.callback()
def events_command(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep following new events after the replay.")
    ] = False,
    category: Annotated[
        list[Category] | None,
        typer.Option("--category", "-c", help="Only events of this category (repeatable)."),
    ] = None,
    event_ids: Annotated[
        list[str] | None,
        typer.Option("--event", "-e", metavar="ID", help="Only this event id (repeatable)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Only events about this model id.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="CURSOR|DURATION",
            help="Resume after a cursor (rt1:…) or show only the last DURATION (30s, 5m, 2h). "
            "Default: everything the runtime retained.",
        ),
    ] = None,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="One event record per line on stdout (with its cursor)."),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            "-n",
            min=1,
            metavar="N",
            help="Print at most N events (after filtering), then exit 0; with --follow, stop "
            "after the N-th.",
        ),
    ] = None,
) -> None:
    """Replay the retained events; with --follow, keep following new ones.

    Filters apply to what is shown, not to where the stream resumes: the cursor printed on
    stderr at exit ("resume with --since …") continues exactly where this run stopped.
    `--json` lines are event records with `seq` and `cursor`. Exit 0 when the replay ended (or
    --follow was stopped by the runtime going away: 3), 130 on Ctrl-C, 2 on a bad option.
    `--limit N` stops after N shown events (exit 0), with or without --follow.

    Example:

        skippyctl events --follow --category model_loading --json | jq -r .event

        skippyctl events --since 5m --model tiny

        skippyctl events --follow --event model_available --limit 1 --json
    """
    if ctx.invoked_subcommand is not None:
        return
    wanted_ids = parse_event_ids(event_ids or ())
    wanted_categories = frozenset(category or ())
    client = attach_or_exit("events", json_output)
    cursor, not_before = _since(since, client.discovery.process_instance_id)
    out = Console(highlight=False, soft_wrap=True)
    code = ExitCode.SUCCESS
    stream = LiveStream(client, cursor)
    shown = 0
    try:
        with InterruptRequests() as interrupts:
            idle_since = time.monotonic()
            while True:
                if interrupts.count:
                    code = ExitCode.CANCELLED
                    break
                try:
                    item = stream.next(0.1)
                except StreamEnded as ended:
                    _err.print(f"[red]✗[/] {escape(str(ended))}")
                    code = ExitCode.RUNTIME_UNREACHABLE
                    break
                if item is None:
                    if not follow and _replay_done(stream, idle_since):
                        break
                    continue
                idle_since = time.monotonic()
                event = item.event
                live = stream.state_sequence is not None and item.sequence > stream.state_sequence
                if not follow and live:
                    break  # a live event: the replay is over
                if wanted_ids and event.id not in wanted_ids:
                    continue
                if wanted_categories and event.category not in wanted_categories:
                    continue
                if not matches_model(event, model):
                    continue
                if not_before is not None and event.wall_ns / 1e9 < not_before:
                    continue
                shown += 1
                if json_output:
                    emit_json(event_record(event, item.sequence, item.cursor))
                else:
                    event_line(event, out)
                if limit is not None and shown >= limit:
                    break
                if not follow and item.sequence >= (stream.state_sequence or 0):
                    break
    finally:
        client.close()
    for gap in stream.gaps:
        _err.print(
            f"[yellow]![/] replay gap ({gap.get('reason')}): the oldest retained event is "
            f"{gap.get('oldest_available')}"
        )
    if stream.last_cursor:
        _err.print(f"{shown} event(s); resume with --since {stream.last_cursor}")
    raise typer.Exit(int(code))


def _replay_done(stream: LiveStream, idle_since: float) -> bool:
    """Without --follow: the replay is over once the stream reached the position its
    `runtime_state` frame described, or nothing came for a moment (retained events may have
    gaps the cursor cannot see)."""
    if stream.state_sequence is None:
        return False
    start = sequence_of(stream.last_cursor) or 0
    if start >= stream.state_sequence:
        return True
    return time.monotonic() - max(idle_since, stream.state_at) > REPLAY_IDLE_S
