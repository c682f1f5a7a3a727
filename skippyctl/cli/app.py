"""The `skippyctl` command: one Typer app whose commands (one module per command group) are
imported only when they run (`skippyctl.cli.lazy_group`).

Importing this module imports Typer and nothing of the commands: `skippyctl --version` and a
script's `skippyctl ps --json` pay only for what they use. `--help` lists every command, so it
loads them all.
"""

from __future__ import annotations

from typing import Final

import typer

from skippyctl import __version__
from skippyctl.cli.lazy_group import CommandRef, LazyGroup

COMMANDS: Final = {
    "pull": CommandRef("skippyctl.cli.pull", "pull_command"),
    "load": CommandRef("skippyctl.cli.load", "load_command"),
    "unload": CommandRef("skippyctl.cli.unload", "unload_command"),
    "ps": CommandRef("skippyctl.cli.ps", "ps_command"),
    "status": CommandRef("skippyctl.cli.ps", "ps_command"),
    "wait": CommandRef("skippyctl.cli.wait", "wait_command"),
    "tune": CommandRef("skippyctl.cli.tune", "tune_command"),
    "models": CommandRef("skippyctl.cli.models", "models_app"),
    "generate": CommandRef("skippyctl.cli.generate", "generate_command"),
    "doctor": CommandRef("skippyctl.cli.doctor", "doctor_command"),
    "tui": CommandRef("skippyctl.cli.tui", "tui_command"),
    "top": CommandRef("skippyctl.cli.tui", "tui_command"),
    "fixtures": CommandRef("skippyctl.cli.fixtures", "fixtures_app"),
    "events": CommandRef("skippyctl.cli.events", "events_app"),
    "runtime": CommandRef("skippyctl.cli.runtime", "runtime_app"),
    "stage": CommandRef("skippyctl.cli.stage", "stage_app"),
    "diagnostics": CommandRef("skippyctl.cli.diagnostics", "diagnostics_app"),
    "fleet": CommandRef("skippyctl.cli.fleet", "fleet_app"),
}
"""Every command by name, in the order `--help` lists them (`status` and `top` are aliases)."""


class SkippyctlGroup(LazyGroup):
    lazy_commands = COMMANDS


app = typer.Typer(
    name="skippyctl",
    cls=SkippyctlGroup,
    help="Operate a local llama.cpp runtime: load models and watch structured events.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


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
