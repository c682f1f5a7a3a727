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
Answers are validated: ``len <= capacity`` and ``0 <= id < n_vocab``, else the whole answer is
discarded (reason ``invalid_token_count`` / ``invalid_token_id``). A discard — those, a late
answer (``deadline_exceeded``, counted as ``late``), a query whose pending run did not continue
the plugin's stream (``position_mismatch``) — is counted by reason and told to the plugin as an
outcome of kind ``discarded``; it is never a failure, so it never disables the plugin (the
plugin contract: only crashes, raised exceptions or error statuses and protocol errors are).
With several plugins, the first one in spec order that proposes something for a request wins.
Only requests with a proposal are in the result.

Activation: every sidecar process gets an ACTIVATE frame first (the model id, its geometry, the
speculation mode, the deadline and ``load --plugin-config``), before anything of a request.

Counters leave through ``on_counters``: a thread (``skippy-plugin-counters``) hands each
plugin's counters over every :data:`COUNTERS_INTERVAL_S` when they changed (counts only).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Final

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.abi import AbortReasonCode, IdsFlag
from skippyctl.plugins.api import (
    ABORT_REASON_CODES,
    DISCARD_REASON_CODES,
    OUTCOME_KIND_CODES,
    SPEC_MODE_CODES,
    ActivationContext,
    DiscardReason,
    OutcomeKind,
    plugin_stop_reason,
)
from skippyctl.plugins.sidecar_supervisor import (
    AwaitedAnswer,
    PluginReport,
    PluginSidecar,
    RequestStream,
    SidecarSupervisor,
)
from skippyctl.plugins.wire import AnswerStatus, Msg, activation_text, encode, figure_fields

LOAD_TIMEOUT_S: Final = 10.0
MAX_CAPACITY_TOKENS: Final = 1 << 16
COUNTERS_INTERVAL_S: Final = 2.0
"""How often the link hands changed counters to ``on_counters``."""

_ANSWER_FAILURES: Final = {
    AnswerStatus.RAISED: "raised",
    AnswerStatus.ERROR: "error_status",
    AnswerStatus.INVALID_ARGUMENT: "error_status",
}
_ANSWER_DISCARDS: Final = {
    AnswerStatus.EXPIRED: DiscardReason.DEADLINE_EXCEEDED,
    AnswerStatus.INVALID_TOKEN_COUNT: DiscardReason.INVALID_TOKEN_COUNT,
    AnswerStatus.INVALID_TOKEN_ID: DiscardReason.INVALID_TOKEN_ID,
    AnswerStatus.STREAM_GAP: DiscardReason.POSITION_MISMATCH,
}


def discard_counter(reason: DiscardReason) -> str:
    """The counter of ``reason`` (``late`` for a missed deadline: its older name)."""
    return "late" if reason is DiscardReason.DEADLINE_EXCEEDED else f"discarded_{reason.value}"


def activation_frame(context: ActivationContext) -> bytes:
    """``context`` as the ACTIVATE frame every sidecar gets first."""
    return encode(
        Msg.ACTIVATE,
        int(SPEC_MODE_CODES.get(context.spec_mode, 0)),
        max(0, context.n_vocab),
        max(0, context.n_ctx_per_lane),
        max(0, context.lanes),
        max(0, round(context.proposal_deadline_ms * 1e6)),
        text=activation_text(context.model_id, context.config),
    )


