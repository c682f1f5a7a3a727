"""Run one stage worker and report its lifecycle as ``stage_*`` events.

Contract of ``StageSupervisor.run(stop)``:

- ``validate`` refuses, before anything binds or starts, a host that is not an IPv4 address, a
  non-loopback address without ``allow_remote``, a port outside 0–65535, fewer than one thread,
  a memory limit below 1 MiB (``StageRefused``, reason ``invalid_configuration``).
- The port is reserved first (``ports.PortReservation``: port 0 picks a free one, and the real
  port is what every event reports). A port that cannot be reserved (someone listens on it, or
  the address is not this machine's) ends in ``stage_failed`` (``resource_allocation_failure``)
  with no ``stage_starting`` and no process: the stage never started.
- Then ``stage_starting``; the worker process starts (its own session, so a terminal's Ctrl-C
  reaches only this supervisor; it dies with the supervisor, see ``stages.stage_worker``); once the
  worker said it serves, the port accepts a TCP connection **and** (where /proc can tell) the
  listening socket is the worker's, ``stage_ready``. The reservation is released then.
- While it serves, the stage's client (``upstream``: the engine, or a relay in front of it)
  is watched from /proc: ``upstream_connection_established`` once one stayed connected
  ``CLIENT_SETTLE_S``, ``upstream_connection_lost`` when it goes, ``…_recovered`` for the next.
- ``stop`` set (SIGINT/SIGTERM in the CLI): ``stage_stopping``, SIGTERM to the worker, SIGKILL
  after ``STOP_GRACE_S``, then ``stage_stopped`` (outcome success). The worker is never left
  behind: every way out of ``run`` waits for it.
- The worker refusing, its server returning (bind failure: ``resource_allocation_failure``), the
  worker dying (``process_crash``, with its exit status or signal) or not getting ready within
  ``STARTUP_TIMEOUT_S`` (``timeout``) ends in ``stage_failed``.
- Exactly one terminal (``stage_stopped`` or ``stage_failed``) per run; ``run`` returns it as a
  ``StageOutcome``.

Memory: ``ggml_backend_rpc_start_server`` takes devices only, and the server reports each
device's own memory (for the CPU device: the machine's). Nothing in that API caps what a device
allocates, so ``memory_limit_bytes`` is what the stage *offers*: carried by ``stage_starting``
and ``stage_ready`` for a planner to use instead of the reported free memory, and refused at
start when it is more than the device reports free. It is not enforced on allocation.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.config.runtime_settings import python_module_command
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Scope,
    StateChange,
    make_event,
    summaries,
)
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.stages import ports

STARTUP_TIMEOUT_S: Final = 60.0
STOP_GRACE_S: Final = 5.0
PROBE_INTERVAL_S: Final = 0.05
PROBE_CONNECT_TIMEOUT_S: Final = 0.5
CLIENT_LOOK_INTERVAL_S: Final = 0.25
CLIENT_SETTLE_S: Final = 0.5
"""A client connection shorter than this (a probe) is not reported as the stage's upstream."""
MIB: Final = 2**20


def default_threads() -> int:
    """Half the CPUs, at least one (what llama.cpp's rpc-server defaults to)."""
    return max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True, slots=True)
class StageOptions:
    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 1
    memory_limit_mib: int | None = None
    allow_remote: bool = False


