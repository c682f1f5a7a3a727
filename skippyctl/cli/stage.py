"""`skippyctl stage serve`: run a stage worker (a ggml RPC server) in the foreground.

The RPC server runs in a child process (`python -m skippyctl.stages.worker`) that this command
supervises (skippyctl.stages.supervisor): its lifecycle is `stage_starting`, `stage_ready`, then
`stage_stopping` and `stage_stopped` on Ctrl-C/SIGTERM, or `stage_failed` with a reason code.
With `--json` those are the only lines on stdout (the same NDJSON records as every command);
people get lines on stderr, and the endpoint alone on stdout once the stage is ready.
"""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape

from skippyctl.cli.events import fail
from skippyctl.cli.exit_codes import ExitCode, exit_code_for
from skippyctl.cli.presenters import NdjsonPresenter
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.stages.supervisor import (
    StageOptions,
    StageRefused,
    StageSupervisor,
    default_threads,
)

stage_app = typer.Typer(
    help="Run stage workers: ggml RPC servers an engine splits a model across.",
    no_args_is_help=True,
)
_err = Console(stderr=True, highlight=False, soft_wrap=True)
_COMMAND: Final = "stage serve"
_SECURITY: Final = (
    "Security: an RPC stage runs whatever graph any client that connects sends it, with no "
    "authentication and no encryption. It listens on loopback unless --allow-remote; expose "
    "it only on a network you trust."
)


class _HumanLines:
    """Lifecycle lines for people on stderr; the endpoint on stdout once ready."""

    def __init__(self, supervisor: StageSupervisor) -> None:
        self._supervisor = supervisor

    def show(self, event: Event) -> None:
        sup = self._supervisor
        if event.id is EventId.STAGE_STARTING:
            limit = sup.options.memory_limit_mib
            _err.print(
                f"stage starting on {sup.endpoint} ({sup.options.threads} threads"
                + (f", offers {limit} MiB" if limit is not None else "")
                + ")"
            )
        elif event.id is EventId.STAGE_READY:
            free = sup.memory_free_bytes
            memory = f", {free / 2**30:.1f} GiB free" if free is not None else ""
            _err.print(
                f"[green]✓[/] stage ready at {sup.endpoint} ({sup.stage_id}, "
                f"{sup.device or 'device ?'}{memory}); Ctrl-C stops it"
            )
            typer.echo(sup.endpoint)
        elif event.id is EventId.STAGE_STOPPING:
            _err.print("stopping the stage…")


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    return previous


@stage_app.command("serve")
def serve_command(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="IPv4 address to listen on (ggml's RPC server is IPv4 only). A non-loopback "
            "address needs --allow-remote.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="TCP port; 0 picks a free one (reported when ready).")
    ] = 50052,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            show_default=False,
            help="Threads the RPC server computes with. Default: half the CPUs.",
        ),
    ] = None,
    mem: Annotated[
        int | None,
        typer.Option(
            "--mem",
            metavar="MIB",
            show_default=False,
            help="Memory the stage offers, in MiB, reported in its ready record for planners "
            "(ggml's RPC API cannot cap what the device allocates; more than the device has "
            "free is refused).",
        ),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow listening on a non-loopback address: anyone who reaches it can run "
            "code on this machine's CPU and memory.",
        ),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON lifecycle records on stdout; nothing else.")
    ] = False,
) -> None:
    """Run a stage: llama.cpp's ggml RPC server, in a child process it supervises.

    Prints stage_starting, then stage_ready once the port accepts connections.
    Ctrl-C or SIGTERM stops it: stage_stopping, stage_stopped, exit 0. A worker
    that dies or a port in use is stage_failed with a reason code, and the exit
    code of that reason (the README's table; a port in use is
    resource_allocation_failure, 17). A non-loopback --host without
    --allow-remote is refused before anything binds (invalid_configuration, 10).

    Security: an RPC stage runs whatever graph any client that connects sends
    it, with no authentication and no encryption. It listens on loopback unless
    --allow-remote; expose it only on a network you trust.

    Example:

        skippyctl stage serve --port 0 --threads 2 --json \\
          | jq -r 'select(.event == "stage_ready") | .summaries.port'
    """
    options = StageOptions(
        host=host,
        port=port,
        threads=threads if threads is not None else default_threads(),
        memory_limit_mib=mem,
        allow_remote=allow_remote,
    )
    ndjson = NdjsonPresenter() if json_output else None
    sequence = 0
    human: _HumanLines | None = None

    def emit(event: Event) -> None:
        nonlocal sequence
        sequence += 1
        if ndjson is not None:
            ndjson.show(event, sequence)
        elif human is not None:
            human.show(event)

    supervisor = StageSupervisor(options, emit)
    human = _HumanLines(supervisor)
    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        if allow_remote:
            _err.print(f"[yellow]![/] {_SECURITY}")
        outcome = supervisor.run(stop)
    except StageRefused as refused:
        fail(
            _COMMAND,
            exit_code_for(refused.reason),
            refused.message,
            json_output,
            reason=refused.reason.value,
        )
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if outcome.reason is None:
        _err.print(f"[green]✓[/] stage stopped ({supervisor.endpoint})")
        raise typer.Exit(int(ExitCode.SUCCESS))
    _err.print(
        f"[red]✗[/] stage {escape(supervisor.endpoint)} failed ({outcome.reason.value}): "
        f"{escape(outcome.message)}"
    )
    raise typer.Exit(int(exit_code_for(outcome.reason)))
