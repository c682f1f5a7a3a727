"""The engine's side of serving plugins: one sidecar process per plugin, driven from the decode
thread without ever making it wait on a plugin for longer than a proposal deadline.

:class:`PluginLink` starts one sidecar (``python -m skippyctl.plugins.sidecar``) per plugin spec
and gives the decode thread six calls — ``begin``, ``commit``, ``propose``, ``outcome``,
``finish``, ``abort`` — plus ``counters`` and ``close``. Per plugin it runs a writer thread
(``skippy-plugin-writer-NAME``: the bounded FIFO → the socket) and a reader thread
(``skippy-plugin-NAME``: answers, faults, the process' death, restarts, reaping).

Delivery (never blocks the decode thread):

- every message to a plugin goes through ONE bounded FIFO per plugin (``queue_capacity``
  messages), so a proposal query is always behind the commit deltas queued before it;
- ``commit`` appends to the request's pending run and hands the run over when the FIFO has room
  (``delivered`` when written); when it is full the tokens stay pending (``deferred``) and
  travel in the next message that fits: a later commit, a query's pending run, or the finish
  suffix. Each run starts at the request's "handed over up to" index, so the plugin's stream is
  contiguous, prefix-consistent and complete — whether or not a query ever fires;
- ``begin`` needs room: when the FIFO is full the request is not begun for that plugin and the
  plugin never hears of it (``dropped``; a partial stream would be worse than none);
  ``outcome`` and queries need room too (``dropped`` when full; a query's pending run then
  stays pending); ``finish`` and ``abort`` always go in (reserved: at most one per begun
  request, so the FIFO exceeds its capacity by at most the requests in flight) — a finish
  suffix is never lost.

Proposals (``propose``): one query per (plugin, request with capacity > 0), all in flight at
once; the call returns when every one is answered or at the deadline (``deadline_ms`` after the
call), whichever is first. An unanswered query is ``late`` and its answer, if it ever comes, is
dropped. A request whose capacity is 0 is not queried, and its pending run stays with the link.
Answers are validated: ``0 <= id < n_vocab`` and ``len <= capacity``, else the whole answer is
dropped and counted a failure (``invalid_tokens``). With several plugins, the first one in spec
order that proposes something for a request wins. Only requests with a proposal are in the
result.

Failures and the disable rule: a failure is a sidecar that died (``crashed``), a Python plugin
that raised (``raised``), a C callback that returned an error status (``error_status``), an
invalid answer (``invalid_tokens``), or :data:`LATE_STREAK_FAILURE` consecutive late answers
(``timeout``; an answer in time resets the streak, so a plugin that is only sometimes late keeps
running). Each failure is reported (kind ``failed``); :data:`DISABLE_AFTER_FAILURES` failures
within :data:`FAILURE_WINDOW_S` disable the plugin (kind ``disabled``: its sidecar is killed,
nothing more is sent to it). A sidecar that died and is not disabled is restarted for new
requests (kind ``restarted`` when it is ready again); the requests it had are over for it. Other
plugins are never affected.

Privacy: token ids travel only to the sidecars. Reports, counters and exceptions carry plugin
names (a basename or an entry-point name, never a path), counts and reason words. A sidecar's
stdout and stderr go to /dev/null unless ``stderr`` says otherwise.

``on_report`` is called from the link's threads and from the decode thread's own calls, never
with a lock held; it must not block and must not call back into the link.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import socket
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.abi import AbortReasonCode, IdsFlag
from skippyctl.plugins.api import ABORT_REASON_CODES, parse_spec, plugin_stop_reason
from skippyctl.plugins.wire import (
    AnswerStatus,
    Fault,
    Frame,
    Malformed,
    Msg,
    encode,
    figure_fields,
    read_frame,
)

DISABLE_AFTER_FAILURES: Final = 3
FAILURE_WINDOW_S: Final = 60.0
LATE_STREAK_FAILURE: Final = 4
"""Consecutive late answers that count as one failure (``timeout``)."""
LOAD_TIMEOUT_S: Final = 10.0
CLOSE_GRACE_S: Final = 2.0
"""How long ``close`` lets a sidecar finish its queue and exit before it is killed."""
MAX_CAPACITY_TOKENS: Final = 1 << 16

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
)


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
    ``invalid_tokens``, ``abi_mismatch``, ``not_found``, ... (``ok`` for loaded/restarted)."""
    failures: int
    """Failures counted so far for this plugin."""


