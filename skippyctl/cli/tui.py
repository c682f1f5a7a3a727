"""`skippyctl tui` (also `skippyctl top`): the Textual dashboard, live or over a recording.

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
) -> None:
    """Open the dashboard: models, stages, sessions, event health and recent events.

    Without --replay it attaches to the runtime (starting one when none runs) and follows its
    live event stream, reconnecting when it breaks; load and unload models from the command
    palette (`:`). Needs a terminal. Exit 0 when quit; 1 without a terminal; 3 when no runtime
    answers; 2 for a bad option or a missing replay file.

    Example:

        skippyctl tui

        skippyctl events --json > recorded.ndjson; skippyctl top --replay recorded.ndjson --speed 4
    """
    err = Console(stderr=True)
    if replay is not None:
        from skippy_tui.__main__ import main

        try:
            code = main(["--replay", str(replay), "--speed", speed])
        except SystemExit as exit_:  # argparse refuses (no such file, bad speed)
            code = exit_.code if isinstance(exit_.code, int) else int(ExitCode.USAGE)
        raise typer.Exit(code)
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
