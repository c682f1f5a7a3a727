"""`skippyctl ps` (also `skippyctl status`): the runtime's reduced state at a glance."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skippyctl.cli.events import attach_or_exit, emit_json, fail
from skippyctl.cli.exit_codes import ExitCode

_STATE_STYLES = {
    "available": "green",
    "degraded": "yellow",
    "requested": "cyan",
    "loading": "cyan",
    "initializing": "cyan",
    "unloading": "magenta",
    "failed": "red",
    "unavailable": "red",
    "cancelled": "dim",
    "unloaded": "dim",
}


def _bytes(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _state_cell(model: dict[str, Any]) -> str:
    state = str(model.get("state", "?"))
    text = f"[{_STATE_STYLES.get(state, 'default')}]{state}[/]"
    progress = model.get("progress")
    if state in ("requested", "loading", "initializing") and isinstance(progress, dict):
        total = progress.get("total")
        if total:
            text += f" {100.0 * progress.get('current', 0) / total:.0f}%"
    if model.get("reason_code"):
        text += f" [dim]({model['reason_code']})[/]"
    return text


def _memory_cell(model: dict[str, Any]) -> str:
    """The model's size (the device's free/total memory is in `--json`)."""
    return _bytes(model.get("model_size_bytes"))


def models_table(document: dict[str, Any]) -> Table:
    sessions: dict[str, int] = {}
    for session in document.get("sessions", []):
        model_id = session.get("model_id")
        if model_id is not None and session.get("state") != "closed":
            sessions[model_id] = sessions.get(model_id, 0) + 1
    table = Table(
        "model",
        "state",
        "device",
        "memory",
        "ctx",
        "lanes",
        "queue",
        "sessions",
        "decode tok/s",
        box=None,
        header_style="bold",
    )
    for model in document.get("models", []):
        rate = model.get("decode_tokens_per_s")
        table.add_row(
            escape(str(model.get("model_id"))),
            _state_cell(model),
            escape(str(model.get("device_id", "-"))),
            _memory_cell(model),
            str(model.get("context_tokens", "-")),
            f"{model.get('lanes_in_use', 0)}/{model.get('lanes', '-')}",
            str(model.get("queue_depth", 0)),
            str(sessions.get(str(model.get("model_id")), 0)),
            "-" if rate is None else f"{rate:.1f}",
        )
    return table


def health_line(document: dict[str, Any]) -> str:
    system = document.get("event_system") or {}
    dropped = sum(v for k, v in system.items() if k.startswith("dropped_") and isinstance(v, int))
    health = document.get("health") or {}
    lagging = health.get("subscribers_lagging", system.get("lagging_subscribers", 0))
    style = "green" if dropped == 0 and not lagging else "yellow"
    return (
        f"[{style}]events[/]: {dropped} dropped, {system.get('coalesced', 0)} coalesced, "
        f"{system.get('sampled', 0)} sampled, {lagging} lagging subscriber(s), "
        f"{system.get('replay_gaps', 0)} replay gap(s)"
    )


def ps_command(
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the state document as exactly one JSON line."),
    ] = False,
) -> None:
    """Show the runtime's models, node state and event-system health.

    Per model: state (with load %), device, memory, context, lanes in use, queue, sessions and
    decode rate.

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
    out = Console(highlight=False, soft_wrap=True)
    out.print(
        f"[bold]runtime[/] {document.get('runtime')} · node [bold]{document.get('node')}[/] · "
        f"native {document.get('native_mode')} · {client.discovery.url}"
    )
    if document.get("models"):
        out.print(models_table(document))
    else:
        out.print("[dim]no models loaded (skippyctl load FILE.gguf)[/]")
    out.print(health_line(document))
