"""The `skippyctl` command: one Typer app composed from one module per command group."""

from __future__ import annotations

import typer

from skippyctl import __version__
from skippyctl.cli.diagnostics import diagnostics_app
from skippyctl.cli.doctor import doctor_command
from skippyctl.cli.events import events_app
from skippyctl.cli.fixtures import fixtures_app
from skippyctl.cli.generate import generate_command
from skippyctl.cli.load import load_command
from skippyctl.cli.ps import ps_command
from skippyctl.cli.pull import pull_command
from skippyctl.cli.runtime import runtime_app
from skippyctl.cli.stage import stage_app
from skippyctl.cli.tui import tui_command
from skippyctl.cli.unload import unload_command
from skippyctl.cli.wait import wait_command

app = typer.Typer(
    name="skippyctl",
    help="Operate a local llama.cpp runtime: load models and watch structured events.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("pull")(pull_command)
app.command("load")(load_command)
app.command("unload")(unload_command)
app.command("ps")(ps_command)
app.command("status")(ps_command)
app.command("wait")(wait_command)
app.command("generate")(generate_command)
app.command("doctor")(doctor_command)
app.command("tui")(tui_command)
app.command("top")(tui_command)
app.add_typer(fixtures_app, name="fixtures")
app.add_typer(events_app, name="events")
app.add_typer(runtime_app, name="runtime")
app.add_typer(stage_app, name="stage")
app.add_typer(diagnostics_app, name="diagnostics")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"skippyctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Operate a local llama.cpp runtime: load models and watch structured events."""
    from skippyctl.cli.settings import remember_settings

    remember_settings()  # the process's settings, read once (cli/settings.py)


def main() -> None:
    app()
