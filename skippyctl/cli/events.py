"""`skippyctl events …`: discover event ids, replay what the runtime retained, follow the stream.

`skippyctl events` (no sub-command) replays the retained events and, with `--follow`, keeps
following; `skippyctl events catalog` lists every event id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Final

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.feeds import LiveStream, StreamEnded, StreamItem
from skippyctl.cli.fleet_flags import FleetFileOption
from skippyctl.cli.follow import InterruptRequests, follow
from skippyctl.cli.output import stderr_console
from skippyctl.cli.presenters import records_or_lines
from skippyctl.events.catalog import CATALOG, EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category

events_app = typer.Typer(invoke_without_command=True)  # help: events_command's docstring
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


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
    follow_on: Annotated[
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
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="Every fleet member's events as one stream (`skippyctl fleet`), each record "
            'with its "node"; unreachable nodes are node_status records.',
        ),
    ] = False,
    nodes: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            metavar="NAME",
            help="Only these fleet members (repeatable; implies --fleet).",
        ),
    ] = None,
    fleet_file: FleetFileOption = None,
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

        skippyctl events --follow --fleet --json | jq -c '[.node, .event // .state]'

    With --fleet, `--since` takes a duration or the NODE=CURSOR,… list printed at exit; exit 3
    without --follow when a node could not be reached (its node_status record says why).
    """
    if ctx.invoked_subcommand is not None:
        return
    wanted_ids = parse_event_ids(event_ids or ())
    wanted_categories = frozenset(category or ())
    if fleet or nodes:
        child_filters = [
            *(f"--category={c.value}" for c in wanted_categories),
            *(f"--event={e.value}" for e in wanted_ids),
            *([f"--model={model}"] if model is not None else []),
        ]
        raise typer.Exit(
            int(
                _fleet_events(
                    fleet_file,
                    nodes,
                    since,
                    follow_on,
                    limit,
                    json_output,
                    child_filters,
                    lambda event, not_before: (
                        (not wanted_ids or event.id in wanted_ids)
                        and (not wanted_categories or event.category in wanted_categories)
                        and (
                            model is None
                            or event.scope.model_id is not None
                            and str(event.scope.model_id) == model
                        )
                        and (not_before is None or event.wall_ns / 1e9 >= not_before)
                    ),
                )
            )
        )
    client = attach_or_exit("events", json_output)
    cursor, not_before = _since(since, client.discovery.process_instance_id)
    err = stderr_console()
    stream = LiveStream(client, cursor)
    present = records_or_lines(json_output, Console(highlight=False, soft_wrap=True))
    run = _Run(stream, follow_on, limit, present)

    def relevant(item: StreamItem) -> bool:
        event, model_id = item.event, item.event.scope.model_id
        return (
            (not wanted_ids or event.id in wanted_ids)
            and (not wanted_categories or event.category in wanted_categories)
            and (model is None or (model_id is not None and str(model_id) == model))
            and (not_before is None or event.wall_ns / 1e9 >= not_before)
        )

    def stream_ended(ended: StreamEnded) -> ExitCode:
        err.print(f"[red]✗[/] {escape(str(ended))}")
        return ExitCode.RUNTIME_UNREACHABLE

    try:
        with InterruptRequests() as interrupts:
            code = follow(
                stream,
                relevant=relevant,
                show=run.show,
                ends=run.ends,
                watch=run.watch,
                stream_ended=stream_ended,
                interrupts=interrupts,
                on_interrupt=lambda _count: ExitCode.CANCELLED,
            )
    finally:
        client.close()
    for gap in stream.gaps:
        err.print(
            f"[yellow]![/] replay gap ({gap.get('reason')}): the oldest retained event is "
            f"{gap.get('oldest_available')}"
        )
    if stream.last_cursor:
        err.print(f"{run.shown} event(s); resume with --since {stream.last_cursor}")
    raise typer.Exit(int(code))


