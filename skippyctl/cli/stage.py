"""`skippyctl stage serve` / `stage relay`: a stage worker, and a wire model in front of one.

`stage serve` runs a stage worker (a ggml RPC server) in the foreground.

The RPC server runs in a child process (`python -m skippyctl.stages.stage_worker`) that this
command supervises (skippyctl.stages.stage_supervisor): its lifecycle is `stage_starting`,
`stage_ready`, then `stage_stopping` and `stage_stopped` on Ctrl-C/SIGTERM, or `stage_failed`
with a reason code. With `--json` those are the only lines on stdout (the same NDJSON records as
every command); people get lines on stderr, and the endpoint alone on stdout once the stage is
ready.

`stage relay` is a FIFO TCP relay with a wire model (constant delay, exponential jitter,
occasional stalls; skippyctl.stages.relay) for trying a split load over a slow or jittery link
on one machine. No event id fits a relay, so `--json` prints plain `{"record": "relay"}`
lines (see `relay_command`).
"""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape

from skippyctl.cli.exit_codes import ExitCode, exit_code_for
from skippyctl.cli.output import emit_json, fail
from skippyctl.cli.presenters import NdjsonPresenter
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import ReasonCode
from skippyctl.stages.relay import Relay, RelayOptions, RelayRefused, parse_host_port
from skippyctl.stages.stage_supervisor import (
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
_RELAY_COMMAND: Final = "stage relay"
RELAY_RECORD_SCHEMA_VERSION: Final = 1
_SECURITY: Final = (
    "Security: an RPC stage runs whatever graph any client that connects sends it, with no "
    "authentication and no encryption. It listens on loopback unless --allow-remote; expose "
    "it only on a network you trust."
)


_CLIENT_LINES: Final = {
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: "a client (an engine) connected",
    EventId.UPSTREAM_CONNECTION_LOST: "[yellow]![/] the client went away",
    EventId.UPSTREAM_CONNECTION_RECOVERED: "a client connected again",
}


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
        elif event.id in _CLIENT_LINES:
            _err.print(_CLIENT_LINES[event.id])


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


@stage_app.command("relay")
def relay_command(
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="IPv4 address and port to listen on (port 0 picks one, reported when "
            "listening). A non-loopback address needs --allow-remote.",
        ),
    ],
    to: Annotated[
        str, typer.Option("--to", metavar="HOST:PORT", help="Where to relay each connection.")
    ],
    delay_ms: Annotated[
        float, typer.Option("--delay-ms", help="Constant delay added to every chunk, in ms.")
    ] = 0.0,
    jitter_ms: Annotated[
        float,
        typer.Option("--jitter-ms", help="Mean of an exponential jitter added to every chunk."),
    ] = 0.0,
    stall_ms: Annotated[
        float, typer.Option("--stall-ms", help="Extra delay of a stalled chunk, in ms.")
    ] = 0.0,
    stall_p: Annotated[
        float, typer.Option("--stall-p", help="Probability (0-1) that a chunk stalls.")
    ] = 0.0,
    seed: Annotated[
        int | None,
        typer.Option("--seed", show_default=False, help="Seed of the random draws."),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow listening on a non-loopback address (whoever reaches the relay "
            "reaches the stage behind it).",
        ),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON lifecycle records on stdout; nothing else.")
    ] = False,
) -> None:
    """Relay TCP connections to a stage through a wire model: delay, jitter, stalls.

    Per accepted connection it connects to --to and forwards both directions.
    Each chunk read is delivered after --delay-ms, plus an exponential jitter of
    mean --jitter-ms, plus --stall-ms with probability --stall-p; never before
    the chunk read before it in the same direction (head-of-line blocking, like
    an ordered transport). Bytes are never reordered, dropped or altered.
    Ctrl-C or SIGTERM stops it (exit 0).

    With --json every line is {"schema_version": 1, "record": "relay",
    "state": …}: "listening" (with "port"), "connection_opened" and
    "connection_closed" (with "connections" so far, and "bytes_up"/"bytes_down"
    when closed), "stopped". No address is printed in a record.

    Example:

        skippyctl stage relay --listen 127.0.0.1:0 --to 127.0.0.1:50052 \\
          --delay-ms 30 --jitter-ms 10 --json
    """
    try:
        listen_host, listen_port = parse_host_port(listen)
        target_host, target_port = parse_host_port(to)
    except RelayRefused as refused:
        fail(
            _RELAY_COMMAND,
            exit_code_for(ReasonCode.INVALID_CONFIGURATION),
            str(refused),
            json_output,
            reason=ReasonCode.INVALID_CONFIGURATION.value,
        )
    options = RelayOptions(
        listen_host=listen_host,
        listen_port=listen_port,
        target_host=target_host,
        target_port=target_port,
        delay_ms=delay_ms,
        jitter_ms=jitter_ms,
        stall_ms=stall_ms,
        stall_p=stall_p,
        seed=seed,
        allow_remote=allow_remote,
    )

    def on_record(fields: dict[str, Any]) -> None:
        if json_output:
            emit_json({"schema_version": RELAY_RECORD_SCHEMA_VERSION, "record": "relay", **fields})
        elif fields["state"] == "listening":
            _err.print(
                f"[green]✓[/] relaying {listen_host}:{fields['port']} → {escape(to)} "
                f"(delay {delay_ms:g} ms, jitter {jitter_ms:g} ms, stall {stall_ms:g} ms "
                f"p={stall_p:g}); Ctrl-C stops it"
            )
            typer.echo(f"{listen_host}:{fields['port']}")

    relay = Relay(options, on_record)
    stop = threading.Event()
    previous = _stop_on_signals(stop)
    try:
        relay.run(stop)
    except RelayRefused as refused:
        fail(
            _RELAY_COMMAND,
            exit_code_for(ReasonCode.INVALID_CONFIGURATION),
            str(refused),
            json_output,
            reason=ReasonCode.INVALID_CONFIGURATION.value,
        )
    except OSError as error:
        fail(
            _RELAY_COMMAND,
            exit_code_for(ReasonCode.RESOURCE_ALLOCATION_FAILURE),
            f"cannot listen on {listen} ({error.strerror or type(error).__name__})",
            json_output,
            reason=ReasonCode.RESOURCE_ALLOCATION_FAILURE.value,
        )
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise typer.Exit(int(ExitCode.SUCCESS))
