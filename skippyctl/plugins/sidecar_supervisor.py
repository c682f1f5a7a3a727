"""The process side of the serving plugins' link (``plugins/link.py``): one sidecar process per
plugin (``python -m skippyctl.plugins.sidecar``), its two threads, its failures and restarts.

:class:`SidecarSupervisor` starts a sidecar per plugin and runs, per plugin, a writer thread
(``skippy-plugin-writer-NAME``: the bounded FIFO → the socket) and a reader thread
(``skippy-plugin-NAME``: answers, faults, the process' death, restarts, reaping). What goes into
the FIFO and what the answers mean is the link's job (:class:`~skippyctl.plugins.link.PluginLink`,
its subclass).

Failures and the disable rule (the plugin contract): a failure is a sidecar that died
(``crashed``), a Python plugin that raised (``raised``), a C callback that returned an error
status (``error_status``), or a frame from the sidecar that breaks the wire protocol
(``protocol_error``). A late or invalid answer is NOT a failure: the link discards it and
counts it by reason (``late`` for a missed deadline, ``discarded_*`` for the others), and the
plugin keeps serving. Each failure is reported (kind ``failed``);
:data:`DISABLE_AFTER_FAILURES` failures within :data:`FAILURE_WINDOW_S` disable the plugin (kind
``disabled``: its sidecar is killed, nothing more is sent to it). A sidecar that died and is not
disabled is restarted for new requests (kind ``restarted`` when it is ready again); the requests
it had are over for it. Other plugins are never affected.

Privacy: token ids travel only to the sidecars. Reports, counters and exceptions carry plugin
names (a basename or an entry-point name, never a path), counts and reason words. A sidecar's
stdout and stderr go to /dev/null unless ``stderr`` says otherwise.

``on_report`` is called from the link's threads and from the decode thread's own calls, never
with a lock held; it must not block and must not call back into the link.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from skippyctl.plugins.api import parse_spec
from skippyctl.plugins.wire import Fault, Frame, Malformed, Msg, read_frame

DISABLE_AFTER_FAILURES: Final = 3
FAILURE_WINDOW_S: Final = 60.0
CLOSE_GRACE_S: Final = 2.0
"""How long ``close`` lets a sidecar finish its queue and exit before it is killed."""

REPORT_KINDS: Final = ("loaded", "failed", "disabled", "restarted", "load_failed")
COUNTER_NAMES: Final = (
    "delivered",
    "deferred",
    "dropped",
    "late",
    "failures",
    "proposals",
    "proposed_tokens",
    "disabled",
    "restarts",
    "queries",
    "malformed",
    "discarded_invalid_token_count",
    "discarded_invalid_token_id",
    "discarded_position_mismatch",
    "discarded_execution_failed",
)
"""A plugin's counters. ``late`` is the discards for a missed deadline (the discard reason
``deadline_exceeded``, under its older name); ``discarded_<reason>`` the other discard reasons."""


CREDENTIAL_VARIABLES: Final = frozenset(
    {
        "SKIPPY_API_KEY",
        "SKIPPY_TELEMETRY_ENDPOINT",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    }
)
"""The runtime's credentials (its bearer token, a telemetry URL that may carry one, the hub
token, OTLP headers): a plugin's process never gets them. The host starts its engines without
them (``runtime/engine_supervisor.py``), so a sidecar that inherits its engine's environment has
none; an environment given to the link explicitly loses them here."""


def sidecar_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without :data:`CREDENTIAL_VARIABLES`."""
    return {k: v for k, v in environment.items() if k not in CREDENTIAL_VARIABLES}


@dataclass(frozen=True, slots=True)
class PluginReport:
    """What the link tells the engine about a plugin's health."""

    plugin: str
    """The plugin's short name (basename of the .so, or the entry-point name) — never a path."""
    kind: str
    """``loaded`` | ``failed`` | ``disabled`` | ``restarted`` | ``load_failed``."""
    reason: str
    """A short machine word: ``timeout``, ``crashed``, ``raised``, ``error_status``,
    ``protocol_error``, ``abi_mismatch``, ``activate_failed``, ``not_found``, ... (``ok`` for
    loaded/restarted)."""
    failures: int
    """Failures counted so far for this plugin."""


