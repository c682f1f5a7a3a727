"""`skippyctl runtime serve|start|stop|status`: run, start, stop and inspect the runtime host."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from skippyctl.cli.events import fail
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.runtime.daemon import (
    DEFAULT_PORT,
    ServeError,
    ServeOptions,
    log_path,
    serve,
    start_background,
)
from skippyctl.runtime.discovery import DiscoveryProblem, discovery_path, pid_alive, read_discovery

runtime_app = typer.Typer(
    help="Run, start, stop and inspect the runtime host.", no_args_is_help=True
)
_err = Console(stderr=True)

HostOption = Annotated[
    str, typer.Option("--host", help="Address to listen on (loopback unless --allow-remote).")
]
PortOption = Annotated[int, typer.Option("--port", help="TCP port (0: any free port).")]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="SKIPPY_API_KEY",
        help="Bearer token clients must send (generated when absent).",
    ),
]
RootOption = Annotated[
    Path | None,
    typer.Option("--model-root", help="Directory that relative model paths are resolved against."),
]
QueueOption = Annotated[
    int, typer.Option("--max-queue", help="Requests that may wait per model before 429.")
]
RemoteOption = Annotated[
    bool, typer.Option("--allow-remote", help="Allow listening on a non-loopback address.")
]
TelemetryOption = Annotated[
    str | None,
    typer.Option(
        "--telemetry-endpoint",
        envvar="SKIPPY_TELEMETRY_ENDPOINT",
        metavar="URL",
        show_default=False,
        help=(
            "Optional push telemetry: POST batches of event records (the `events --json`"
            " records, as application/x-ndjson) to this http:// or https:// URL. Never slows or"
            " fails startup or serving: when the collector fails or stalls, batches are dropped"
            " and counted (/metrics skippy_telemetry_*) and telemetry_exporter_degraded is"
            " emitted once. User:password in the URL is sent as Basic auth; the URL is never"
            " printed. Absent: no exporter."
        ),
    ),
]


def _telemetry_endpoint(value: str | None, command: str, json_output: bool = False) -> str | None:
    """The endpoint if set and valid; exits with invalid_configuration (10) otherwise (with an
    error record under --json). The message never repeats the URL (it may carry credentials)."""
    if not value:
        return None
    from skippyctl.telemetry.exporter import TelemetryConfigError, exporter_config

    try:
        exporter_config(value, os.environ)
    except TelemetryConfigError as error:
        fail(
            command,
            ExitCode.INVALID_CONFIGURATION,
            f"invalid_configuration: {error}",
            json_output,
            reason="invalid_configuration",
        )
    return value


DebugTokenOption = Annotated[
    bool,
    typer.Option(
        "--debug-token-events",
        envvar="SKIPPY_DEBUG_TOKEN_EVENTS",
        help=(
            "Debug: one generation_token_observed event per sampled token (index and step"
            " time, never the token). Droppable; drops are counted."
        ),
    ),
]


def _echo_json(record: dict[str, Any]) -> None:
    typer.echo(orjson.dumps(record).decode())


@runtime_app.command("serve")
def serve_command(
    host: HostOption = "127.0.0.1",
    port: PortOption = DEFAULT_PORT,
    api_key: KeyOption = None,
    model_root: RootOption = None,
    max_queue: QueueOption = 64,
    session_ttl: Annotated[
        float, typer.Option("--session-ttl", help="Seconds an idle session stays warm.")
    ] = 600.0,
    allow_remote: RemoteOption = False,
    replay_records: Annotated[
        int,
        typer.Option("--replay-records", help="Events kept for resuming streams (Last-Event-ID)."),
    ] = 4096,
    debug_token_events: DebugTokenOption = False,
    telemetry_endpoint: TelemetryOption = None,
) -> None:
    """Run the runtime host in the foreground (Ctrl-C stops it) and advertise it to other commands.

    Example:

        skippyctl runtime serve --port 8750 --model-root ~/models
    """
    if max_queue < 0 or session_ttl <= 0 or replay_records < 16:
        _err.print("[red]✗[/] --max-queue must be ≥ 0, --session-ttl > 0, --replay-records ≥ 16")
        raise typer.Exit(int(ExitCode.INVALID_CONFIGURATION))
    telemetry_endpoint = _telemetry_endpoint(telemetry_endpoint, "runtime serve")
    options = ServeOptions(
        host,
        port,
        api_key,
        model_root,
        max_queue,
        session_ttl,
        allow_remote,
        replay_records,
        debug_token_events=debug_token_events,
        telemetry_endpoint=telemetry_endpoint,
    )
    try:
        serve(options)
    except ServeError as error:
        _err.print(f"[red]✗[/] {error}", soft_wrap=True)
        raise typer.Exit(
            int(
                ExitCode.INVALID_CONFIGURATION
                if error.reason in ("remote_not_allowed", "invalid_configuration")
                else ExitCode.RUNTIME_UNREACHABLE
            )
        ) from error


@runtime_app.command("start")
def start_command(
    host: HostOption = "127.0.0.1",
    port: PortOption = DEFAULT_PORT,
    api_key: KeyOption = None,
    model_root: RootOption = None,
    max_queue: QueueOption = 64,
    allow_remote: RemoteOption = False,
    debug_token_events: DebugTokenOption = False,
    telemetry_endpoint: TelemetryOption = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the runtime's status as one JSON object.")
    ] = False,
) -> None:
    """Start the runtime host in the background (no-op when one is already running).

    Example:

        skippyctl runtime start && skippyctl runtime status --json | jq -r .url
    """
    telemetry_endpoint = _telemetry_endpoint(telemetry_endpoint, "runtime start", json_output)
    try:
        existing = read_discovery()
    except DiscoveryProblem:
        existing = None
    if existing is None:
        try:
            existing = start_background(
                ServeOptions(
                    host,
                    port,
                    api_key,
                    model_root,
                    max_queue,
                    allow_remote=allow_remote,
                    debug_token_events=debug_token_events,
                    telemetry_endpoint=telemetry_endpoint,
                )
            )
        except ServeError as error:
            fail("runtime start", ExitCode.RUNTIME_UNREACHABLE, str(error), json_output)
        _err.print(
            f"[green]✓[/] runtime started at {existing.url} (pid {existing.pid})", soft_wrap=True
        )
    else:
        _err.print(
            f"runtime already running at {existing.url} (pid {existing.pid})", soft_wrap=True
        )
    if json_output:
        _echo_json(_status_record())


@runtime_app.command("stop")
def stop_command(
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait before killing it.")
    ] = 15.0,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object with the outcome.")
    ] = False,
) -> None:
    """Stop the background runtime host (orderly: requests drain, engines stop).

    Example:

        skippyctl runtime stop
    """
    from skippyctl.client.http import RuntimeClient

    try:
        discovery = read_discovery()
    except DiscoveryProblem as problem:
        discovery_path().unlink(missing_ok=True)
        _err.print(f"removed a {problem.reason} discovery file; no runtime was running")
        discovery = None
    if discovery is None:
        if json_output:
            _echo_json(
                {"schema_version": 1, "record": "runtime_stop", "stopped": False, "running": False}
            )
        else:
            _err.print("no runtime is running")
        return
    client = RuntimeClient(discovery)
    try:
        client.shutdown()
    except Exception:  # noqa: BLE001 - fall back to a signal whatever the API said
        os.kill(discovery.pid, signal.SIGTERM)
    finally:
        client.close()
    deadline = time.monotonic() + timeout
    while pid_alive(discovery.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = False
    if pid_alive(discovery.pid):
        os.kill(discovery.pid, signal.SIGKILL)
        killed = True
        discovery_path().unlink(missing_ok=True)
    if json_output:
        _echo_json(
            {
                "schema_version": 1,
                "record": "runtime_stop",
                "stopped": True,
                "killed": killed,
                "pid": discovery.pid,
            }
        )
    else:
        _err.print(
            f"[green]✓[/] runtime stopped (pid {discovery.pid}{', killed' if killed else ''})"
        )


def _status_record() -> dict[str, Any]:
    from skippyctl.client.http import RuntimeClient, RuntimeUnreachable

    record: dict[str, Any] = {"schema_version": 1, "record": "runtime_status"}
    try:
        discovery = read_discovery()
    except DiscoveryProblem as problem:
        record.update({"state": "stopped", "running": False, "discovery": problem.reason})
        return record
    if discovery is None:
        record.update({"state": "stopped", "running": False})
        return record
    record.update(
        {
            "url": discovery.url,
            "pid": discovery.pid,
            "version": discovery.version,
            "process_instance_id": discovery.process_instance_id,
            "started_at": discovery.started_at,
            "log": str(log_path()),
        }
    )
    client = RuntimeClient(discovery)
    try:
        code, health = client.health()
    except RuntimeUnreachable:
        record.update({"state": "unreachable", "running": True})
        return record
    finally:
        client.close()
    record.update(
        {
            "state": health.get("status"),
            "node": health.get("node"),
            "running": True,
            "http_status": code,
            "models": health.get("models", {}),
        }
    )
    return record


@runtime_app.command("status")
def status_command(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Say whether the runtime host runs, where, and how it is.

    Example:

        skippyctl runtime status --json | jq -r .url
    """
    record = _status_record()
    if json_output:
        _echo_json(record)
    elif not record.get("running"):
        _err.print("runtime: stopped")
    else:
        _err.print(
            f"runtime: {record.get('state')} at {record.get('url')} (pid {record.get('pid')}, "
            f"version {record.get('version')}, node {record.get('node')})",
            soft_wrap=True,
        )
    if not record.get("running"):
        raise typer.Exit(int(ExitCode.RUNTIME_UNREACHABLE))
