"""The composition root: `skippyctl runtime serve` builds the runtime host and runs it.

The only place that wires the layers together — pipeline, runtime host and scheduler,
telemetry, the HTTP API — so none of them imports another's construction (the API does not
know how the runtime is built; the runtime does not know it is served over HTTP). The
background launcher (`runtime start`, launch-or-attach) is `skippyctl.client.launch`: it
starts this in a new process with the same `ServeOptions`.

Its configuration is its command line (`ServeOptions`) and the process's `RuntimeSettings`
(read once when the CLI started, config/runtime_settings.py), handed to each step: `serve` runs
the checks that need nothing started (`_check_can_serve`, `_claim_discovery`), binds the
socket, builds the runtime (`build_runtime`: pipeline and host, scheduler, metrics, OTLP
export), the HTTP server and its API (`_build_server`), runs it (`_run`) and shuts down
(`_shut_down`).

Binds loopback unless told otherwise. Serves over TLS when given a certificate and its key
(`--tls-cert`, `--tls-key`: checked to load before anything binds), then advertising an https
url and the certificate's path for local clients to verify it against. Writes the discovery
file once the socket accepts connections and removes it on the way out (SIGINT/SIGTERM shut
down in order: API, scheduler, engines, pipeline).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from skippyctl import __version__
from skippyctl.client.discovery import (
    Discovery,
    DiscoveryProblem,
    read_discovery,
    remove_discovery,
    remove_if_stale,
    runtime_dir,
    take_crashed_host,
    write_discovery,
)
from skippyctl.client.launch import LOOPBACK_HOSTS, ServeError, ServeOptions, check_tls
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, InvalidLogicalId, LogicalId, make_event
from skippyctl.events.reasons import Outcome, Producer, ReasonCode

COMPUTE_TURNS_FILE = "compute-turns.lock"

if TYPE_CHECKING:
    import uvicorn

    from skippyctl.runtime.host import RuntimeHost
    from skippyctl.runtime.model_catalog import ModelCatalog
    from skippyctl.runtime.scheduler import Scheduler
    from skippyctl.runtime.session_state import SessionStateStore
    from skippyctl.telemetry.metrics import MetricsCollector
    from skippyctl.telemetry.otlp import OtlpConfig
    from skippyctl.telemetry.otlp_export import OtlpTelemetry


def bind_listener(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound and listening, inheritable (uvicorn serves on it).

    Created with ``IPPROTO_TCP`` named: asyncio turns Nagle's algorithm off only on accepted
    sockets whose protocol says TCP, and a socket made with protocol 0 does not. With Nagle on,
    a stream's first chunk waited for the client's delayed ACK of the response headers (up to
    40 ms on Linux) before it left. TCP_NODELAY on the listener as well: Linux hands it to
    every accepted connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ServeError(
            "address_in_use", f"cannot listen on {host}:{port}: {error.strerror}"
        ) from error
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(options: ServeOptions, settings: RuntimeSettings) -> None:
    """Run the host in the foreground until SIGINT/SIGTERM or `POST /api/runtime/shutdown`.

    ``options`` is the command line (its env fallbacks resolved), ``settings`` the process's
    settings, read once when it started."""
    otlp = _check_can_serve(options, settings)
    crashed = _claim_discovery(settings)
    sock = bind_listener(options.host, options.port)
    runtime = build_runtime(options, settings, otlp, crashed)
    server = _build_server(runtime, options, settings, sock)
    try:
        _run(server, sock)
    finally:
        _shut_down(runtime, settings, sock)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What `build_runtime` started, for the API to serve and `_shut_down` to stop in order."""

    host: RuntimeHost
    scheduler: Scheduler
    metrics: MetricsCollector
    otlp: OtlpTelemetry | None


