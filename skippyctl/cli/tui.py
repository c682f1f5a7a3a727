"""`skippyctl tui` (also `skippyctl top`): the Textual dashboard, live or over a recording; with
`--fleet`, one dashboard over every runtime of the fleet file.

Textual is imported inside the command only: `import skippyctl.cli.app` stays headless.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.fleet_flags import FleetFileOption
from skippyctl.cli.settings import runtime_settings


def tui_command(
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE",
            help="Play an NDJSON recording (`skippyctl … --json > FILE`) instead of attaching.",
        ),
    ] = None,
    speed: Annotated[
        str,
        typer.Option("--speed", metavar="X", help="Replay speed factor ('inf': no pauses)."),
    ] = "1",
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="One dashboard over every runtime of the fleet file: a Nodes pane, a node "
            "column in every pane, `n` filters by node. With --replay: play a fleet recording "
            "(`skippyctl events --follow --fleet --json > FILE`).",
        ),
    ] = False,
    fleet_file: FleetFileOption = None,
) -> None:
    """Open the dashboard: models, stages, sessions, event health and recent events.

    Without --replay it attaches to the runtime (starting one when none runs) and follows its
    live event stream, reconnecting when it breaks; load and unload models from the command
    palette (`:`). With --fleet it follows every runtime of the fleet file instead (the local
    one attached, never started): a node that cannot be reached is a row of the Nodes pane with
    its reason, retried until it answers; load and unload act on the node the filter (`n`)
    shows. Needs a terminal. Exit 0 when quit; 1 without a terminal; 3 when no runtime answers;
    2 for a bad option or a missing replay file; 10 for an unusable fleet file (reason `fleet_*`).

    Example:

        skippyctl tui

        skippyctl events --json > recorded.ndjson; skippyctl top --replay recorded.ndjson --speed 4

        skippyctl top --fleet
    """
    err = Console(stderr=True)
    if fleet_file is not None and not fleet:
        err.print("[red]✗[/] --fleet-file names the fleet of `--fleet`: add --fleet")
        raise typer.Exit(int(ExitCode.USAGE))
    if replay is not None:
        from skippy_tui.__main__ import main

        try:
            code = main(
                ["--replay", str(replay), "--speed", speed, *(["--fleet"] if fleet else [])]
            )
        except SystemExit as exit_:  # argparse refuses (no such file, bad speed)
            code = exit_.code if isinstance(exit_.code, int) else int(ExitCode.USAGE)
        raise typer.Exit(code)
    if fleet:
        _fleet_dashboard(fleet_file, err)
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.print("[red]✗[/] the dashboard needs a terminal (try `skippyctl events --follow`)")
        raise typer.Exit(int(ExitCode.FAILURE))
    client = attach_or_exit("tui", json_output=False)
    from skippy_tui.app import SkippyDashboard
    from skippy_tui.live import LiveControl, LiveSource

    source = LiveSource(client, runtime_settings("tui"))
    try:
        SkippyDashboard(source, LiveControl(client, source), title="skippy").run()
    finally:
        source.client.close()


def _fleet_dashboard(fleet_file: str | None, err: Console) -> None:
    """The fleet dashboard over every member's live stream (exit 10 for an unusable fleet)."""
    from skippyctl.cli.fleet_flags import fleet_failure, read_fleet_or_exit
    from skippyctl.client.fleet import fleet_factories
    from skippyctl.config.fleet import FleetError

    members = read_fleet_or_exit("tui", fleet_file, json_output=False)
    settings = runtime_settings("tui")
    try:
        factories = fleet_factories(members, settings)
    except FleetError as error:
        fleet_failure("tui", error, json_output=False)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err.print(
            "[red]✗[/] the dashboard needs a terminal (try `skippyctl events --follow --fleet`)"
        )
        raise typer.Exit(int(ExitCode.FAILURE))
    from skippy_tui.fleet_app import FleetDashboard
    from skippy_tui.fleet_live import FleetLiveControl, FleetLiveSource

    count = len(factories)
    source = FleetLiveSource(factories, f"live fleet · {count} node{'' if count == 1 else 's'}")
    FleetDashboard(source, FleetLiveControl(members, settings), title="skippy fleet").run()