_FAULT_REASONS: Final = {Fault.RAISED: "raised", Fault.ERROR_STATUS: "error_status"}


@dataclass(slots=True)
class RequestStream:
    """A request as handed over to one plugin: its id on the wire and its committed tokens."""

    rid: int
    handed: int = 0
    """Committed tokens handed over to the plugin: the next run starts here."""
    pending: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SidecarIncarnation:
    """One process of a plugin's sidecar (a restart makes the next one)."""

    gen: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    writing: bool = False
    """The writer is in a send on ``sock``: whoever would close it leaves that to the writer
    (closing a socket another thread is using could hand its fd number to a new file)."""
    dead: bool = False
    """Its end of stream was read: close ``sock`` once nobody writes to it."""


@dataclass(slots=True)
class AwaitedAnswer:
    """A proposal query in flight to one plugin."""

    plugin: PluginSidecar
    request: str
    capacity: int
    answer: Frame | None = None
    gone: bool = False
    """The sidecar died or was disabled: no answer will come."""


@dataclass(slots=True)
class PluginSidecar:
    """One plugin: its FIFO, its current sidecar, the requests it began, its counters and health."""

    spec: str
    name: str
    wake: threading.Condition
    state: str = "starting"  # starting | up | down | disabled
    gen: int = 0
    inc: SidecarIncarnation | None = None
    queue: deque[bytes] = field(default_factory=deque)
    reqs: dict[str, RequestStream] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0))
    failure_times: deque[float] = field(default_factory=deque)
    ready: threading.Event = field(default_factory=threading.Event)
    closing: bool = False
    writer: threading.Thread | None = None
    reader: threading.Thread | None = None