def _check_can_serve(options: ServeOptions, settings: RuntimeSettings) -> OtlpConfig | None:
    """Refuse what needs nothing started to refuse: a remote address without --allow-remote
    (TLS or not), a TLS certificate and key that do not load (`tls_incomplete`,
    `tls_config_invalid`), OTLP that is configured wrong (ServeError,
    `invalid_configuration`). Returns OTLP's configuration (None: off)."""
    if options.host not in LOOPBACK_HOSTS and not options.allow_remote:
        raise ServeError(
            "remote_not_allowed", f"{options.host} is not loopback; pass --allow-remote"
        )
    check_tls(options.tls_cert, options.tls_key)
    # OTLP is configured by the standard OTEL_* variables only (telemetry/otlp.py), as read at
    # start; this check imports nothing from OpenTelemetry: the SDK is loaded only when OTLP is on.
    from skippyctl.telemetry.otlp import TelemetryConfigError, otlp_config

    try:
        return otlp_config(settings.otel_environment)
    except TelemetryConfigError as error:
        raise ServeError("invalid_configuration", str(error)) from error


def _claim_discovery(settings: RuntimeSettings) -> str | None:
    """Refuse to start beside a live runtime (ServeError, `already_running`); a stale discovery
    file is removed. Returns the process instance id of a host that died without removing its
    file, for this host to report once (the note is consumed)."""
    try:
        existing = read_discovery(settings)
    except DiscoveryProblem:
        remove_if_stale(settings)
        existing = None
    if existing is not None and existing.pid != os.getpid():
        raise ServeError(
            "already_running",
            f"a runtime is already running at {existing.url} (pid {existing.pid})",
        )
    # A stale file was just removed (and noted), or a command removed one before: report the
    # host it was evidence of, once (the note is consumed).
    return take_crashed_host(settings)


def build_runtime(
    options: ServeOptions,
    settings: RuntimeSettings,
    otlp_config: OtlpConfig | None,
    crashed: str | None,
) -> Runtime:
    """The pipeline and host (started), the scheduler, the metrics and OTLP's export."""
    from skippyctl.runtime.scheduler import Scheduler
    from skippyctl.runtime.sessions import SessionRegistry
    from skippyctl.telemetry.metrics import MetricsCollector

    catalog = _model_catalog(options)
    host = _start_host(options, settings, crashed)
    scheduler = Scheduler(
        host,
        max_queue=options.max_queue,
        sessions=SessionRegistry(ttl_s=options.session_ttl_s),
        engine_unresponsive_after_s=settings.engine_unresponsive_s,
        session_state=_session_state_store(settings),
        catalog=catalog,
        default_ttl_s=options.ttl_s,
        max_models=options.max_models,
        memory_budget_bytes=host.memory_budget_bytes,
        quiet_hub=not settings.hub_verbosity_set,
    ).start()
    metrics = MetricsCollector()
    metrics.attach(host.pipeline.dispatcher)
    otlp = None if otlp_config is None else _start_otlp(host, metrics, otlp_config)
    return Runtime(host, scheduler, metrics, otlp)


DEFAULT_MEMORY_SHARE = 0.8
"""The default memory budget: this share of the memory available when the runtime starts."""


def memory_budget_bytes(budget: str) -> int | None:
    """``--memory-budget``: a size, ``auto`` (:data:`DEFAULT_MEMORY_SHARE` of MemAvailable now;
    no budget where that cannot be read) or ``off`` (ServeError for anything else)."""
    from skippyctl.config.sizes import SizeError, parse_size_bytes
    from skippyctl.engine.geometry import available_memory_bytes

    word = budget.strip().lower()
    if word == "off":
        return None
    if word == "auto":
        available = available_memory_bytes()
        return None if available is None else int(available * DEFAULT_MEMORY_SHARE)
    try:
        return parse_size_bytes(budget)
    except SizeError as error:
        raise ServeError("invalid_configuration", f"--memory-budget: {error}") from error


