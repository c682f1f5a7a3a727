"""The engine's side of serving plugins: one sidecar process per plugin, driven from the decode
thread without ever making it wait on a plugin for longer than a proposal deadline.

:class:`PluginLink` starts one sidecar (``python -m skippyctl.plugins.sidecar``) per plugin spec
and gives the decode thread six calls — ``begin``, ``commit``, ``propose``, ``outcome``,
``finish``, ``abort`` — plus ``counters`` and ``close``. The sidecar processes, their threads,
failures, restarts and the disable rule are
:class:`~skippyctl.plugins.sidecar_supervisor.SidecarSupervisor`'s
(``plugins/sidecar_supervisor.py``), which the link extends.

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
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Final

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.abi import AbortReasonCode, IdsFlag
from skippyctl.plugins.api import ABORT_REASON_CODES, plugin_stop_reason
from skippyctl.plugins.sidecar_supervisor import (
    LATE_STREAK_FAILURE,
    AwaitedAnswer,
    PluginReport,
    PluginSidecar,
    RequestStream,
    SidecarSupervisor,
)
from skippyctl.plugins.wire import AnswerStatus, Msg, encode, figure_fields

LOAD_TIMEOUT_S: Final = 10.0
MAX_CAPACITY_TOKENS: Final = 1 << 16

_ANSWER_FAILURES: Final = {
    AnswerStatus.RAISED: "raised",
    AnswerStatus.ERROR: "error_status",
    AnswerStatus.INVALID_ARGUMENT: "error_status",
    AnswerStatus.INVALID_TOKENS: "invalid_tokens",
}


class PluginLink(SidecarSupervisor):
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
        self._requests: dict[str, tuple[int, int | None]] = {}
        self._next_request = 1
        self._next_query = 1
        self._session_key = secrets.token_bytes(16)
        self._closed = False
        self._last_late: frozenset[str] = frozenset()
        super().__init__(specs, on_report=on_report, python=python, env=env, stderr=stderr)

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

    # ---- the decode thread's calls ----

    def _put(self, p: PluginSidecar, data: bytes, *, reserved: bool = False) -> bool:
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
                p.reqs[request] = RequestStream(rid)

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
                    self._waiting[qid] = AwaitedAnswer(p, request, capacity)
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

    def _take(self, wait: AwaitedAnswer, result: dict[str, list[int]]) -> list[PluginReport]:
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

    def close(self) -> None:
        """Abort what is in flight (``shutdown``), let each sidecar finish its queue and exit
        (killed after :data:`~skippyctl.plugins.sidecar_supervisor.CLOSE_GRACE_S`), reap it,
        join the threads. Idempotent."""
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
        self._join_sidecars()

    def __enter__(self) -> PluginLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
