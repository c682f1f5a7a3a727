"""`skippyctl ps` (also `skippyctl status`): the runtime's reduced state at a glance.

`ps --json` is what scripts poll, so it imports only what it uses: the client, and the
document goes to stdout as it came. The tables for people are `skippyctl.cli.state_tables`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.fleet_flags import FleetFileOption
from skippyctl.cli.output import emit_json, fail

if TYPE_CHECKING:
    from skippyctl.config.fleet import Fleet
    from skippyctl.config.runtime_settings import RuntimeSettings


def ps_command(
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the state document as exactly one JSON line."),
    ] = False,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="Every fleet member's state (`skippyctl fleet`): the local runtime and each "
            "node, or why it cannot be reached.",
        ),
    ] = False,
    fleet_file: FleetFileOption = None,
) -> None:
    """Show the runtime's models, node state and event-system health.

    Per model: state (with load %), device, memory, context, lanes in use, queue, sessions and
    decode rate, then a line with the options its load asked for beyond the defaults and one
    with speculation's acceptance (the accepted share of the proposed tokens its ended requests
    verified; `--spec auto`, the default, verifies proposals only while they pay). A model
    split across stages (`load --stage`/`--local-stages`) also gets its topology: per stage its
    id, layer range, memory (the plan's share / what the stage offered), state (with its
    reason) and link RTT/jitter when measured. Then the open sessions with their acceptance,
    and the models the runtime may load on demand (`--presets`, `--models-dir`, the hub cache)
    that are not loaded: where each comes from, pinned, and its idle TTL once loaded
    (`loadable_models` in `--json`).

    `--json` prints the state document (GET /api/runtime/state, schema_version 1) as one line.
    Starts a runtime when none runs. Exit 0; 3 when no runtime answers.

    Example:

        skippyctl ps --json | jq -r '.models[] | "\\(.model_id) \\(.state)"'

    `--fleet` asks every member at once (the local runtime is not started for it); `--json`
    is then one line, `{"record": "fleet_state", "nodes": [...]}`, each node with `reachable`
    and its `state` document or a `reason_code` and `message`. Exit 0 when every node
    answered, 3 when one did not.

        skippyctl ps --fleet --json | jq -r '.nodes[] | "\\(.node) \\(.reachable)"'
    """
    if fleet:
        raise typer.Exit(int(_fleet_ps(fleet_file, json_output)))
    from skippyctl.client.http import ApiError, RuntimeUnreachable

    client = attach_or_exit("ps", json_output)
    try:
        document = client.state()
    except (RuntimeUnreachable, ApiError) as error:
        fail("ps", ExitCode.RUNTIME_UNREACHABLE, str(error), json_output)
    finally:
        client.close()
    if json_output:
        emit_json(document)
        return
    from rich.console import Console

    from skippyctl.cli.state_tables import print_state
    from skippyctl.output.state_reader import read_state_document

    print_state(
        read_state_document(document),
        client.discovery.url,
        Console(highlight=False, soft_wrap=True),
    )


FLEET_STATE_TIMEOUT_S = 5.0


def _fleet_ps(fleet_file: str | None, json_output: bool) -> ExitCode:
    """`ps --fleet`: every member's state document, asked in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    from skippyctl.cli.fleet_flags import read_fleet_or_exit
    from skippyctl.cli.settings import runtime_settings

    fleet = read_fleet_or_exit("ps", fleet_file, json_output)
    settings = runtime_settings("ps", json_output)
    names = fleet.names()
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        rows = list(pool.map(lambda name: _node_state(fleet, name, settings), names))
    if json_output:
        emit_json({"schema_version": 1, "record": "fleet_state", "nodes": rows})
    else:
        from rich.console import Console
        from rich.markup import escape

        from skippyctl.cli.state_tables import print_state
        from skippyctl.output.state_reader import read_state_document

        out = Console(highlight=False, soft_wrap=True)
        for row in rows:
            out.rule(f"[bold]{escape(row['node'])}[/]", align="left")
            if row["reachable"]:
                print_state(read_state_document(row["state"]), row["url"], out)
            else:
                out.print(f"[red]unreachable[/] ({row['reason_code']}): {escape(row['message'])}")
    return ExitCode.SUCCESS if all(r["reachable"] for r in rows) else ExitCode.RUNTIME_UNREACHABLE


def _node_state(fleet: Fleet, name: str, settings: RuntimeSettings) -> dict[str, Any]:
    from skippyctl.client.fleet import node_client, reason_of
    from skippyctl.client.http import ApiError, RuntimeUnreachable
    from skippyctl.config.fleet import FleetError

    entry = fleet.entry(name)
    row: dict[str, Any] = {"node": name, "url": None if entry is None else entry.url}
    try:
        client = node_client(fleet, name, settings, autostart=False)
        try:
            client.timeout_s = FLEET_STATE_TIMEOUT_S
            row["url"] = client.discovery.url
            document = client.state()
        finally:
            client.close()
    except (FleetError, RuntimeUnreachable, ApiError) as error:
        return {**row, "reachable": False, "reason_code": reason_of(error), "message": str(error)}
    return {**row, "reachable": True, "state": document}
