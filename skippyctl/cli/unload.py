"""`skippyctl unload MODEL`: unload a model and follow its events to one outcome."""

from __future__ import annotations

import time
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.markup import escape

from skippyctl.cli.exit_codes import ExitCode, exit_code_for, exit_code_for_text
from skippyctl.cli.feeds import LiveStream, StreamItem
from skippyctl.cli.fleet_flags import FleetFileOption, NodeOption, attach_node_or_exit
from skippyctl.cli.follow import InterruptRequests, follow
from skippyctl.cli.output import emit_json, error_record
from skippyctl.cli.presenters import records_or_lines
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category
from skippyctl.output.summary import reason_message

_RELEVANT: Final = frozenset({Category.MODEL_UNLOADING, Category.MODEL_AVAILABILITY})
_TERMINALS: Final = frozenset({EventId.UNLOAD_COMPLETED, EventId.UNLOAD_FAILED})


def _relevant(event: Event, operation: str, model_id: str) -> bool:
    if operation in (str(event.operation_id), str(event.parent_operation_id)):
        return True
    return str(event.scope.model_id) == model_id and event.category in _RELEVANT


def unload_command(
    model: Annotated[str, typer.Argument(help="The model id (as `skippyctl ps` shows it).")],
    force: Annotated[
        bool, typer.Option("--force", help="Cancel in-flight requests instead of draining them.")
    ] = False,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            "--drain-timeout",
            metavar="S",
            help="Seconds to let in-flight requests finish before forcing (runtime default 30).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON event records on stdout, one per line.")
    ] = False,
    node: NodeOption = None,
    fleet_file: FleetFileOption = None,
) -> None:
    """Unload MODEL and stream its unload events until it is unloaded or has failed.

    In-flight requests drain first (--force cancels them), then the engine stops.

    Exit 0 once unloaded; 12 (missing_artifact) when MODEL is not loaded; otherwise the code of
    the failure's reason; 3 when no runtime answers; 130 on Ctrl-C (the unload itself goes on in
    the runtime). With --json a failure before any event is one `{"record": "error"}` line.

    Example:

        skippyctl unload tiny --drain-timeout 10 --json | jq -r .event
    """
    from skippyctl.client.http import ApiError, RuntimeUnreachable

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if drain_timeout is not None and drain_timeout < 0:
        raise typer.BadParameter("must not be negative", param_hint="--drain-timeout")
    client = attach_node_or_exit("unload", json_output, node, fleet_file)
    code, message = ExitCode.FAILURE, "unload did not finish"
    try:
        stream = LiveStream(client)
        stream.wait_connected()
        try:
            answer = client.unload(model, force, drain_timeout)
        except ApiError as error:
            reason = error.reason_code
            code = exit_code_for_text(reason)
            text = str(error) if error.status != 404 else f"{model}: not loaded"
            if json_output:
                emit_json(error_record("unload", code, text, reason))
            err.print(f"[red]✗[/] {escape(text)}")
            raise typer.Exit(int(code)) from None
        operation = str(answer.get("operation_id"))
        with InterruptRequests() as interrupts:
            code, message = _follow(stream, operation, model, json_output, interrupts, err)
    except RuntimeUnreachable as error:
        code, message = ExitCode.RUNTIME_UNREACHABLE, str(error)
    finally:
        client.close()
    if code is ExitCode.SUCCESS:
        err.print(f"[green]✓[/] {escape(message)}")
    else:
        err.print(f"[red]✗[/] {escape(model)}: {escape(message)}")
    raise typer.Exit(int(code))


def _follow(
    stream: LiveStream,
    operation: str,
    model_id: str,
    json_output: bool,
    interrupts: InterruptRequests,
    err: Console,
) -> tuple[ExitCode, str]:
    started = time.monotonic()

    def ends(item: StreamItem) -> tuple[ExitCode, str] | None:
        event = item.event
        if event.id not in _TERMINALS:
            return None
        if event.id is EventId.UNLOAD_COMPLETED:
            took = time.monotonic() - started
            return ExitCode.SUCCESS, f"{model_id}: unloaded ({took:.1f} s)"
        reason = event.reason_code.value if event.reason_code else "unknown_failure"
        message = f"unload_failed ({reason}): {reason_message(reason)}"
        return exit_code_for(event.reason_code), message

    return follow(
        stream,
        relevant=lambda item: _relevant(item.event, operation, model_id),
        show=records_or_lines(json_output, err),
        ends=ends,
        stream_ended=lambda ended: (
            ExitCode.RUNTIME_UNREACHABLE,
            f"{ended} before the unload ended",
        ),
        interrupts=interrupts,
        on_interrupt=lambda _count: (
            ExitCode.CANCELLED,
            "stopped following (the unload goes on in the runtime)",
        ),
    )
