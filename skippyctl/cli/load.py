"""`skippyctl load MODEL`: load a GGUF model and follow its events to one outcome."""

from __future__ import annotations

import signal
import time
from typing import Annotated, Any

import typer
from rich.console import Console

from skippyctl.cli.exit_codes import ExitCode, exit_code_for
from skippyctl.events.catalog import EventId
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.presenters import LoadProgressPresenter, NdjsonPresenter, Presenter
from skippyctl.output.summary import reason_message, render_summary
from skippyctl.pipeline.dispatch import Subscription, SubscriptionClosed
from skippyctl.runtime.host import LoadHandle, LoadRequest, RuntimeHost

TERMINALS = frozenset(
    {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}
)
FORCE_QUIT_AFTER_S = 5.0


class _InterruptRequests:
    """Turns SIGINT into a flag the follow loop reads, so Ctrl-C can never land mid-write."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> _InterruptRequests:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def load_command(
    model: Annotated[str, typer.Argument(help="Path to a GGUF file (first part of a split set).")],
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON events on stdout, one per line; nothing else.")
    ] = False,
    ctx: Annotated[
        int | None, typer.Option("--ctx", help="Context size in tokens (default: the model's).")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Give up (and cancel) after this many seconds."),
    ] = None,
    alias: Annotated[
        str | None, typer.Option("--alias", help="Model id to use instead of the file's name.")
    ] = None,
    lanes: Annotated[int, typer.Option("--lanes", help="Parallel sequences (lanes).")] = 1,
    gpu_layers: Annotated[
        int, typer.Option("--gpu-layers", help="Layers to offload to a GPU (-1: all).")
    ] = 0,
) -> None:
    """Load MODEL and stream its load events until it is available or has failed.

    Exit code 0 once the model is available; otherwise the code of the failure's reason
    (see the README's exit code table). Ctrl-C cancels the load.

    Example:

        skippyctl load fixtures/tiny.gguf --json | jq -r .event
    """
    stderr = Console(stderr=True)
    with _InterruptRequests() as interrupts:
        code, message = _run_load(
            model, json_output, ctx, timeout, alias, lanes, gpu_layers, interrupts
        )
    if code is ExitCode.SUCCESS:
        stderr.print(f"[green]✓[/] {message}", soft_wrap=True, highlight=False)
    else:
        stderr.print(f"[red]✗[/] {model}: {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(int(code))


def _run_load(
    model: str,
    json_output: bool,
    ctx: int | None,
    timeout: float | None,
    alias: str | None,
    lanes: int,
    gpu_layers: int,
    interrupts: _InterruptRequests,
) -> tuple[ExitCode, str]:
    host = RuntimeHost().start()
    subscription = host.pipeline.subscribe("cli-load", max_queue_size=65536, replay=True)
    request = LoadRequest(
        artifact=model,
        alias=alias,
        context_tokens=ctx,
        lanes=lanes,
        gpu_layers=gpu_layers,
        timeout_s=timeout,
    )
    handle = host.load_model(request)
    presenter: Presenter = (
        NdjsonPresenter() if json_output else LoadProgressPresenter(handle.model_id or model)
    )
    try:
        return _follow(host, subscription, handle, presenter, interrupts)
    finally:
        presenter.close()
        host.shutdown()


def _follow(
    host: RuntimeHost,
    subscription: Subscription,
    handle: LoadHandle,
    presenter: Presenter,
    interrupts: _InterruptRequests,
) -> tuple[ExitCode, str]:
    cancel_requested_at: float | None = None
    while True:
        if interrupts.count and cancel_requested_at is None:
            cancel_requested_at = time.monotonic()
            host.cancel(handle.operation_id, ReasonCode.CANCELLATION)
        if cancel_requested_at is not None and (
            interrupts.count > 1 or time.monotonic() - cancel_requested_at > FORCE_QUIT_AFTER_S
        ):
            return ExitCode.CANCELLED, "cancelled (forced)"
        try:
            item = subscription.get(0.1)
        except SubscriptionClosed:
            return (
                ExitCode.INTERNAL_RUNTIME_FAILURE,
                "the runtime stopped before the load ended",
            )
        if item is None:
            continue
        event = item.event
        presenter.show(event, item.sequence)
        if event.operation_id != handle.operation_id or event.id not in TERMINALS:
            continue
        if event.id is EventId.MODEL_AVAILABLE:
            return ExitCode.SUCCESS, f"{handle.model_id}: {render_summary(event)}"
        reason = event.reason_code.value if event.reason_code else "unknown_failure"
        detail = handle.problem or reason_message(reason)
        return exit_code_for(event.reason_code), f"{event.id.value} ({reason}): {detail}"