_DISCARDED: Final = OutcomeKind.DISCARDED


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
        activation: ActivationContext | None = None,
        on_counters: Callable[[str, Mapping[str, int]], None] | None = None,
    ) -> None:
        if n_vocab < 1 or deadline_ms <= 0 or queue_capacity < 1:
            raise ValueError("need n_vocab >= 1, deadline_ms > 0 and queue_capacity >= 1")
        self._n_vocab = n_vocab
        self._deadline_ns = int(deadline_ms * 1e6)
        self._capacity = queue_capacity
        self._requests: dict[str, tuple[int, int | None]] = {}
        self._used: dict[str, PluginSidecar] = {}
        """Request → the plugin whose answer its current proposals came from (a discard the
        engine decides is counted on it)."""
        self._next_request = 1
        self._next_query = 1
        self._session_key = secrets.token_bytes(16)
        self._closed = False
        self._last_late: frozenset[str] = frozenset()
        self._on_counters = on_counters
        self._counters_stop = threading.Event()
        self._counters_thread: threading.Thread | None = None
        if activation is None:
            activation = ActivationContext("", n_vocab, 0, 0, "plugin", deadline_ms)
        super().__init__(
            specs,
            on_report=on_report,
            python=python,
            env=env,
            stderr=stderr,
            activation=activation_frame(activation),
        )

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
        activation: ActivationContext | None = None,
        on_counters: Callable[[str, Mapping[str, int]], None] | None = None,
        counters_interval_s: float = COUNTERS_INTERVAL_S,
    ) -> PluginLink:
        """Start one sidecar per spec and wait (up to ``load_timeout_s`` in all) until each
        is loaded or has failed to load (reported ``load_failed``; the link works without it).
        ``env``: the sidecars' environment, without :data:`CREDENTIAL_VARIABLES` (default: this
        process's, inherited as it is); ``stderr``: where their stderr goes (default
        /dev/null); ``activation``: what each plugin is activated with (default: no model id,
        no configuration); ``on_counters(plugin, counters)``: called from the link's own thread
        every ``counters_interval_s`` for each plugin whose counters changed."""
        link = cls(
            specs,
            n_vocab=n_vocab,
            deadline_ms=deadline_ms,
            queue_capacity=queue_capacity,
            on_report=on_report,
            python=python,
            env=env,
            stderr=stderr,
            activation=activation,
            on_counters=on_counters,
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
            if on_counters is not None:
                link._counters_thread = threading.Thread(
                    target=link._counters_loop,
                    args=(counters_interval_s,),
                    name="skippy-plugin-counters",
                    daemon=True,
                )
                link._counters_thread.start()
        except BaseException:
            link.close()
            raise
        return link

    def _counters_loop(self, interval_s: float) -> None:
        sent: dict[str, dict[str, int]] = {}
        while not self._counters_stop.wait(interval_s):
            self.send_counters(sent)

    def send_counters(self, sent: dict[str, dict[str, int]] | None = None) -> None:
        """Hand each plugin's counters to ``on_counters`` (only those that changed since
        ``sent``, which is updated). Never with the lock held."""
        on_counters = self._on_counters
        if on_counters is None:
            return
        for name, counts in self.counters().items():
            if sent is not None:
                if sent.get(name) == counts:
                    continue
                sent[name] = counts
            try:
                on_counters(name, counts)
            except Exception:  # noqa: BLE001 - the engine's callback must not end the thread
                continue

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
                answer = wait.answer
                # no answer by the deadline, or the sidecar's own "it came too late" (EXPIRED)
                missed = answer is None or int(answer.fields[1]) == AnswerStatus.EXPIRED
                if missed and not wait.gone and wait.plugin.state != "disabled":
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
            self._discard(p, wait.request, DiscardReason.DEADLINE_EXCEEDED, 0)
            return []
        try:
            status = AnswerStatus(int(frame.fields[1]))
        except ValueError:
            p.counts["malformed"] += 1
            return self._fail(p, "protocol_error")
        if status in _ANSWER_FAILURES:
            return self._fail(p, _ANSWER_FAILURES[status])
        tokens: array[int] = frame.tokens
        if status in _ANSWER_DISCARDS:
            self._discard(p, wait.request, _ANSWER_DISCARDS[status], len(tokens))
            return []
        if status is not AnswerStatus.OK or not tokens:
            return []
        if len(tokens) > wait.capacity:
            self._discard(p, wait.request, DiscardReason.INVALID_TOKEN_COUNT, len(tokens))
            return []
        n_vocab = self._n_vocab
        if not (min(tokens) >= 0 and max(tokens) < n_vocab):
            self._discard(p, wait.request, DiscardReason.INVALID_TOKEN_ID, len(tokens))
            return []
        p.counts["proposals"] += 1
        p.counts["proposed_tokens"] += len(tokens)
        if wait.request not in result:
            result[wait.request] = tokens.tolist()
            self._used[wait.request] = p
        return []

    def _discard(self, p: PluginSidecar, request: str, reason: DiscardReason, n: int) -> None:
        """``p``'s proposal for ``request`` is discarded unverified: counted by reason and
        told to the plugin (an outcome of kind ``discarded``; dropped when its FIFO is full).
        Never a failure. With the lock held."""
        p.counts[discard_counter(reason)] += 1
        r = p.reqs.get(request)
        if r is None or p.state != "up":
            return
        code = int(DISCARD_REASON_CODES[reason])
        data = encode(Msg.OUTCOME, r.rid, n, 0, n, int(OUTCOME_KIND_CODES[_DISCARDED]), code)
        if not self._put(p, data):
            p.counts["dropped"] += 1

    def outcome(
        self,
        request: str,
        proposed: int,
        accepted: int,
        kind: OutcomeKind,
        reason: DiscardReason | None = None,
    ) -> None:
        """How the last proposal for ``request`` ended (``kind``; a discard the engine decided
        has its ``reason`` and is counted on the plugin whose proposal it was). Every plugin
        that began the request is told."""
        proposed, accepted = max(0, proposed), max(0, accepted)
        code = 0
        with self._lock:
            if kind is OutcomeKind.DISCARDED:
                reason = reason or DiscardReason.EXECUTION_FAILED
                code = int(DISCARD_REASON_CODES[reason])
                used = self._used.get(request)
                if used is not None:
                    used.counts[discard_counter(reason)] += 1
            for p in self._plugins:
                r = p.reqs.get(request)
                if r is None:
                    continue
                if len(p.queue) >= self._capacity:
                    p.counts["dropped"] += 1
                    continue
                rejected = max(0, proposed - accepted)
                kind_code = int(OUTCOME_KIND_CODES[kind])
                self._put(
                    p, encode(Msg.OUTCOME, r.rid, proposed, accepted, rejected, kind_code, code)
                )

    def finish(self, request: str, stop_reason: StopReason, figures: GenerationFigures) -> None:
        """The request finished: its final committed suffix (everything not yet handed over),
        its stop reason and figures go to every plugin that began it. Never dropped."""
        fields = (int(plugin_stop_reason(stop_reason)), *figure_fields(figures))
        with self._lock:
            self._requests.pop(request, None)
            self._used.pop(request, None)
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
            self._used.pop(request, None)
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
            self._used.clear()
            for p in self._plugins:
                p.closing = True
                p.wake.notify_all()
            for wait in self._waiting.values():
                wait.gone = True
            self._answered.notify_all()
        self._counters_stop.set()
        if self._counters_thread is not None:
            self._counters_thread.join()
        self._join_sidecars()

    def __enter__(self) -> PluginLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
