"""`--node NAME` and `--fleet-file FILE`, and how a command reaches one fleet member
(`attach_node_or_exit`) or reads the fleet (`read_fleet_or_exit`).

Kept apart from the `fleet` command group: every command that takes these flags imports this
module when it is imported, and it imports nothing heavier than Typer (the fleet file's module
and the client come when a command runs). A fleet problem ends a command with exit 10 and a
`fleet_*` reason code (an error record under `--json`); a member that does not answer, with
exit 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import fail
from skippyctl.cli.settings import runtime_settings

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient
    from skippyctl.config.fleet import Fleet, FleetError

# A str, not a Path: Typer builds a pydantic adapter for a Path option when the command is
# made, and `ps --json` must not import pydantic (tests/cli/test_startup.py).
FleetFileOption = Annotated[
    str | None,
    typer.Option(
        "--fleet-file",
        metavar="FILE",
        help="The fleet file (default: SKIPPY_FLEET_FILE, else fleet.toml in the user's "
        "config directory).",
    ),
]
NodeOption = Annotated[
    str | None,
    typer.Option(
        "--node",
        metavar="NAME",
        help="Act on this fleet member (`skippyctl fleet list`); default: the local runtime.",
    ),
]


def fleet_failure(command: str, error: FleetError, json_output: bool) -> NoReturn:
    fail(command, ExitCode.INVALID_CONFIGURATION, str(error), json_output, error.reason)


def fleet_path(command: str, named: str | None, json_output: bool) -> Path:
    from skippyctl.config.fleet import default_fleet_path

    chosen = Path(named) if named else runtime_settings(command, json_output).fleet_file
    return default_fleet_path(chosen)


def read_fleet_or_exit(command: str, named: str | None, json_output: bool) -> Fleet:
    """The fleet file's members; exit 10 with its reason code when it cannot be used."""
    from skippyctl.config.fleet import FleetError, read_fleet

    try:
        return read_fleet(fleet_path(command, named, json_output))
    except FleetError as error:
        fleet_failure(command, error, json_output)


def attach_node_or_exit(
    command: str,
    json_output: bool,
    node: str | None,
    fleet_file: str | None = None,
    autostart: bool = True,
) -> RuntimeClient:
    """A client of `node` (the local runtime when None or `local`: launched or attached as
    always); exit 10 for an unknown node or an unusable entry, 3 when it does not answer."""
    from skippyctl.cli.attach import attach_or_exit
    from skippyctl.config.fleet import LOCAL_NODE, FleetError

    if node is None or node == LOCAL_NODE:
        return attach_or_exit(command, json_output, autostart=autostart)
    from skippyctl.client.fleet import instance_of, node_client
    from skippyctl.client.http import RuntimeUnreachable

    fleet = read_fleet_or_exit(command, fleet_file, json_output)
    settings = runtime_settings(command, json_output)
    try:
        client = node_client(fleet, node, settings)
        # Reach it now, so a command fails here with exit 3 rather than halfway through.
        instance, version = instance_of(client)
    except FleetError as error:
        fleet_failure(command, error, json_output)
    except RuntimeUnreachable as error:
        from skippyctl.client.fleet import reason_of

        fail(
            command,
            ExitCode.RUNTIME_UNREACHABLE,
            f"node {node!r} did not answer: {error}",
            json_output,
            reason_of(error),
        )
    from dataclasses import replace

    client.discovery = replace(client.discovery, process_instance_id=instance, version=version)
    return client