class StageRefused(ValueError):
    """The options were refused before anything was bound or started."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class StageOutcome:
    """How a run ended: ``reason`` None when the stage stopped because it was asked to."""

    event: Event
    reason: ReasonCode | None
    message: str


def validate(options: StageOptions) -> str:
    """The IPv4 address to bind, or ``StageRefused`` (nothing has been bound yet)."""
    refuse = ReasonCode.INVALID_CONFIGURATION
    try:
        address = ports.resolve_ipv4(options.host)
    except ports.AddressError as error:
        raise StageRefused(refuse, f"--host: {error}") from error
    if not ports.is_loopback(address) and not options.allow_remote:
        raise StageRefused(
            refuse,
            f"{options.host} is not a loopback address; an RPC stage runs any graph a client "
            "sends, so listening beyond this machine needs --allow-remote",
        )
    if not 0 <= options.port <= ports.MAX_PORT:
        raise StageRefused(refuse, f"--port {options.port} is not 0-{ports.MAX_PORT}")
    if options.threads < 1:
        raise StageRefused(refuse, "--threads must be at least 1")
    if options.memory_limit_mib is not None and options.memory_limit_mib < 1:
        raise StageRefused(refuse, "--mem must be at least 1 MiB")
    return address


class _StatusPipe:
    """The worker's JSON status lines, read without blocking."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.closed = False

    def read(self, timeout_s: float) -> list[dict[str, Any]]:
        if self.closed:
            time.sleep(timeout_s)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.closed = True
        self._buffer += chunk
        out: list[dict[str, Any]] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out

    def close(self) -> None:
        os.close(self.fd)


def _reason(text: object, default: ReasonCode) -> ReasonCode:
    try:
        return ReasonCode(text) if isinstance(text, str) else default
    except ValueError:
        return default