_FAULT_REASONS: Final = {Fault.RAISED: "raised", Fault.ERROR_STATUS: "error_status"}
_ANSWER_FAILURES: Final = {
    AnswerStatus.RAISED: "raised",
    AnswerStatus.ERROR: "error_status",
    AnswerStatus.INVALID_ARGUMENT: "error_status",
    AnswerStatus.INVALID_TOKENS: "invalid_tokens",
}


@dataclass(slots=True)
class _Req:
    rid: int
    handed: int = 0
    """Committed tokens handed over to the plugin: the next run starts here."""
    pending: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Incarnation:
    gen: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    writing: bool = False
    """The writer is in a send on ``sock``: whoever would close it leaves that to the writer
    (closing a socket another thread is using could hand its fd number to a new file)."""
    dead: bool = False
    """Its end of stream was read: close ``sock`` once nobody writes to it."""


@dataclass(slots=True)
class _Wait:
    plugin: _Plugin
    request: str
    capacity: int
    answer: Frame | None = None
    gone: bool = False
    """The sidecar died or was disabled: no answer will come."""


@dataclass(slots=True)
class _Plugin:
    spec: str
    name: str
    wake: threading.Condition
    state: str = "starting"  # starting | up | down | disabled
    gen: int = 0
    inc: _Incarnation | None = None
    queue: deque[bytes] = field(default_factory=deque)
    reqs: dict[str, _Req] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0))
    failure_times: deque[float] = field(default_factory=deque)
    late_streak: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    closing: bool = False
    writer: threading.Thread | None = None
    reader: threading.Thread | None = None


