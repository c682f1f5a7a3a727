"""The composition root: `skippyctl runtime serve` builds the runtime host and runs it.

The only place that wires the layers together — pipeline, runtime host and scheduler,
telemetry, the HTTP API — so none of them imports another's construction (the API does not
know how the runtime is built; the runtime does not know it is served over HTTP). The
background launcher (`runtime start`, launch-or-attach) is `skippyctl.client.launch`: it
starts this in a new process with the same `ServeOptions`.

Binds loopback unless told otherwise. Writes the discovery file once the socket accepts
connections and removes it on the way out (SIGINT/SIGTERM shut down in order: API, scheduler,
engines, pipeline).
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from skippyctl import __version__
from skippyctl.client.discovery import (
    Discovery,
    DiscoveryProblem,
    read_discovery,
    remove_discovery,
    remove_if_stale,
    take_crashed_host,
    write_discovery,
)
from skippyctl.client.launch import LOOPBACK_HOSTS, ServeError, ServeOptions
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, InvalidLogicalId, LogicalId, make_event
from skippyctl.events.reasons import Outcome, Producer, ReasonCode

if TYPE_CHECKING:
    from skippyctl.runtime.session_state import SessionStateStore


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


SESSION_STATE_MAX_MIB_ENV = "SKIPPY_SESSION_STATE_MAX_MIB"
"""Cap of the session KV state files an unload keeps for the next load (MiB; 0 turns session
persistence off; default 256)."""


def _session_state_store() -> SessionStateStore | None:
    """The runtime's session state directory (``<runtime dir>/sessions``, mode 0700), or None
    when persistence is off or the directory cannot be used (sessions then prefill again after
    a reload, as before)."""
    from skippyctl.client.discovery import runtime_dir
    from skippyctl.runtime.session_state import (
        DEFAULT_MAX_BYTES,
        DIRECTORY_NAME,
        SessionStateStore,
        StateDirectoryUnusable,
    )

    raw = os.environ.get(SESSION_STATE_MAX_MIB_ENV, "").strip()
    try:
        max_bytes = int(raw) * 1024 * 1024 if raw else DEFAULT_MAX_BYTES
    except ValueError:
        max_bytes = DEFAULT_MAX_BYTES
    if max_bytes <= 0:
        return None
    try:
        return SessionStateStore(runtime_dir() / DIRECTORY_NAME, max_bytes)
    except (OSError, StateDirectoryUnusable):
        return None


def serve(options: ServeOptions) -> None:
    """Run the host in the foreground until SIGINT/SIGTERM or `POST /api/runtime/shutdown`."""
    import uvicorn

    from skippyctl.api.app import create_app
    from skippyctl.api.context import ApiContext
    from skippyctl.pipeline.pipeline import Pipeline
    from skippyctl.runtime.host import RuntimeHost
    from skippyctl.runtime.scheduler import Scheduler
    from skippyctl.runtime.sessions import SessionRegistry
    from skippyctl.telemetry.metrics import MetricsCollector

    if options.host not in LOOPBACK_HOSTS and not options.allow_remote:
        raise ServeError(
            "remote_not_allowed", f"{options.host} is not loopback; pass --allow-remote"
        )
    # OTLP is configured by the standard OTEL_* variables only (telemetry/otlp.py); this check
    # imports nothing from OpenTelemetry: the SDK is loaded below only when OTLP is on.
    from skippyctl.telemetry.otlp import TelemetryConfigError, otlp_config

    try:
        otlp_settings = otlp_config(os.environ)
    except TelemetryConfigError as error:
        raise ServeError("invalid_configuration", str(error)) from error
    try:
        existing = read_discovery()
    except DiscoveryProblem:
        remove_if_stale()
        existing = None
    if existing is not None and existing.pid != os.getpid():
        raise ServeError(
            "already_running",
            f"a runtime is already running at {existing.url} (pid {existing.pid})",
        )
    # A stale file was just removed (and noted), or a command removed one before: report the
    # host it was evidence of, once (the note is consumed).
    crashed = take_crashed_host()
    sock = bind_listener(options.host, options.port)
    port = sock.getsockname()[1]
    shown_host = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{shown_host}:{port}"
    token = options.api_key or os.environ.get("SKIPPY_API_KEY") or secrets.token_urlsafe(32)

    from skippyctl.engine.options import (
        LINK_PROBE_INTERVAL_ENV,
        SERVING_EVENTS_ENV,
        EngineOptions,
        link_probe_interval_from,
        serving_events_from,
    )
    from skippyctl.ingress.host import HostIngressConfig

    # Decided once, here; every engine gets them as spawn arguments (nothing mutates os.environ).
    engine_options = EngineOptions(
        serving_events=serving_events_from(os.environ.get(SERVING_EVENTS_ENV)),
        debug_token_events=options.debug_token_events,
        link_probe_interval_ms=link_probe_interval_from(os.environ.get(LINK_PROBE_INTERVAL_ENV)),
    )
    ingress = HostIngressConfig(debug_enabled=options.debug_token_events)
    host = RuntimeHost(
        Pipeline(ingress_config=ingress, max_replay_records=options.replay_records),
        engine_options,
    )
    host.default_plugins = options.plugins
    host.start()
    if crashed is not None:
        report_crashed_host(host.pipeline.submit, crashed)
    scheduler = Scheduler(
        host,
        max_queue=options.max_queue,
        sessions=SessionRegistry(ttl_s=options.session_ttl_s),
        session_state=_session_state_store(),
    ).start()
    metrics = MetricsCollector()
    metrics.attach(host.pipeline.dispatcher)
    otlp = None
    if otlp_settings is not None:
        from skippyctl.telemetry.otlp_export import OtlpTelemetry

        pipeline = host.pipeline
        otlp = OtlpTelemetry(
            otlp_settings,
            submit=pipeline.submit,
            collector=metrics,
            state=lambda: pipeline.state,
            health=pipeline.health,
            instance_id=str(pipeline.dispatcher.instance_id),
        ).start(pipeline.dispatcher)  # replays what the dispatcher retained, then follows
        metrics.exporter = otlp
    config = uvicorn.Config(
        "skippyctl.api.app:create_app",  # replaced below; uvicorn needs some app reference
        log_level="warning",
        access_log=False,  # request lines are not needed and could carry client-chosen names
        lifespan="on",
        timeout_graceful_shutdown=5,
        # Not uvicorn's "auto" (uvloop + httptools when some package installed them): measured
        # side by side, those made decode 3-4 % slower here at 1, 4 and 8 sessions
        # (docs/BENCHMARKS.md section 5).
        loop="asyncio",
        http="h11",
    )
    server = uvicorn.Server(config)
    discovery = Discovery(
        pid=os.getpid(),
        url=url,
        token=token,
        version=__version__,
        process_instance_id=str(host.pipeline.dispatcher.instance_id),
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )

    def request_shutdown() -> None:
        server.should_exit = True

    ctx = ApiContext(
        host=host,
        scheduler=scheduler,
        token=token,
        version=__version__,
        model_root=options.model_root,
        metrics=metrics,
        request_shutdown=request_shutdown,
        stopping=lambda: bool(server.should_exit),
    )

    def advertise() -> None:
        write_discovery(discovery)

    config.app = create_app(ctx, on_ready=advertise)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that
    # was installed before it started; with the default handler that kills the process before
    # the `finally` below (discovery file left, no runtime_stopped). This handler ends it as an
    # orderly exit instead, also for a SIGTERM that arrives before uvicorn is listening.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    try:
        server.run(sockets=[sock])
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_sigterm)
        remove_discovery(expected_pid=os.getpid())
        scheduler.shutdown()
        host.shutdown()
        if otlp is not None:
            otlp.shutdown()  # after the host: runtime_stopped is exported too (bounded)
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
