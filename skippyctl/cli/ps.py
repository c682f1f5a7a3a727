"""`skippyctl ps` (also `skippyctl status`): the runtime's reduced state at a glance.

`ps --json` is what scripts poll, so it imports only what it uses: the client, and the
document goes to stdout as it came. The tables for people are `skippyctl.cli.state_tables`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import emit_json, fail


def ps_command(
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the state document as exactly one JSON line."),
    ] = False,
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
    """
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