class PluginLink:
    """Serving plugins in sidecar processes, behind the decode thread's calls (module docstring)."""

    def __init__(
        self,
        specs: Sequence[str],
        *,
        n_vocab: int,
        deadline_ms: float,
        queue_capacity: int,
        on_report: Callable[[PluginReport], None],
        python: str,
        env: Mapping[str, str] | None,
        stderr: int | IO[Any] | None,
    ) -> None:
        if n_vocab < 1 or deadline_ms <= 0 or queue_capacity < 1:
            raise ValueError("need n_vocab >= 1, deadline_ms > 0 and queue_capacity >= 1")
        self._n_vocab = n_vocab
        self._deadline_ns = int(deadline_ms * 1e6)
        self._capacity = queue_capacity
        self._on_report = on_report
        self._python = python
        # None: the sidecars inherit this (engine) process's environment, which its host
        # started without credentials; this module never reads the environment.
        self._env = None if env is None else sidecar_environment(env)
        self._stderr = subprocess.DEVNULL if stderr is None else stderr
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._waiting: dict[int, _Wait] = {}
        self._requests: dict[str, tuple[int, int | None]] = {}
        self._next_request = 1
        self._next_query = 1
        self._session_key = secrets.token_bytes(16)
        self._closed = False
        self._last_late: frozenset[str] = frozenset()
        self._plugins: list[_Plugin] = []
        names: set[str] = set()
        for spec in specs:
            name = parse_spec(spec).name
            unique, n = name, 1
            while unique in names:
                n += 1
                unique = f"{name}#{n}"
            names.add(unique)
            self._plugins.append(_Plugin(spec, unique, threading.Condition(self._lock)))

    @classmethod
    def start(
        cls,
        specs: Sequence[str],
        *,
        n_vocab: int,
        deadline_ms: float = 5.0,
        queue_capacity: int = 1024,
        on_report: Callable[[PluginReport], None],
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        stderr: int | IO[Any] | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
    ) -> PluginLink:
        """Start one sidecar per spec and wait (up to ``load_timeout_s`` in all) until each
        is loaded or has failed to load (reported ``load_failed``; the link works without it).
        ``env``: the sidecars' environment, without :data:`CREDENTIAL_VARIABLES` (default: this
        process's, inherited as it is); ``stderr``: where their stderr goes (default
        /dev/null)."""
        link = cls(
            specs,
            n_vocab=n_vocab,
            deadline_ms=deadline_ms,
            queue_capacity=queue_capacity,
            on_report=on_report,
            python=python,
            env=env,
            stderr=stderr,
        )
        try:
            for p in link._plugins:
                link._launch(p)
            until = time.monotonic() + load_timeout_s
            for p in link._plugins:
                if not p.ready.wait(max(0.0, until - time.monotonic())):
                    with link._lock:
                        reports = link._disable(p, "timeout", load=True)
                    link._emit(reports)
        except BaseException:
            link.close()
            raise
        return link

    # ---- processes ----

    def _spawn(self, p: _Plugin) -> _Incarnation:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [self._python, "-m", "skippyctl.plugins.sidecar", "--fd", str(theirs.fileno())]
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
        with self._lock:
            p.gen += 1
            return _Incarnation(p.gen, proc, ours)

    def _launch(self, p: _Plugin) -> None:
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

    def _report(self, p: _Plugin, kind: str, reason: str) -> PluginReport:
        return PluginReport(p.name, kind, reason, p.counts["failures"])

    def _fail(self, p: _Plugin, reason: str) -> list[PluginReport]:
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

    def _forget(self, p: _Plugin) -> None:
        """Everything in flight for ``p``'s current incarnation is over."""
        p.queue.clear()
        p.reqs.clear()
        for wait in self._waiting.values():
            if wait.plugin is p:
                wait.gone = True
        self._answered.notify_all()

    def _disable(self, p: _Plugin, reason: str, *, load: bool = False) -> list[PluginReport]:
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

    def _write_loop(self, p: _Plugin) -> None:
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

    def _read_loop(self, p: _Plugin, inc: _Incarnation) -> None:
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

    def _serve(self, p: _Plugin, inc: _Incarnation) -> None:
        """Read ``inc``'s frames until its end of stream."""
        while True:
            try:
                frame = read_frame(inc.sock)
            except Malformed:
                with self._lock:
                    p.counts["malformed"] += 1
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
                        p.late_streak = 0
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
                    case _:
                        p.counts["malformed"] += 1
                settled = p.state in ("up", "disabled")
            self._emit(reports)
            if settled:
                p.ready.set()  # after its report: start() returns with the reports made

    # ---- the decode thread's calls ----

    def _put(self, p: _Plugin, data: bytes, *, reserved: bool = False) -> bool:
        if not reserved and len(p.queue) >= self._capacity:
            return False
        p.queue.append(data)
        p.wake.notify()
        return True

    def _session_id(self, session: str) -> int:
        digest = hashlib.blake2b(session.encode(), key=self._session_key, digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def begin(self, request: str, session: str | None, prompt: Sequence[int], reused: int) -> None:
        """A generation starts: ``prompt`` is its whole prompt, ``reused`` of it already had KV."""
        with self._lock:
            if self._closed or request in self._requests:
                return
            rid = self._next_request
            self._next_request += 1
            sid = None if session is None else self._session_id(session)
            self._requests[request] = (rid, sid)
            data: bytes | None = None
            for p in self._plugins:
                if p.state != "up":
                    continue
                if len(p.queue) >= self._capacity:
                    p.counts["dropped"] += 1
                    continue
                if data is None:
                    flags = 0 if sid is None else int(IdsFlag.HAS_SESSION)
                    data = encode(Msg.BEGIN, rid, sid or 0, flags, max(0, reused), tokens=prompt)
                self._put(p, data)
                p.reqs[request] = _Req(rid)

    def commit(self, request: str, tokens: Sequence[int]) -> None:
        """``tokens`` were committed after everything committed before. Never blocks."""
        if not tokens:
            return
        with self._lock:
            for p in self._plugins:
                r = p.reqs.get(request)
                if r is None:
                    continue
                r.pending.extend(tokens)
                if len(p.queue) >= self._capacity:
                    p.counts["deferred"] += 1
                    continue
                self._put(p, encode(Msg.COMMIT, r.rid, r.handed, tokens=r.pending))
                r.handed += len(r.pending)
                r.pending = []

    def propose(self, wants: Mapping[str, int]) -> dict[str, list[int]]:
        """Request id → capacity; returns request id → validated proposed tokens (module
        docstring). Blocks at most ``deadline_ms``."""
        deadline_ns = time.monotonic_ns() + self._deadline_ns
        mine: list[int] = []
        result: dict[str, list[int]] = {}
        reports: list[PluginReport] = []
        with self._lock:
            if self._closed:
                return result
            for request, capacity in wants.items():
                if capacity <= 0 or request not in self._requests:
                    continue
                capacity = min(capacity, MAX_CAPACITY_TOKENS)
                for p in self._plugins:
                    r = p.reqs.get(request)
                    if r is None or p.state != "up":
                        continue
                    if len(p.queue) >= self._capacity:
                        p.counts["dropped"] += 1
                        continue
                    qid = self._next_query
                    self._next_query += 1
                    data = encode(
                        Msg.QUERY, qid, r.rid, capacity, deadline_ns, r.handed, tokens=r.pending
                    )
                    self._put(p, data)
                    r.handed += len(r.pending)
                    r.pending = []
                    p.counts["queries"] += 1
                    self._waiting[qid] = _Wait(p, request, capacity)
                    mine.append(qid)
            while mine:
                if all(self._waiting[q].answer is not None or self._waiting[q].gone for q in mine):
                    break
                left_s = (deadline_ns - time.monotonic_ns()) / 1e9
                if left_s <= 0:
                    break
                self._answered.wait(left_s)
            late: set[str] = set()
            for qid in mine:
                wait = self._waiting.pop(qid)
                if wait.answer is None and not wait.gone and wait.plugin.state != "disabled":
                    late.add(wait.request)
                reports += self._take(wait, result)
            self._last_late = frozenset(late)
        self._emit(reports)
        return result

    def late(self) -> frozenset[str]:
        """The requests of the last :meth:`propose` that a plugin did not answer in time."""
        return self._last_late

    def _take(self, wait: _Wait, result: dict[str, list[int]]) -> list[PluginReport]:
        p = wait.plugin
        if wait.gone or p.state == "disabled":
            return []
        frame = wait.answer
        if frame is None:
            p.counts["late"] += 1
            p.late_streak += 1
            if p.late_streak >= LATE_STREAK_FAILURE:
                p.late_streak = 0
                return self._fail(p, "timeout")
            return []
        p.late_streak = 0
        try:
            status = AnswerStatus(int(frame.fields[1]))
        except ValueError:
            p.counts["malformed"] += 1
            return []
        if status in _ANSWER_FAILURES:
            return self._fail(p, _ANSWER_FAILURES[status])
        if status is AnswerStatus.STREAM_GAP:
            p.counts["malformed"] += 1
            return []
        tokens: array[int] = frame.tokens
        if status is not AnswerStatus.OK or not tokens:
            return []
        n_vocab = self._n_vocab
        if len(tokens) > wait.capacity or not all(0 <= t < n_vocab for t in tokens):
            return self._fail(p, "invalid_tokens")
        p.counts["proposals"] += 1
        p.counts["proposed_tokens"] += len(tokens)
        result.setdefault(wait.request, tokens.tolist())
        return []

    def outcome(self, request: str, proposed: int, accepted: int) -> None:
        """How verifying the last proposal for ``request`` went."""
        proposed, accepted = max(0, proposed), max(0, accepted)
        with self._lock:
            data: bytes | None = None
            for p in self._plugins:
                r = p.reqs.get(request)
                if r is None:
                    continue
                if len(p.queue) >= self._capacity:
                    p.counts["dropped"] += 1
                    continue
                if data is None:
                    data = encode(
                        Msg.OUTCOME, r.rid, proposed, accepted, max(0, proposed - accepted)
                    )
                self._put(p, data)

    def finish(self, request: str, stop_reason: StopReason, figures: GenerationFigures) -> None:
        """The request finished: its final committed suffix (everything not yet handed over),
        its stop reason and figures go to every plugin that began it. Never dropped."""
        fields = (int(plugin_stop_reason(stop_reason)), *figure_fields(figures))
        with self._lock:
            self._requests.pop(request, None)
            for p in self._plugins:
                r = p.reqs.pop(request, None)
                if r is None:
                    continue
                self._put(
                    p, encode(Msg.FINISH, r.rid, r.handed, *fields, tokens=r.pending), reserved=True
                )

    def abort(self, request: str, reason: str) -> None:
        """The request ended without a finish (``cancelled``, ``timeout``, ``error``,
        ``shutdown``; anything else is sent as unknown)."""
        code = int(ABORT_REASON_CODES.get(reason, AbortReasonCode.UNKNOWN))
        with self._lock:
            self._requests.pop(request, None)
            for p in self._plugins:
                r = p.reqs.pop(request, None)
                if r is not None:
                    self._put(p, encode(Msg.ABORT, r.rid, code), reserved=True)

    def counters(self) -> dict[str, dict[str, int]]:
        """Per plugin name: :data:`COUNTER_NAMES`. Counts only; never a token id."""
        with self._lock:
            return {p.name: dict(p.counts) for p in self._plugins}

    def sidecar_pids(self) -> list[int]:
        """The live sidecars' pids (for diagnostics and tests)."""
        with self._lock:
            return [p.inc.proc.pid for p in self._plugins if p.inc is not None]

    def close(self) -> None:
        """Abort what is in flight (``shutdown``), let each sidecar finish its queue and exit
        (killed after :data:`CLOSE_GRACE_S`), reap it, join the threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for request in list(self._requests):
                for p in self._plugins:
                    r = p.reqs.pop(request, None)
                    if r is not None and p.state == "up":
                        code = int(AbortReasonCode.SHUTDOWN)
                        self._put(p, encode(Msg.ABORT, r.rid, code), reserved=True)
            self._requests.clear()
            for p in self._plugins:
                p.closing = True
                p.wake.notify_all()
            for wait in self._waiting.values():
                wait.gone = True
            self._answered.notify_all()
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

    def __enter__(self) -> PluginLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