def _fleet_events(
    fleet_file: str | None,
    nodes: list[str] | None,
    since: str | None,
    follow_on: bool,
    limit: int | None,
    json_output: bool,
    child_filters: list[str],
    relevant: Callable[[Event, float | None], bool],
) -> ExitCode:
    """`events --fleet`: one node in this process (skippyctl.cli.fleet_events), several in a
    child process each, merged (skippyctl.cli.fleet_children)."""
    from skippyctl.cli.fleet_events import (
        follow_fleet,
        parse_fleet_since,
        resume_hint,
        shown_events,
    )
    from skippyctl.cli.fleet_flags import fleet_failure, read_fleet_or_exit
    from skippyctl.cli.settings import runtime_settings
    from skippyctl.client.fleet import FleetStream, fleet_factories
    from skippyctl.config.fleet import FleetError

    fleet = read_fleet_or_exit("events", fleet_file, json_output)
    cursors: dict[str, str] = {}
    not_before: float | None = None
    if since is not None:
        match = _DURATION.match(since)
        if match is not None:
            not_before = time.time() - float(match.group(1)) * _UNITS_S[match.group(2)]
        else:
            try:
                cursors = parse_fleet_since(since)
            except ValueError:
                raise typer.BadParameter(
                    f"{since!r}: with --fleet, give a duration (30s, 5m) or NODE=CURSOR,… "
                    "as printed at exit",
                    param_hint="--since",
                ) from None
    try:
        factories = fleet_factories(fleet, runtime_settings("events", json_output), nodes)
    except FleetError as error:
        fleet_failure("events", error, json_output)
    if len(factories) > 1:
        return _fleet_events_in_children(
            fleet_file,
            list(factories),
            since,
            cursors,
            follow_on,
            limit,
            json_output,
            child_filters,
        )
    prepare = shown_events(lambda event: relevant(event, not_before), json_output)
    stream = FleetStream(factories, since=cursors, prepare=prepare)
    try:
        code = follow_fleet(
            stream,
            follow_on=follow_on,
            limit=limit,
            json_output=json_output,
            console=Console(highlight=False, soft_wrap=True),
        )
    finally:
        stream.close()
    resume = stream.cursors()
    if resume:
        stderr_console().print(f"resume with --since {resume_hint(resume)}", highlight=False)
    return code


def _fleet_events_in_children(
    fleet_file: str | None,
    nodes: list[str],
    since: str | None,
    cursors: dict[str, str],
    follow_on: bool,
    limit: int | None,
    json_output: bool,
    child_filters: list[str],
) -> ExitCode:
    from skippyctl.cli.fleet_children import follow_in_children
    from skippyctl.cli.fleet_events import resume_hint
    from skippyctl.cli.fleet_flags import fleet_path

    path = str(fleet_path("events", fleet_file, json_output).absolute())
    commands: dict[str, list[str]] = {}
    for node in nodes:
        arguments = ["events", "--json", "--node", node, "--fleet-file", path, *child_filters]
        if follow_on:
            arguments.append("--follow")
        if node in cursors:
            arguments.append(f"--since={node}={cursors[node]}")
        elif since is not None and not cursors:
            arguments.append(f"--since={since}")  # a duration
        commands[node] = arguments
    code, merged = follow_in_children(
        commands,
        limit=limit,
        json_output=json_output,
        console=Console(highlight=False, soft_wrap=True),
    )
    latest = {**cursors, **merged.cursors}
    resume = {node: latest[node] for node in nodes if node in latest}  # in the fleet's order
    if resume:
        stderr_console().print(f"resume with --since {resume_hint(resume)}", highlight=False)
    return code


class _Run:
    """What ends `skippyctl events`: without --follow, the end of the replay (a live event, the
    position the `runtime_state` frame described, or a quiet moment); with --limit, the N-th
    shown event."""

    def __init__(
        self,
        stream: LiveStream,
        follow_on: bool,
        limit: int | None,
        present: Callable[[StreamItem], None],
    ) -> None:
        self.stream = stream
        self.follow_on = follow_on
        self.limit = limit
        self.present = present
        self.shown = 0
        self.idle_since = time.monotonic()

    def watch(self, item: StreamItem | None) -> ExitCode | None:
        """Every poll, before the filters: a quiet one may end the replay, a live event does."""
        if item is None:
            if not self.follow_on and _replay_done(self.stream, self.idle_since):
                return ExitCode.SUCCESS
            return None
        self.idle_since = time.monotonic()
        state_sequence = self.stream.state_sequence
        if not self.follow_on and state_sequence is not None and item.sequence > state_sequence:
            return ExitCode.SUCCESS  # a live event: the replay is over
        return None

    def show(self, item: StreamItem) -> None:
        self.shown += 1
        self.present(item)

    def ends(self, item: StreamItem) -> ExitCode | None:
        if self.limit is not None and self.shown >= self.limit:
            return ExitCode.SUCCESS
        if not self.follow_on and item.sequence >= (self.stream.state_sequence or 0):
            return ExitCode.SUCCESS
        return None


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