def _model_catalog(options: ServeOptions) -> ModelCatalog:
    """The models requests may load on demand (ServeError for a presets file that cannot be
    used: the runtime does not start half-configured)."""
    from skippyctl.config.model_presets import PresetsError, read_presets
    from skippyctl.runtime.model_catalog import ModelCatalog

    presets = {}
    if options.presets is not None:
        try:
            presets = read_presets(options.presets)
        except PresetsError as error:
            raise ServeError("invalid_configuration", f"--presets: {error}") from error
    models_dir = options.models_dir
    if models_dir is not None and not models_dir.is_dir():
        raise ServeError("invalid_configuration", "--models-dir is not a directory")
    return ModelCatalog(presets, models_dir, presets_file=options.presets, hub_cache=True)


def _start_host(
    options: ServeOptions, settings: RuntimeSettings, crashed: str | None
) -> RuntimeHost:
    from skippyctl.engine.compute_turns import TURN_SPIN_COUNT
    from skippyctl.engine.options import EngineOptions
    from skippyctl.ingress.host import HostIngressConfig
    from skippyctl.pipeline.pipeline import Pipeline
    from skippyctl.runtime.host import RuntimeHost

    # Decided once, here; every engine gets them as spawn arguments (nothing mutates os.environ).
    engine_options = EngineOptions.from_settings(
        settings, debug_token_events=options.debug_token_events
    )
    if settings.compute_turns:
        # One file for the runtime's engines to take turns at computing (engine/compute_turns.py).
        turns = runtime_dir(settings) / COMPUTE_TURNS_FILE
        engine_options = dataclasses.replace(
            engine_options, compute_turns=str(turns), omp_spin_count=TURN_SPIN_COUNT
        )
    ingress = HostIngressConfig(debug_enabled=options.debug_token_events)
    host = RuntimeHost(
        Pipeline(ingress_config=ingress, max_replay_records=options.replay_records),
        engine_options,
        settings,
    )
    host.default_plugins = options.plugins
    host.memory_budget_bytes = memory_budget_bytes(options.memory_budget)
    host.start()
    if crashed is not None:
        report_crashed_host(host.pipeline.submit, crashed)
    return host


def _session_state_store(settings: RuntimeSettings) -> SessionStateStore | None:
    """The runtime's session state directory (``<runtime dir>/sessions``, mode 0700), or None
    when persistence is off (SKIPPY_SESSION_STATE_MAX_MIB=0) or the directory cannot be used
    (sessions then prefill again after a reload, as before)."""
    from skippyctl.runtime.session_state import (
        DIRECTORY_NAME,
        SessionStateStore,
        StateDirectoryUnusable,
    )

    if settings.session_state_max_mib <= 0:
        return None
    try:
        return SessionStateStore(
            runtime_dir(settings) / DIRECTORY_NAME, settings.session_state_max_mib * 1024 * 1024
        )
    except (OSError, StateDirectoryUnusable):
        return None


def _start_otlp(host: RuntimeHost, metrics: MetricsCollector, config: OtlpConfig) -> OtlpTelemetry:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    pipeline = host.pipeline
    otlp = OtlpTelemetry(
        config,
        submit=pipeline.submit,
        collector=metrics,
        state=lambda: pipeline.state,
        health=pipeline.health,
        instance_id=str(pipeline.dispatcher.instance_id),
    ).start(pipeline.dispatcher)  # replays what the dispatcher retained, then follows
    metrics.exporter = otlp
    return otlp


def _build_server(
    runtime: Runtime, options: ServeOptions, settings: RuntimeSettings, sock: socket.socket
) -> uvicorn.Server:
    """The HTTP server with the API on the runtime; it advertises the runtime (writes the
    discovery file) once it accepts connections."""
    import uvicorn

    from skippyctl.api.app import create_app
    from skippyctl.api.context import ApiContext
    from skippyctl.api.direct_stream import expose_transport

    token = options.api_key or secrets.token_urlsafe(32)
    config = _uvicorn_config(options)
    server = uvicorn.Server(config)
    discovery = _discovery(runtime, options, sock, token)

    def request_shutdown() -> None:
        server.should_exit = True

    ctx = ApiContext(
        host=runtime.host,
        scheduler=runtime.scheduler,
        token=token,
        version=__version__,
        model_root=options.model_root,
        metrics=runtime.metrics,
        request_shutdown=request_shutdown,
        stopping=lambda: bool(server.should_exit),
    )

    def advertise() -> None:
        write_discovery(discovery, settings)

    config.app = expose_transport(create_app(ctx, on_ready=advertise))
    return server