class StageSupervisor:
    """Supervises one stage worker; ``emit`` receives each lifecycle event as it happens.

    ``address``/``port``/``stage_id`` are known once the port is reserved (``on_reserved``);
    ``device``, ``memory_free_bytes``, ``memory_total_bytes`` once the worker serves.
    """

    def __init__(
        self,
        options: StageOptions,
        emit: Callable[[Event], None],
        python: str = sys.executable,
    ) -> None:
        self.options = options
        self._emit = emit
        self._python = python
        self.address = ""
        self.port = options.port
        self.stage_id: LogicalId | None = None
        self.device: str | None = None
        self.memory_free_bytes: int | None = None
        self.memory_total_bytes: int | None = None
        self.worker_pid: int | None = None
        self._state: str | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def memory_limit_bytes(self) -> int | None:
        mib = self.options.memory_limit_mib
        return None if mib is None else mib * MIB

    # -- events ---------------------------------------------------------------------------------

    def _scope(self) -> Scope:
        device = LogicalId(self.device) if self.device else None
        return Scope(stage_id=self.stage_id, device_id=device)

    def _event(self, event_id: EventId, state: str | None, **fields: Any) -> Event:
        """Emit ``event_id``; ``state`` is the stage's new state (None: a connection fact, no
        state change of the stage itself)."""
        extra = fields.pop("extra", {})
        event = make_event(
            event_id,
            scope=self._scope(),
            state=None if state is None else StateChange(self._state, state),
            summaries=summaries(
                port=self.port,
                threads=self.options.threads,
                memory_limit_bytes=self.memory_limit_bytes,
                memory_free_bytes=self.memory_free_bytes,
                memory_total_bytes=self.memory_total_bytes,
                **extra,
            ),
            **fields,
        )
        if state is not None:
            self._state = state
        self._emit(event)
        return event

    def _failed(
        self, reason: ReasonCode, message: str, process: subprocess.Popen[bytes] | None = None
    ) -> StageOutcome:
        extra: dict[str, int] = {}
        if process is not None and process.returncode is not None:
            code = process.returncode
            extra = {"exit_signal": -code} if code < 0 else {"exit_status": code}
        event = self._event(
            EventId.STAGE_FAILED,
            "failed",
            outcome=Outcome.FAILURE,
            reason_code=reason,
            extra=extra,
        )
        return StageOutcome(event, reason, message)

    # -- the run --------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> StageOutcome:
        """Run the stage until ``stop`` is set or it fails (``StageRefused`` before anything)."""
        self.address = validate(self.options)
        try:
            reservation = ports.PortReservation.take(self.address, self.options.port)
        except ports.PortUnavailable as error:
            self.stage_id = ports.stage_id_for(self.address, self.options.port)
            what = "is in use" if error.in_use else f"cannot be bound ({error.strerror})"
            return self._failed(
                ReasonCode.RESOURCE_ALLOCATION_FAILURE,
                f"port {self.options.port} on {self.address} {what}",
            )
        try:
            self.port = reservation.port
            self.stage_id = ports.stage_id_for(self.address, self.port)
            self._event(EventId.STAGE_STARTING, "starting")
            return self._supervise(reservation, stop)
        finally:
            reservation.release()

    def _command(self, status_fd: int) -> list[str]:
        command = [
            *python_module_command("skippyctl.stages.stage_worker", self._python),
            "--host",
            self.address,
            "--port",
            str(self.port),
            "--threads",
            str(self.options.threads),
            "--status-fd",
            str(status_fd),
            "--parent-pid",
            str(os.getpid()),
        ]
        if self.memory_limit_bytes is not None:
            command += ["--mem-bytes", str(self.memory_limit_bytes)]
        return command

    def _supervise(self, reservation: ports.PortReservation, stop: threading.Event) -> StageOutcome:
        read_fd, write_fd = os.pipe()
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                self._command(write_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # ggml's banner and connection lines
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        except OSError as error:
            os.close(read_fd)
            os.close(write_fd)
            return self._failed(
                ReasonCode.INTERNAL_RUNTIME_FAILURE, f"cannot start the stage worker: {error}"
            )
        os.close(write_fd)
        self.worker_pid = process.pid
        status = _StatusPipe(read_fd)
        try:
            outcome = self._until_ready(process, status, reservation, stop, started)
            if outcome is None:
                outcome = self._until_stopped(process, status, stop, started)
            return outcome
        finally:
            _end(process)
            status.close()

    def _until_ready(
        self,
        process: subprocess.Popen[bytes],
        status: _StatusPipe,
        reservation: ports.PortReservation,
        stop: threading.Event,
        started: float,
    ) -> StageOutcome | None:
        serving = False
        while True:
            for message in status.read(PROBE_INTERVAL_S):
                failure = self._on_status(message, process)
                if failure is not None:
                    return failure
                serving = serving or message.get("status") == "serving"
            if stop.is_set():
                return self._stop(process, started)
            if process.poll() is not None:
                return self._died(process, status)
            if serving and self._listening(process.pid):
                break
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                _end(process)
                return self._failed(
                    ReasonCode.TIMEOUT,
                    f"the stage did not accept connections within {STARTUP_TIMEOUT_S:.0f} s",
                    process,
                )
        reservation.release()
        self._event(EventId.STAGE_READY, "ready", duration_ms=(time.monotonic() - started) * 1000.0)
        return None

    def _listening(self, pid: int) -> bool:
        if not ports.accepts_connections(self.address, self.port, PROBE_CONNECT_TIMEOUT_S):
            return False
        # A connection accepted by another process's listener (one that bound the port with
        # SO_REUSEADDR before ggml did) is not the stage being ready.
        return ports.listener_owned_by(pid, self.port) is not False

    def _on_status(
        self, message: dict[str, Any], process: subprocess.Popen[bytes]
    ) -> StageOutcome | None:
        kind = message.get("status")
        if kind == "serving":
            device = message.get("device")
            self.device = device if isinstance(device, str) and device else None
            free, total = message.get("memory_free_bytes"), message.get("memory_total_bytes")
            self.memory_free_bytes = free if isinstance(free, int) else None
            self.memory_total_bytes = total if isinstance(total, int) else None
            return None
        if kind == "refused":
            _reap(process)
            detail = message.get("detail")
            reason = _reason(message.get("reason"), ReasonCode.UNKNOWN_FAILURE)
            return self._failed(reason, str(detail or reason.value), process)
        if kind == "server_returned":
            _reap(process)
            if message.get("address_in_use"):
                return self._failed(
                    ReasonCode.RESOURCE_ALLOCATION_FAILURE,
                    f"port {self.port} on {self.address} is in use",
                    process,
                )
            return self._failed(
                ReasonCode.BACKEND_INITIALIZATION_FAILURE,
                "ggml's RPC server could not start (see its messages above)",
                process,
            )
        return None

    def _died(self, process: subprocess.Popen[bytes], status: _StatusPipe) -> StageOutcome:
        # What the worker said last (a refusal, a bind failure) explains its exit best.
        for message in status.read(0.0) if not status.closed else []:
            failure = self._on_status(message, process)
            if failure is not None:
                return failure
        code = process.returncode
        how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        return self._failed(ReasonCode.PROCESS_CRASH, f"the stage worker died ({how})", process)

    def _until_stopped(
        self,
        process: subprocess.Popen[bytes],
        status: _StatusPipe,
        stop: threading.Event,
        started: float,
    ) -> StageOutcome:
        client = _ClientWatch()
        next_look = 0.0
        while not stop.wait(PROBE_INTERVAL_S):
            for message in status.read(0.0):
                failure = self._on_status(message, process)
                if failure is not None:
                    return failure
            if process.poll() is not None:
                return self._died(process, status)
            now = time.monotonic()
            if now >= next_look:
                next_look = now + CLIENT_LOOK_INTERVAL_S
                change = client.look(ports.clients_connected(process.pid, self.port), now)
                if change is not None:
                    self._event(change, None, outcome=_CLIENT_OUTCOMES[change])
        return self._stop(process, started)

    def _stop(self, process: subprocess.Popen[bytes], started: float) -> StageOutcome:
        self._event(EventId.STAGE_STOPPING, "stopping")
        _end(process)
        code = process.returncode
        extra = {"exit_signal": -code} if code is not None and code < 0 else {}
        event = self._event(
            EventId.STAGE_STOPPED,
            "stopped",
            outcome=Outcome.SUCCESS,
            duration_ms=(time.monotonic() - started) * 1000.0,
            extra=extra,
        )
        return StageOutcome(event, None, "stage stopped")


_CLIENT_OUTCOMES: Final = {
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: Outcome.SUCCESS,
    EventId.UPSTREAM_CONNECTION_RECOVERED: Outcome.SUCCESS,
    EventId.UPSTREAM_CONNECTION_LOST: Outcome.FAILURE,
}


class _ClientWatch:
    """The stage's upstream connection: the client (an engine, or a relay in front of one) that
    ggml's server accepted and serves — one at a time. Seen from /proc (the worker's established
    sockets on its port), never from ggml's output. A client counts as connected once it stayed
    ``CLIENT_SETTLE_S`` (a runtime's probe — HELLO, device memory, close — is not an upstream);
    ``look`` returns the event a change makes: established, lost, then recovered for the next
    client."""

    def __init__(self) -> None:
        self.connected = False
        self._seen_since: float | None = None
        self._lost_once = False

    def look(self, clients: int | None, now: float) -> EventId | None:
        if clients is None:  # cannot be told here (no /proc)
            return None
        if clients == 0:
            self._seen_since = None
            if not self.connected:
                return None
            self.connected, self._lost_once = False, True
            return EventId.UPSTREAM_CONNECTION_LOST
        if self._seen_since is None:
            self._seen_since = now
        if self.connected or now - self._seen_since < CLIENT_SETTLE_S:
            return None
        self.connected = True
        if self._lost_once:
            return EventId.UPSTREAM_CONNECTION_RECOVERED
        return EventId.UPSTREAM_CONNECTION_ESTABLISHED


def _reap(process: subprocess.Popen[bytes]) -> None:
    """The worker said it is exiting: let it, but never wait for it unboundedly."""
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _end(process)


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE_S; returns once the worker is reaped."""
    if process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    except ProcessLookupError:
        process.wait()