class SidecarSupervisor:
    """The sidecars of a link's plugins and the threads that serve them (module docstring).

    Its state is guarded by ``_lock``; the methods that report return the reports, to be emitted
    (:meth:`_emit`) after the lock is released."""

    def __init__(
        self,
        specs: Sequence[str],
        *,
        on_report: Callable[[PluginReport], None],
        python: str,
        env: Mapping[str, str] | None,
        stderr: int | IO[Any] | None,
        activation: bytes,
    ) -> None:
        self._on_report = on_report
        self._activation = activation
        """The ACTIVATE frame every sidecar process gets first (restarts too)."""
        self._python = python
        # None: the sidecars inherit this (engine) process's environment, which its host
        # started without credentials; this module never reads the environment.
        self._env = None if env is None else sidecar_environment(env)
        self._stderr = subprocess.DEVNULL if stderr is None else stderr
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._waiting: dict[int, AwaitedAnswer] = {}
        self._plugins: list[PluginSidecar] = []
        names: set[str] = set()
        for spec in specs:
            name = parse_spec(spec).name
            unique, n = name, 1
            while unique in names:
                n += 1
                unique = f"{name}#{n}"
            names.add(unique)
            self._plugins.append(PluginSidecar(spec, unique, threading.Condition(self._lock)))

    # ---- processes ----

    def _spawn(self, p: PluginSidecar) -> SidecarIncarnation:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                # -P: the working directory never supplies the sidecar's code (as
                # config.runtime_settings.python_module_command; plugins import no config).
                [
                    self._python,
                    "-P",
                    "-m",
                    "skippyctl.plugins.sidecar",
                    "--fd",
                    str(theirs.fileno()),
                ]
                + ["--", p.spec],
                pass_fds=[theirs.fileno()],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                start_new_session=True,  # a Ctrl-C for the engine's terminal is not for it
            )
        except BaseException:
            ours.close()
            theirs.close()
            raise
        theirs.close()
        # First on the wire, before the writer thread exists: a small frame on a fresh socket
        # fits its buffer. A sidecar already dead is seen by the reader (end of stream).
        with contextlib.suppress(OSError):
            ours.sendall(self._activation)
        with self._lock:
            p.gen += 1
            return SidecarIncarnation(p.gen, proc, ours)

    def _launch(self, p: PluginSidecar) -> None:
        try:
            inc = self._spawn(p)
        except OSError:
            with self._lock:
                reports = self._disable(p, "spawn_failed", load=True)
            self._emit(reports)
            p.ready.set()
            return
        p.inc = inc
        p.writer = threading.Thread(
            target=self._write_loop, args=(p,), name=f"skippy-plugin-writer-{p.name}", daemon=True
        )
        p.reader = threading.Thread(
            target=self._read_loop, args=(p, inc), name=f"skippy-plugin-{p.name}", daemon=True
        )
        p.writer.start()
        p.reader.start()

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes], grace_s: float) -> None:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ---- reports and failures (called with the lock held; emit after releasing it) ----

    def _emit(self, reports: list[PluginReport]) -> None:
        for report in reports:
            with contextlib.suppress(Exception):  # the engine's callback must not kill a thread
                self._on_report(report)

    def _report(self, p: PluginSidecar, kind: str, reason: str) -> PluginReport:
        return PluginReport(p.name, kind, reason, p.counts["failures"])

    def _fail(self, p: PluginSidecar, reason: str) -> list[PluginReport]:
        if p.state == "disabled":
            return []
        p.counts["failures"] += 1
        now = time.monotonic()
        p.failure_times.append(now)
        while p.failure_times and now - p.failure_times[0] > FAILURE_WINDOW_S:
            p.failure_times.popleft()
        reports = [self._report(p, "failed", reason)]
        if len(p.failure_times) >= DISABLE_AFTER_FAILURES:
            reports += self._disable(p, reason)
        return reports

    def _forget(self, p: PluginSidecar) -> None:
        """Everything in flight for ``p``'s current incarnation is over."""
        p.queue.clear()
        p.reqs.clear()
        for wait in self._waiting.values():
            if wait.plugin is p:
                wait.gone = True
        self._answered.notify_all()

    def _disable(self, p: PluginSidecar, reason: str, *, load: bool = False) -> list[PluginReport]:
        if p.state == "disabled":
            return []
        p.state = "disabled"
        p.counts["disabled"] = 1
        self._forget(p)
        p.wake.notify_all()
        if p.inc is not None:
            with contextlib.suppress(OSError):
                p.inc.proc.kill()  # non-blocking; the reader reaps it
        return [self._report(p, "load_failed" if load else "disabled", reason)]

    # ---- threads ----

    def _write_loop(self, p: PluginSidecar) -> None:
        while True:
            with self._lock:
                while not p.queue and not p.closing and p.state != "disabled":
                    p.wake.wait()
                if not p.queue:
                    return
                data = p.queue.popleft()
                inc = p.inc
                if inc is not None and not inc.dead:
                    inc.writing = True
                else:
                    inc = None
            ok = False
            if inc is not None:
                try:
                    inc.sock.sendall(data)
                    ok = True
                except OSError:
                    ok = False  # the reader sees the death and counts it
            with self._lock:
                p.counts["delivered" if ok else "dropped"] += 1
                if inc is not None:
                    inc.writing = False
                    if inc.dead:
                        inc.sock.close()

    def _read_loop(self, p: PluginSidecar, inc: SidecarIncarnation) -> None:
        while True:
            self._serve(p, inc)
            with self._lock:
                inc.dead = True
                if not inc.writing:
                    inc.sock.close()
            self._reap(inc.proc, CLOSE_GRACE_S)
            with self._lock:
                if p.closing or p.state == "disabled":
                    p.inc = None
                    p.wake.notify_all()
                    p.ready.set()
                    return
                loading = p.state == "starting" and p.counts["restarts"] == 0
                p.state = "down"
                p.inc = None
                self._forget(p)
                if loading:
                    reports = self._disable(p, "crashed", load=True)
                else:
                    reports = self._fail(p, "crashed")
                stop = p.state == "disabled"
                if not stop:
                    p.state = "starting"
            self._emit(reports)
            if stop:
                p.ready.set()
                return
            try:
                new = self._spawn(p)
            except OSError:
                with self._lock:
                    reports = self._disable(p, "spawn_failed")
                self._emit(reports)
                p.ready.set()
                return
            with self._lock:
                p.counts["restarts"] += 1
                p.inc = new
                if p.closing or p.state == "disabled":
                    new.proc.kill()
            inc = new

    def _serve(self, p: PluginSidecar, inc: SidecarIncarnation) -> None:
        """Read ``inc``'s frames until its end of stream."""
        while True:
            try:
                frame = read_frame(inc.sock)
            except Malformed:
                with self._lock:
                    p.counts["malformed"] += 1
                    broke = self._fail(p, "protocol_error") if inc.gen == p.gen else []
                self._emit(broke)
                continue
            except (EOFError, OSError):
                return
            reports: list[PluginReport] = []
            with self._lock:
                if inc.gen != p.gen or p.state == "disabled":
                    continue
                match frame.kind:
                    case Msg.READY:
                        restarted = p.counts["restarts"] > 0
                        p.state = "up"
                        reports.append(
                            self._report(p, "restarted" if restarted else "loaded", "ok")
                        )
                    case Msg.LOAD_FAILED:
                        word = "".join(c for c in frame.text if c.isalnum() or c == "_")[:32]
                        reports += self._disable(p, word or "load_error", load=True)
                    case Msg.ANSWER:
                        wait = self._waiting.get(int(frame.fields[0]))
                        if wait is not None and wait.plugin is p:
                            wait.answer = frame
                            self._answered.notify_all()
                    case Msg.FAULT:
                        try:
                            fault = Fault(int(frame.fields[1]))
                        except ValueError:
                            fault = Fault.MALFORMED
                        if fault in _FAULT_REASONS:
                            reports += self._fail(p, _FAULT_REASONS[fault])
                        else:
                            p.counts["malformed"] += 1
                    case _:  # an engine → sidecar type, sent the wrong way
                        p.counts["malformed"] += 1
                        reports += self._fail(p, "protocol_error")
                settled = p.state in ("up", "disabled")
            self._emit(reports)
            if settled:
                p.ready.set()  # after its report: start() returns with the reports made

    def sidecar_pids(self) -> list[int]:
        """The live sidecars' pids (for diagnostics and tests)."""
        with self._lock:
            return [p.inc.proc.pid for p in self._plugins if p.inc is not None]

    def _join_sidecars(self) -> None:
        """Let each sidecar finish its queue and exit (killed after :data:`CLOSE_GRACE_S`), reap
        it, join the threads; after every plugin was marked ``closing``."""
        until = time.monotonic() + CLOSE_GRACE_S
        for p in self._plugins:
            if p.writer is not None:
                p.writer.join(max(0.0, until - time.monotonic()))
        with self._lock:
            for p in self._plugins:
                if p.inc is not None and not p.inc.dead:
                    with contextlib.suppress(OSError):
                        p.inc.sock.shutdown(socket.SHUT_WR)  # the sidecar's end of stream
        for p in self._plugins:
            if p.reader is not None:
                p.reader.join(max(0.0, until - time.monotonic()))
        with self._lock:
            incs = [p.inc for p in self._plugins if p.inc is not None]
        for inc in incs:
            with contextlib.suppress(OSError):
                inc.proc.kill()  # still there after the grace: a plugin stuck in a callback
        for p in self._plugins:
            for thread in (p.writer, p.reader):
                if thread is not None:
                    thread.join()