def _discovery(
    runtime: Runtime, options: ServeOptions, sock: socket.socket, token: str
) -> Discovery:
    """What the runtime advertises once it accepts connections: over TLS, an https url and the
    certificate local clients verify it against (its absolute path; the file is private)."""
    port = sock.getsockname()[1]
    host = options.host
    shown_host = f"[{host}]" if ":" in host else host
    tls_cert = None if options.tls_cert is None else str(options.tls_cert.absolute())
    return Discovery(
        pid=os.getpid(),
        url=f"{'http' if tls_cert is None else 'https'}://{shown_host}:{port}",
        token=token,
        version=__version__,
        process_instance_id=str(runtime.host.pipeline.dispatcher.instance_id),
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tls_cert=tls_cert,
    )


def _uvicorn_config(options: ServeOptions) -> uvicorn.Config:
    import uvicorn

    tls = options.tls_cert is not None and options.tls_key is not None
    return uvicorn.Config(
        "skippyctl.api.app:create_app",  # replaced by _build_server; uvicorn needs an app ref
        log_level="warning",
        access_log=False,  # request lines are not needed and could carry client-chosen names
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Not uvicorn's "auto" (uvloop + httptools when some package installed them): measured
        # side by side, those made decode 3-4 % slower here at 1, 4 and 8 sessions
        # (docs/BENCHMARKS.md section 5).
        loop="asyncio",
        http="h11",
        # TLS: uvicorn wraps each connection in its context (TLS 1.2 or later; the key loads
        # without a pass phrase, check_tls refused an encrypted one). A direct stream never
        # writes to a TLS connection's socket itself (api/direct_stream.py `transport`).
        ssl_certfile=str(options.tls_cert) if tls else None,
        ssl_keyfile=str(options.tls_key) if tls else None,
    )


def _run(server: uvicorn.Server, sock: socket.socket) -> None:
    """Serve until the server exits.

    uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that
    was installed before it started; with the default handler that kills the process before
    `serve`'s shutdown (discovery file left, no runtime_stopped). The handler installed here
    ends it as an orderly exit instead, also for a SIGTERM that arrives before uvicorn is
    listening."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    try:
        server.run(sockets=[sock])
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _shut_down(runtime: Runtime, settings: RuntimeSettings, sock: socket.socket) -> None:
    """In order: the discovery file, the scheduler, the engines and pipeline, OTLP's export."""
    remove_discovery(settings, expected_pid=os.getpid())
    runtime.scheduler.shutdown()
    runtime.host.shutdown()
    if runtime.otlp is not None:
        runtime.otlp.shutdown()  # after the host: runtime_stopped is exported too (bounded)
    sock.close()


def report_crashed_host(submit: Callable[[Event], object], instance_id: str) -> None:
    """`runtime_crashed` (reason `process_crash`) for the host that left its discovery file
    behind, emitted once by the host that replaces it (the file, or the note a command kept
    when it removed the file, is consumed at this start: `take_crashed_host`).

    Reconciled, not observed: the reducer keeps it in the recent events without moving this
    runtime's own state. Its operation id is the dead host's process instance id when that is a
    valid identity (the file's token, url and pid stay out)."""
    try:
        operation_id: LogicalId | None = LogicalId(instance_id)
    except InvalidLogicalId:
        operation_id = None
    submit(
        make_event(
            EventId.RUNTIME_CRASHED,
            Producer.RECONCILED,
            operation_id=operation_id,
            outcome=Outcome.FAILURE,
            reason_code=ReasonCode.PROCESS_CRASH,
        )
    )


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)
