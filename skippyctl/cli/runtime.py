"""`skippyctl runtime serve|start|stop|status`: run, start, stop and inspect the runtime host."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console

from skippyctl.cli.attach import runtime_dir_hint
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import fail
from skippyctl.cli.plugin_flags import plugin_specs
from skippyctl.cli.settings import runtime_settings
from skippyctl.client.discovery import (
    UNUSABLE_DIRECTORY,
    Discovery,
    DiscoveryProblem,
    discovery_path,
    ensure_runtime_dir,
    read_discovery,
    remove_discovery,
)
from skippyctl.client.launch import ServeError, ServeOptions, log_path
from skippyctl.client.process_identity import Verdict, signal_runtime, verify_runtime
from skippyctl.config.runtime_settings import (
    DEFAULT_PORT,
    MAX_PORT,
    RuntimeSettings,
    help_text,
)

runtime_app = typer.Typer(
    help="Run, start, stop and inspect the runtime host.", no_args_is_help=True
)
_err = Console(stderr=True)

HostOption = Annotated[
    str, typer.Option("--host", help="Address to listen on (loopback unless --allow-remote).")
]
PortOption = Annotated[
    int | None,
    typer.Option(
        "--port",
        metavar="PORT",
        show_default=False,
        help=f"TCP port (0: any free port). Default: SKIPPY_PORT, else {DEFAULT_PORT}.",
    ),
]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        show_default=False,
        help="Bearer token clients must send. Default: SKIPPY_API_KEY, else generated.",
    ),
]
RootOption = Annotated[
    Path | None,
    typer.Option(
        "--model-root",
        help="Directory that relative model paths are resolved against; loads outside it "
        "(after resolving .. and symlinks) are refused.",
    ),
]
QueueOption = Annotated[
    int, typer.Option("--max-queue", help="Requests that may wait per model before 429.")
]
RemoteOption = Annotated[
    bool, typer.Option("--allow-remote", help="Allow listening on a non-loopback address.")
]
TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        metavar="PEM",
        show_default=False,
        help="Serve the API over TLS (https) with this certificate (PEM; its chain after it)."
        " Needs --tls-key. It must name the address clients use (--host); local commands"
        " trust exactly it, through the discovery file. Does not replace --allow-remote.",
    ),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-key",
        metavar="PEM",
        show_default=False,
        help="The private key of --tls-cert (PEM, not encrypted; keep it private). Only its"
        " path is passed on, never the key.",
    ),
]
ModelsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--models-dir",
        help="A directory of GGUF files: a request naming one (its file name without .gguf; a"
        " split set by its first part) loads it on demand, as llama-server's router does.",
    ),
]
PresetsOption = Annotated[
    Path | None,
    typer.Option(
        "--presets",
        help="A TOML file of models loaded on demand: \\[models.ID] tables with 'model' (a GGUF,"
        " relative to the file, or hf://ORG/REPO/FILE.gguf) and any load option (lanes, ctx,"
        " spec, ttl, pinned, ...).",
    ),
]
MaxModelsOption = Annotated[
    int | None,
    typer.Option(
        "--max-models",
        help="At most this many models loaded at once: a load beyond it first unloads the least"
        " recently used idle, unpinned model (reason 'max_models'); with none to unload it fails"
        " (default: no limit).",
        min=1,
    ),
]
MemoryBudgetOption = Annotated[
    str,
    typer.Option(
        "--memory-budget",
        help="What the loaded models may take in memory together (their load estimates:"
        " weights, KV cache, compute buffers): a size such as 8G, 'auto' (80% of the memory"
        " available at start) or 'off'. A load beyond it first unloads the least recently used"
        " idle, unpinned models (reason 'memory_budget'); with none to unload it fails before"
        " any weight moves (insufficient_memory).",
    ),
]
TtlOption = Annotated[
    float,
    typer.Option(
        "--ttl",
        help="Idle seconds after which a model without its own ttl unloads (reason 'idle');"
        " -1: never. A load's --ttl, a preset's ttl or a request's keep_alive override it.",
    ),
]


def _check_otlp(settings: RuntimeSettings, command: str, json_output: bool = False) -> None:
    """Exit with invalid_configuration (10) when the OTEL_* variables ask for OTLP in a way the
    runtime would refuse (with an error record under --json), before a background runtime is
    started only to exit with it (`runtime serve` refuses them itself). The message names the
    variable, never its value (an endpoint may carry credentials)."""
    from skippyctl.telemetry.otlp import TelemetryConfigError, otlp_config

    try:
        otlp_config(settings.otel_environment)
    except TelemetryConfigError as error:
        fail(
            command,
            ExitCode.INVALID_CONFIGURATION,
            f"invalid_configuration: {error}",
            json_output,
            reason="invalid_configuration",
        )


DebugTokenOption = Annotated[
    bool,
    typer.Option(
        "--debug-token-events",
        help=(
            "Debug: one generation_token_observed event per sampled token (index and step"
            " time, never the token). Droppable; drops are counted. Default:"
            " SKIPPY_DEBUG_TOKEN_EVENTS."
        ),
    ),
]


PluginOption = Annotated[
    list[str] | None,
    typer.Option(
        "--plugin",
        show_default=False,
        help=(
            "A serving plugin every model gets (repeatable; before a load's own --plugin): a C"
            " plugin's .so file or a Python plugin's entry-point name (group skippyctl.plugins)."
            " Each runs in its own process beside the engine. See examples/plugins."
        ),
    ),
]


def _plugins(values: list[str] | None, command: str, json_output: bool = False) -> tuple[str, ...]:
    """``--plugin`` values, a .so file made absolute; an unusable one exits 10."""
    from skippyctl.config.load_options import plugin_problem

    plugins = plugin_specs(values)
    for plugin in plugins:
        problem = plugin_problem(plugin)
        if problem is not None:
            _refuse(command, problem, json_output)
    return plugins


def _check_on_demand(
    models_dir: Path | None,
    presets: Path | None,
    ttl: float,
    command: str,
    json_output: bool = False,
    memory_budget: str = "auto",
) -> None:
    """Exit 10 (invalid_configuration) for a models directory that is not one, a presets file
    that cannot be used (its problem named), a TTL that is neither -1 nor ≥ 0, or a memory
    budget that is not a size, auto or off."""
    problem = _on_demand_problem(models_dir, presets, ttl, memory_budget)
    if problem is not None:
        _refuse(command, problem, json_output)


def _refuse(command: str, problem: str, json_output: bool) -> None:
    """Exit 10 (invalid_configuration) saying ``problem``."""
    fail(command, ExitCode.INVALID_CONFIGURATION, problem, json_output, "invalid_configuration")


def _on_demand_problem(
    models_dir: Path | None, presets: Path | None, ttl: float, memory_budget: str
) -> str | None:
    from skippyctl.config.sizes import SizeError, parse_size_bytes

    if memory_budget.strip().lower() not in ("auto", "off"):
        try:
            parse_size_bytes(memory_budget)
        except SizeError as error:
            return f"--memory-budget: {error}"
    if not (ttl == -1 or 0 <= ttl <= 86_400):
        return "--ttl must be -1 (never) or 0-86400 seconds"
    if models_dir is not None and not models_dir.expanduser().is_dir():
        return f"--models-dir {models_dir.name}: not a directory"
    if presets is not None:
        from skippyctl.config.model_presets import PresetsError, read_presets

        try:
            read_presets(presets.expanduser())
        except PresetsError as error:
            return f"--presets {presets.name}: {error}"
    return None


def _absolute(path: Path | None) -> Path | None:
    """A --tls-cert/--tls-key path made absolute: the discovery file names the certificate for
    other commands, run from anywhere (and a background runtime runs from elsewhere)."""
    return None if path is None else path.expanduser().absolute()


def _tls_files(
    cert: Path | None, key: Path | None, command: str, json_output: bool
) -> tuple[Path | None, Path | None]:
    """--tls-cert and --tls-key made absolute; exit 10 with the reason (`tls_incomplete`,
    `tls_config_invalid`) when a runtime could not use them, before one is started only to
    refuse them (`runtime serve` refuses them itself, after --allow-remote's check)."""
    from skippyctl.client.launch import check_tls

    cert, key = _absolute(cert), _absolute(key)
    try:
        check_tls(cert, key)
    except ServeError as error:
        fail(
            command,
            ExitCode.INVALID_CONFIGURATION,
            f"{error.reason}: {error}",
            json_output,
            reason=error.reason,
        )
    return cert, key


def _echo_json(record: dict[str, Any]) -> None:
    typer.echo(orjson.dumps(record).decode())


def _port(
    flag: int | None, settings: RuntimeSettings, command: str, json_output: bool = False
) -> int:
    """The port to listen on: --port, else SKIPPY_PORT (its setting, checked when read), else
    the default. An invalid flag exits with invalid_configuration (10), never a traceback."""
    if flag is None:
        return settings.port
    if not 0 <= flag <= MAX_PORT:
        fail(
            command,
            ExitCode.INVALID_CONFIGURATION,
            f"--port {flag} is not a port number (0-{MAX_PORT}; 0: any free port)",
            json_output,
            reason="invalid_configuration",
        )
    return flag


_CONFIGURATION_REFUSALS = frozenset(
    {"remote_not_allowed", "invalid_configuration", "tls_incomplete", "tls_config_invalid"}
)
"""The `ServeError` reasons `runtime serve` exits 10 (invalid_configuration) with; any other
(address_in_use, already_running, …) is 3."""


@runtime_app.command("serve", epilog=help_text())
def serve_command(
    host: HostOption = "127.0.0.1",
    port: PortOption = None,
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
    plugin: PluginOption = None,
    models_dir: ModelsDirOption = None,
    presets: PresetsOption = None,
    ttl: TtlOption = -1.0,
    max_models: MaxModelsOption = None,
    memory_budget: MemoryBudgetOption = "auto",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Run the runtime host in the foreground (Ctrl-C stops it) and advertise it to other commands.

    With --tls-cert and --tls-key the API is served over https only (a file missing or not
    loading: exit 10, tls_incomplete or tls_config_invalid, before anything binds).

    Example:

        skippyctl runtime serve --port 8750 --model-root ~/models

        skippyctl runtime serve --host gpu1.lan --allow-remote --tls-cert gpu1.pem --tls-key key.pem
    """
    if max_queue < 0 or session_ttl <= 0 or replay_records < 16:
        _err.print("[red]✗[/] --max-queue must be ≥ 0, --session-ttl > 0, --replay-records ≥ 16")
        raise typer.Exit(int(ExitCode.INVALID_CONFIGURATION))
    _check_on_demand(models_dir, presets, ttl, "runtime serve", memory_budget=memory_budget)
    settings = runtime_settings("runtime serve")
    listen_port = _port(port, settings, "runtime serve")
    plugins = _plugins(plugin, "runtime serve")
    try:
        ensure_runtime_dir(settings)
    except DiscoveryProblem as problem:
        fail(
            "runtime serve",
            ExitCode.RUNTIME_UNREACHABLE,
            f"cannot serve: {problem}",
            False,
            hint=runtime_dir_hint(settings),
        )
    options = ServeOptions(
        host,
        listen_port,
        api_key or settings.api_key,
        model_root,
        max_queue,
        session_ttl,
        allow_remote,
        replay_records,
        debug_token_events=debug_token_events or settings.debug_token_events,
        plugins=plugins,
        models_dir=models_dir,
        presets=presets,
        ttl_s=ttl,
        max_models=max_models,
        memory_budget=memory_budget,
        tls_cert=_absolute(tls_cert),
        tls_key=_absolute(tls_key),
    )
    from rich.markup import escape

    from skippyctl.daemon.serve import serve

    try:
        serve(options, settings)
    except ServeError as error:
        _err.print(f"[red]✗[/] {error.reason}: {escape(str(error))}", soft_wrap=True)
        raise typer.Exit(
            int(
                ExitCode.INVALID_CONFIGURATION
                if error.reason in _CONFIGURATION_REFUSALS
                else ExitCode.RUNTIME_UNREACHABLE
            )
        ) from error


@runtime_app.command("start")
def start_command(
    host: HostOption = "127.0.0.1",
    port: PortOption = None,
    api_key: KeyOption = None,
    model_root: RootOption = None,
    max_queue: QueueOption = 64,
    allow_remote: RemoteOption = False,
    debug_token_events: DebugTokenOption = False,
    plugin: PluginOption = None,
    models_dir: ModelsDirOption = None,
    presets: PresetsOption = None,
    ttl: TtlOption = -1.0,
    max_models: MaxModelsOption = None,
    memory_budget: MemoryBudgetOption = "auto",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the runtime's status as one JSON object.")
    ] = False,
) -> None:
    """Start the runtime host in the background (no-op when one is already running).

    The port is --port, else SKIPPY_PORT, else 8750 (an invalid one: exit 10). A stale
    discovery file is replaced. Exit 0 when a runtime runs; 3 when none could be started.
    With --tls-cert and --tls-key it serves https (files that do not load: exit 10 before it
    starts; a certificate that does not name --host: exit 3, tls_verify_failed).

    Example:

        skippyctl runtime start && skippyctl runtime status --json | jq -r .url

        SKIPPY_PORT=0 skippyctl runtime start --json | jq -r .url
    """
    from skippyctl.client.http import RuntimeUnreachable
    from skippyctl.client.launch import launch

    settings = runtime_settings("runtime start", json_output)
    listen_port = _port(port, settings, "runtime start", json_output)
    _check_otlp(settings, "runtime start", json_output)
    plugins = _plugins(plugin, "runtime start", json_output)
    _check_on_demand(models_dir, presets, ttl, "runtime start", json_output, memory_budget)
    tls_cert, tls_key = _tls_files(tls_cert, tls_key, "runtime start", json_output)
    try:
        existing = read_discovery(settings)
    except DiscoveryProblem as problem:
        if problem.reason == UNUSABLE_DIRECTORY:
            fail(
                "runtime start",
                ExitCode.RUNTIME_UNREACHABLE,
                f"cannot start a runtime: {problem}",
                json_output,
                hint=runtime_dir_hint(settings),
            )
        existing = None
    if existing is None:
        options = ServeOptions(
            host,
            listen_port,
            api_key or settings.api_key,
            model_root,
            max_queue,
            allow_remote=allow_remote,
            debug_token_events=debug_token_events or settings.debug_token_events,
            plugins=plugins,
            models_dir=None if models_dir is None else models_dir.expanduser().resolve(),
            presets=None if presets is None else presets.expanduser().resolve(),
            ttl_s=ttl,
            max_models=max_models,
            memory_budget=memory_budget,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        try:
            existing = launch(options, settings)
        except RuntimeUnreachable as error:
            cause = error.__cause__
            fail(
                "runtime start",
                ExitCode.RUNTIME_UNREACHABLE,
                str(error),
                json_output,
                # Why the runtime did not start, when it said (start_failed, tls_verify_failed…)
                reason=cause.reason if isinstance(cause, ServeError) else None,
                hint=runtime_dir_hint(settings),
            )
        _err.print(
            f"[green]✓[/] runtime started at {existing.url} (pid {existing.pid})", soft_wrap=True
        )
    else:
        _err.print(
            f"runtime already running at {existing.url} (pid {existing.pid})", soft_wrap=True
        )
    if json_output:
        _echo_json(_status_record(settings))


def _not_running(
    problem: DiscoveryProblem, settings: RuntimeSettings, json_output: bool
) -> NoReturn:
    """`runtime stop` found a file it cannot trust: remove it if possible, signal nothing, say
    so, exit 3 (the runtime is not running)."""
    removed = False
    if problem.reason != UNUSABLE_DIRECTORY:
        try:
            discovery_path(settings).unlink()
            removed = True
        except FileNotFoundError:
            pass
        except OSError as error:
            _err.print(
                f"[yellow]![/] could not remove the discovery file ({error.strerror})",
                soft_wrap=True,
            )
    if json_output:
        _echo_json(
            {
                "schema_version": 1,
                "record": "runtime_stop",
                "stopped": False,
                "running": False,
                "discovery": problem.reason,
                "detail": str(problem),
                "removed": removed,
            }
        )
    _err.print(
        f"no runtime is running: {problem}"
        + (f"; removed the {problem.reason} discovery file" if removed else "")
        + "; nothing was signalled",
        soft_wrap=True,
        highlight=False,
    )
    if problem.reason == UNUSABLE_DIRECTORY:
        _err.print(f"  {runtime_dir_hint(settings)}", soft_wrap=True, highlight=False)
    raise typer.Exit(int(ExitCode.RUNTIME_UNREACHABLE))


def _running(discovery: Discovery) -> bool:
    return verify_runtime(discovery) in (Verdict.VERIFIED, Verdict.UNVERIFIED)


def _wait_gone(discovery: Discovery, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _running(discovery):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


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

    Asks the runtime over its authenticated API first; signals (SIGTERM, then SIGKILL after
    --timeout) go only to a process verified to be the runtime that wrote the discovery file
    (its start time and boot id match). A discovery file naming a dead pid, or a pid now used
    by another process, is stale: it is removed, nothing is signalled, exit 3. Exit 0 when the
    runtime stopped (or none was running: no discovery file).

    Example:

        skippyctl runtime stop
    """
    from skippyctl.client.http import ApiError, RuntimeUnreachable
    from skippyctl.client.launch import runtime_client

    settings = runtime_settings("runtime stop", json_output)
    try:
        discovery = read_discovery(settings)
    except DiscoveryProblem as problem:
        _not_running(problem, settings, json_output)
    if discovery is None:
        if json_output:
            _echo_json(
                {"schema_version": 1, "record": "runtime_stop", "stopped": False, "running": False}
            )
        else:
            _err.print("no runtime is running")
        return
    via, refused = "api", ""
    try:
        client = runtime_client(discovery, timeout_s=min(max(timeout, 1.0), 30.0))
        try:
            client.shutdown()
        finally:
            client.close()
    except (RuntimeUnreachable, ApiError) as error:
        refused = str(error)
        via = "sigterm"
    if via == "sigterm" and not signal_runtime(discovery, signal.SIGTERM):
        verdict = verify_runtime(discovery)
        if verdict in (Verdict.GONE, Verdict.FOREIGN):
            _not_running(
                DiscoveryProblem("stale", f"the runtime (pid {discovery.pid}) is gone"),
                settings,
                json_output,
            )
        fail(
            "runtime stop",
            ExitCode.RUNTIME_UNREACHABLE,
            f"the runtime at {discovery.url} did not accept the shutdown request ({refused}), "
            f"and pid {discovery.pid} cannot be verified as that runtime: not signalling it",
            json_output,
        )
    killed = False
    if not _wait_gone(discovery, timeout):
        killed = signal_runtime(discovery, signal.SIGKILL)
        if not killed or not _wait_gone(discovery, 5.0):
            fail(
                "runtime stop",
                ExitCode.FAILURE,
                f"the runtime (pid {discovery.pid}) did not stop within {timeout:g} s"
                + ("" if killed else " and cannot be verified: not killing it"),
                json_output,
            )
    # A killed runtime could not remove it itself.
    remove_discovery(settings, expected_pid=discovery.pid)
    if json_output:
        _echo_json(
            {
                "schema_version": 1,
                "record": "runtime_stop",
                "stopped": True,
                "killed": killed,
                "pid": discovery.pid,
                "via": via,
            }
        )
    else:
        _err.print(
            f"[green]✓[/] runtime stopped (pid {discovery.pid}{', killed' if killed else ''})"
        )


def _status_record(settings: RuntimeSettings) -> dict[str, Any]:
    from skippyctl.client.http import RuntimeUnreachable
    from skippyctl.client.launch import runtime_client

    record: dict[str, Any] = {"schema_version": 1, "record": "runtime_status"}
    try:
        discovery = read_discovery(settings)
    except DiscoveryProblem as problem:
        record.update(
            {
                "state": "stopped",
                "running": False,
                "discovery": problem.reason,
                "detail": str(problem),
            }
        )
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
            "log": str(log_path(settings)),
        }
    )
    try:
        client = runtime_client(discovery)
        try:
            code, health = client.health()
        finally:
            client.close()
    except RuntimeUnreachable:
        record.update({"state": "unreachable", "running": True})
        return record
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

    Exit 0 when it runs; 3 when it does not (`--json`: `running` false, and for a discovery
    file that cannot be used, `discovery` — stale, corrupt, untrusted or unusable_directory —
    with `detail`).

    Example:

        skippyctl runtime status --json | jq -r .url
    """
    settings = runtime_settings("runtime status", json_output)
    record = _status_record(settings)
    if json_output:
        _echo_json(record)
    elif not record.get("running"):
        detail = record.get("detail")
        _err.print(
            "runtime: stopped"
            + (f" ({record.get('discovery')} discovery file: {detail})" if detail else ""),
            soft_wrap=True,
            highlight=False,
        )
        if record.get("discovery") == UNUSABLE_DIRECTORY:
            _err.print(f"  {runtime_dir_hint(settings)}", soft_wrap=True, highlight=False)
    else:
        _err.print(
            f"runtime: {record.get('state')} at {record.get('url')} (pid {record.get('pid')}, "
            f"version {record.get('version')}, node {record.get('node')})",
            soft_wrap=True,
        )
    if not record.get("running"):
        raise typer.Exit(int(ExitCode.RUNTIME_UNREACHABLE))
