"""`skippyctl fleet add|rm|list`: the runtimes the `--fleet` views watch and `--node` steers.

The fleet file is `skippyctl.config.fleet`'s: keys are named (a file, a variable), never
written. How other commands reach a member is `skippyctl.cli.fleet_flags`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.fleet_flags import FleetFileOption, fleet_failure, fleet_path, read_fleet_or_exit
from skippyctl.cli.output import emit_json, fail
from skippyctl.config.fleet import LOCAL_NODE, Fleet, FleetEntry, FleetError

fleet_app = typer.Typer(
    no_args_is_help=True, help="Name the runtimes `--fleet` views watch and `--node` steers."
)


def entry_record(entry: FleetEntry | None, name: str) -> dict[str, Any]:
    """A member as `fleet list --json` prints it (the key's source, never the key)."""
    if entry is None:
        return {"node": name, "url": None, "key_source": "discovery", "tls": None, "cert": False}
    return {
        "node": entry.name,
        "url": entry.url,
        "key_source": entry.key_source(),
        "tls": entry.tls,
        "cert": entry.cert is not None,
    }


JsonOption = Annotated[bool, typer.Option("--json", help="One JSON record per node on stdout.")]


@fleet_app.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="The node's name (1-32 of a-z, 0-9, '_', '-').")],
    url: Annotated[str, typer.Argument(help="Where its runtime answers: http(s)://HOST:PORT.")],
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", metavar="FILE", help="A file holding its API key."),
    ] = None,
    key_env: Annotated[
        str | None,
        typer.Option("--key-env", metavar="VAR", help="An environment variable holding its key."),
    ] = None,
    cert: Annotated[
        Path | None,
        typer.Option(
            "--cert",
            metavar="PEM",
            help="Trust exactly this certificate for the node (https; its `runtime serve "
            "--tls-cert`). Without it the system's CA store decides.",
        ),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Change a node that is already in the fleet.")
    ] = False,
    fleet_file: FleetFileOption = None,
    json_output: JsonOption = False,
) -> None:
    """Add a remote runtime to the fleet (the local runtime is always in it, as `local`).

    The key is never written to the fleet file: name a file that holds it (--key-file) or an
    environment variable (--key-env); it is read each time the node is reached. Paths are
    stored absolute. Exit 0; 10 for a refused entry (reason code `fleet_*`).

    Example:

        skippyctl fleet add gpu1 https://10.0.0.5:8421 --key-file ~/.config/skippyctl/gpu1.key \\
            --cert ~/.config/skippyctl/gpu1.pem
    """
    path = fleet_path("fleet add", fleet_file, json_output)
    fleet = read_fleet_or_exit("fleet add", fleet_file, json_output)
    try:
        entry = FleetEntry(
            name=name,
            url=url,
            key_file=None if key_file is None else key_file.expanduser().resolve(),
            key_env=key_env,
            cert=None if cert is None else cert.expanduser().resolve(),
        )
        if entry.cert is not None:
            from skippyctl.client.fleet import ssl_context_for

            ssl_context_for(entry)  # a file that holds no certificate is refused now, not later
        fleet = fleet.with_entry(entry, replace=replace)
    except FleetError as error:
        fleet_failure("fleet add", error, json_output)
    _write_or_exit("fleet add", fleet, path, json_output)
    if json_output:
        emit_json({"schema_version": 1, "record": "fleet_node", **entry_record(entry, name)})
    else:
        _say(f"node {name} added ({entry.url}, key: {entry.key_source()})")


@fleet_app.command("rm")
def rm_command(
    name: Annotated[str, typer.Argument(help="The node to remove.")],
    fleet_file: FleetFileOption = None,
    json_output: JsonOption = False,
) -> None:
    """Remove a node from the fleet (its runtime is not touched). Exit 0; 10 for an unknown
    node (`fleet_node_unknown`) or `local` (`fleet_name_reserved`).

    Example:

        skippyctl fleet rm gpu1
    """
    path = fleet_path("fleet rm", fleet_file, json_output)
    fleet = read_fleet_or_exit("fleet rm", fleet_file, json_output)
    try:
        if name == LOCAL_NODE:
            raise FleetError("fleet_name_reserved", "the local runtime is always in the fleet")
        fleet = fleet.without(name)
    except FleetError as error:
        fleet_failure("fleet rm", error, json_output)
    _write_or_exit("fleet rm", fleet, path, json_output)
    if json_output:
        emit_json({"schema_version": 1, "record": "fleet_node_removed", "node": name})
    else:
        _say(f"node {name} removed")


@fleet_app.command("list")
def list_command(fleet_file: FleetFileOption = None, json_output: JsonOption = False) -> None:
    """List the fleet: the local runtime first, then each node with its URL, where its key
    comes from (`file`, `env:VAR`, `none`) and whether a certificate is pinned. Reaches no
    runtime (`skippyctl ps --fleet` does). Exit 0; 10 for an unusable fleet file.

    Example:

        skippyctl fleet list --json | jq -r .node
    """
    fleet = read_fleet_or_exit("fleet list", fleet_file, json_output)
    rows = [entry_record(None, LOCAL_NODE)] + [entry_record(e, e.name) for e in fleet.entries]
    if json_output:
        for row in rows:
            emit_json({"schema_version": 1, "record": "fleet_node", **row})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("node", "url", "key", "tls", box=None)
    for row in rows:
        tls = (
            "—"
            if row["tls"] is None
            else ("pinned" if row["cert"] else "yes" if row["tls"] else "no")
        )
        table.add_row(row["node"], row["url"] or "(discovery file)", row["key_source"], tls)
    Console(highlight=False).print(table)


def _write_or_exit(command: str, fleet: Fleet, path: Path, json_output: bool) -> None:
    """Write the fleet file; exit 1 (`fleet_file_unwritable`) when it cannot be."""
    from skippyctl.config.fleet import write_fleet

    try:
        write_fleet(fleet, path)
    except OSError as error:
        fail(
            command,
            ExitCode.FAILURE,
            f"the fleet file cannot be written ({error.strerror})",
            json_output,
            "fleet_file_unwritable",
        )


def _say(message: str) -> None:
    from skippyctl.cli.output import stderr_console

    stderr_console().print(f"[green]✓[/] {message}")
