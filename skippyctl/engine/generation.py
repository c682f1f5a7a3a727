"""The generation core of an engine worker: continuous batching over the lanes of one context.

One llama.cpp context holds ``lanes`` sequences (seq id = lane index). A single decode thread
("skippy-decode") owns the context; other threads only talk to it through :meth:`submit`,
:meth:`cancel`, :meth:`drop_session` and :meth:`stop`, which append to an inbox and never block.

Each decode step builds ONE ``llama_batch`` holding the next token of every decoding lane plus, if
any request is prefilling, up to ``prefill_chunk_tokens`` prompt tokens of ONE prefilling request
(round-robin), so a long prompt never stalls running generations and generations never starve
prefill. Logits are requested only for each decoding lane's token and for the last prompt token
of a prefill that completes in the step.

Invariants (decode thread):

- ``lane.tokens`` is exactly the token sequence stored in that lane's KV (positions
  ``0..len-1``). A lane without a session and without a request has an empty KV.
- A lane runs at most one request. A session lives in at most one lane; its request reuses the
  longest common token prefix of the lane's KV and the new prompt, and prefills only the rest (at
  least the last prompt token, to get logits).
- Every submitted request gets exactly one ``gen_done``, whatever happens: invalid request,
  prompt too long for a lane, cancel, deadline, an exception while handling it, a failed
  ``llama_decode`` or :meth:`stop`. An exception fails only the request(s) it concerns with
  ``internal_runtime_failure``; the thread carries on.
- Messages carry counts, durations and logical ids only; completion text travels only in
  ``gen_text.text``. No prompt text, token ids or paths, ever (ARCHITECTURE.md section 7).

Messages (``msg`` field; exactly these keys). With ``observations=False`` (the events-off
benchmark baseline, SKIPPY_SERVING_EVENTS=off) only ``gen_text`` and ``gen_done`` are sent.

- ``gen_started`` {request_id, lane, session, prompt_tokens, reused_tokens, cache} once a
  tokenized request got a lane. cache: "hit" (all but the last prompt token were in the
  session's KV), "partial", "miss" (session new or nothing reusable), "none" (no session).
- ``gen_prefill_progress`` {request_id, done, total} (tokens to prefill, reuse excluded) at most
  every 250 ms per request, none for a prefill under 250 ms.
- ``gen_prefill_done`` {request_id, tokens, ms}; ``gen_first_token`` {request_id, ttft_ms}
  (submit to first sampled token). Both are held back until the first token's ``gen_text``
  has gone out (the client's first text must not wait for the host to turn them into events),
  and sent before ``gen_done`` if the request ends first.
- ``gen_text`` {request_id, text}: new completion text, whole UTF-8 characters only, stop strings
  held back and cut; at most one per request per decode step.
- ``gen_progress`` {request_id, generated} at most every 500 ms per request.
- ``gen_token`` {request_id, index, step_ms}: only with ``token_observations`` (opt-in debug
  evidence), one per sampled token: its 0-based index and the ms since the request's previous
  sampled token (the first: since submit). Never the token id or its text.
- ``gen_done`` {request_id, outcome, reason, stop_reason, prompt_tokens, completion_tokens,
  reused_tokens, prefill_ms, decode_ms, ttft_ms, prefill_tokens_per_s, decode_tokens_per_s,
  shared_steps, max_batch}: exactly one per submitted request. ``completion_tokens`` excludes an
  end-of-generation token. ``decode_ms`` spans first to last sampled token and
  ``decode_tokens_per_s`` is the inter-token rate over it (null with fewer than two tokens);
  ``ttft_ms`` and ``prefill_tokens_per_s`` are null when not applicable. ``shared_steps`` counts
  this request's steps whose batch held another request; ``max_batch`` is the most sequences in
  one of its batches. A generation that fills its lane ends completed/length with reason
  ``context_exhausted``; a prompt longer than a lane fails with it before any decode.
- ``kv`` {event, cells_used, cells_total[, request_id]}: "initialized" once at start;
  "pressure_crossed" at used/total >= high, "pressure_cleared" at <= low (hysteresis), over the
  cells the lanes can use; "approaching_limit" once per request, with the lane's own numbers,
  when its sequence reaches ``approaching_limit`` of :meth:`BatchEngine.context_tokens_per_lane`.
- ``session`` {session, event, lane, tokens[, reason]}: "created" (tokens 0), "reused" (tokens
  kept), "trimmed" (cached tokens beyond the common prefix were cut, or the lane was reset after
  a failure; tokens kept), "evicted" (tokens it held; reason "lane_needed", "pressure", or the
  :meth:`BatchEngine.drop_session` reason, normally "dropped").

KV facts (llama.cpp as bundled with llama-cpp-python 0.3.36): ``llama_context_params.kv_unified``
defaults to false. Then every sequence gets its own KV stream of ``n_ctx_seq`` cells, where
``n_ctx_seq = pad256(pad256(n_ctx) / n_seq_max)`` and ``n_ctx`` becomes ``n_ctx_seq * n_seq_max``
(``llama_n_ctx_seq`` reports it). With ``kv_unified`` all sequences share one buffer of
``n_ctx`` cells and ``llama_n_ctx_seq == llama_n_ctx``; the engine then guarantees each lane
``n_ctx / lanes`` cells so no lane can starve another. The memory API is ``llama_get_memory`` +
``llama_memory_seq_rm``/``_clear`` (the older ``llama_kv_self_*`` functions no longer exist).
Idle sessions are evicted for pressure only with a unified KV: there they occupy the shared pool
and widen every attention window; in a split KV their cells are the lane's own anyway.

Performance: the ggml CPU backend here is built with OpenMP, whose team belongs to the calling
OS thread. Keep every ``llama_decode`` of the process on the decode thread: a second thread that
computes (a warm-up, another context) leaves a second spinning team behind, and on a machine with
few cores both then run several times slower.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Any, Final

from skippyctl.engine.sampling import SamplerChain, SamplingParams, build_sampler_chain
from skippyctl.engine.text import (
    ChatMessage,
    ChatTemplateError,
    Detokenizer,
    StopMatcher,
    apply_chat_template,
    model_chat_template,
)
from skippyctl.events.reasons import ReasonCode

__all__ = [
    "BatchEngine",
    "CacheResult",
    "ChatMessage",
    "GenerateRequest",
    "GenerationOutcome",
    "SamplingParams",
    "StopReason",
]

DECODE_THREAD_NAME: Final = "skippy-decode"
PREFILL_PROGRESS_INTERVAL_S: Final = 0.25
"""At most one gen_prefill_progress per request per interval, none for a shorter prefill."""
GEN_PROGRESS_INTERVAL_S: Final = 0.5
"""At most one gen_progress per request per interval (2 per second)."""
_SESSION_REASON = re.compile(r"[a-z][a-z0-9_]{0,31}")
_DEFAULT_DROP_REASON: Final = "dropped"


_ESSENTIAL_MESSAGES: Final = frozenset({"gen_text", "gen_done"})
"""What the host needs to serve a request; with ``observations=False`` nothing else is sent."""

_MAX_TOKENIZE_BYTES: Final = (1 << 31) - 1
"""llama_tokenize takes the text length as an int32_t."""

DECODE_ABORTED: Final = 2
"""llama_decode's return value when the abort callback stopped it (llama.h)."""


class GenerationOutcome(StrEnum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


class StopReason(StrEnum):
    EOS = "eos"
    """An end-of-generation token (``llama_vocab_is_eog``: EOS, end-of-turn...)."""
    STOP = "stop"
    LENGTH = "length"
    """``max_tokens`` reached, or the lane's context is full (then reason context_exhausted)."""
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    ERROR = "error"


class CacheResult(StrEnum):
    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation. Exactly one of ``prompt`` / ``messages`` must be set.

    Construction never raises: :meth:`BatchEngine.submit` validates and answers an invalid request
    with ``gen_done`` (failed, invalid_configuration), so every submitted request has a terminal.
    ``session`` is an opaque host-chosen id (never derived from content); ``None`` means no KV
    reuse. ``deadline_mono_s`` is a ``time.monotonic()`` instant for the whole request.
    """

    request_id: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    session: str | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()
    deadline_mono_s: float | None = None


def _validation_error(request: GenerateRequest) -> str | None:
    """Why ``request`` is invalid (a fixed phrase, never request content), or ``None``."""
    if not isinstance(request.request_id, str) or not request.request_id:
        return "request_id"
    if (request.prompt is None) == (request.messages is None):
        return "exactly one of prompt and messages"
    if request.prompt is not None and not isinstance(request.prompt, str):
        return "prompt"
    if request.messages is not None and (
        not isinstance(request.messages, tuple)
        or not request.messages
        or not all(isinstance(m, ChatMessage) for m in request.messages)
    ):
        return "messages"
    if request.session is not None and (
        not isinstance(request.session, str) or not request.session
    ):
        return "session"
    if (
        not isinstance(request.max_tokens, int)
        or isinstance(request.max_tokens, bool)
        or request.max_tokens < 1
    ):
        return "max_tokens"
    if not isinstance(request.stop, tuple) or not all(isinstance(s, str) for s in request.stop):
        return "stop"
    if not isinstance(request.sampling, SamplingParams):
        return "sampling"
    deadline = request.deadline_mono_s
    if deadline is not None and (
        not isinstance(deadline, int | float) or isinstance(deadline, bool) or math.isnan(deadline)
    ):
        return "deadline"
    return None


class _Phase(StrEnum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class _Lane:
    """One sequence of the context. Decode thread only."""

    __slots__ = ("last_used", "request", "seq", "session", "tokens")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.session: str | None = None
        self.request: _Request | None = None
        self.last_used = 0.0


class _Request:
    """Mutable state of one submitted request. Created by ``submit``, then decode thread only."""

    __slots__ = (
        "approaching_sent",
        "completion_tokens",
        "deadline",
        "detok",
        "error",
        "held_observations",
        "id",
        "lane",
        "max_batch",
        "out_index",
        "pending_token",
        "phase",
        "prompt_count",
        "prefill_pos",
        "prompt",
        "reused",
        "sampled",
        "sampler",
        "shared_steps",
        "spec",
        "stops",
        "submitted",
        "t_first",
        "t_last",
        "t_prefill_end",
        "t_prefill_progress",
        "t_prefill_start",
        "t_progress",
    )

    def __init__(self, spec: GenerateRequest, submitted: float, error: str | None) -> None:
        self.spec = spec
        self.id = spec.request_id
        self.submitted = submitted
        self.error = error
        self.deadline: float | None = None if error else spec.deadline_mono_s
        self.phase = _Phase.QUEUED
        self.lane: _Lane | None = None
        self.prompt: list[int] = []
        self.prompt_count: int | None = None
        """The prompt's token count when it was refused without keeping its tokens."""
        self.reused = 0
        self.prefill_pos = 0
        self.sampler: SamplerChain | None = None
        self.detok: Detokenizer | None = None
        self.stops: StopMatcher | None = None
        self.pending_token = -1
        self.out_index = -1
        self.completion_tokens = 0
        self.sampled = 0
        self.held_observations: list[dict[str, Any]] = []
        """gen_prefill_done and gen_first_token, sent after the first token's text."""
        self.shared_steps = 0
        self.max_batch = 0
        self.approaching_sent = False
        self.t_prefill_start = 0.0
        self.t_prefill_end = 0.0
        self.t_prefill_progress = 0.0
        self.t_first = 0.0
        self.t_last = 0.0
        self.t_progress = 0.0


class BatchEngine:
    """Continuous-batching generation over ``lanes`` sequences of one llama.cpp context.

    ``emit`` receives JSON-ready dicts from the decode thread (and, only for requests submitted
    after :meth:`stop` has finished, from the submitting thread). ``emit`` should not raise; if it
    does, the message is counted in :attr:`emit_failures` and the engine carries on.

    The engine does not own ``model`` or ``context`` (the worker frees them after :meth:`stop`).
    It does own its ``llama_batch`` and sampler chains.
    """

    def __init__(
        self,
        llama: ModuleType,
        model: int | ctypes.c_void_p,
        context: Any,
        *,
        lanes: int,
        emit: Callable[[dict[str, Any]], None],
        prefill_chunk_tokens: int = 256,
        kv_pressure_high: float = 0.85,
        kv_pressure_low: float = 0.70,
        approaching_limit: float = 0.90,
        n_threads: int | None = None,
        observations: bool = True,
        token_observations: bool = False,
    ) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        n_seq_max = int(llama.llama_n_seq_max(context))
        if lanes > n_seq_max:
            raise ValueError(f"lanes ({lanes}) exceeds the context's n_seq_max ({n_seq_max})")
        if prefill_chunk_tokens < 1:
            raise ValueError("prefill_chunk_tokens must be >= 1")
        if not 0.0 < kv_pressure_low < kv_pressure_high <= 1.0:
            raise ValueError("need 0 < kv_pressure_low < kv_pressure_high <= 1")
        if not 0.0 < approaching_limit <= 1.0:
            raise ValueError("approaching_limit must be in (0, 1]")
        self._llama = llama
        self._model = model
        self._ctx = context
        self._emit_fn = emit
        # Benchmark baseline (SKIPPY_SERVING_EVENTS=off): only text and terminals are sent.
        self._observations = observations
        self._token_observations = observations and token_observations
        self._lanes = [_Lane(seq) for seq in range(lanes)]
        self._vocab = llama.llama_model_get_vocab(model)
        self._n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        self._memory = llama.llama_get_memory(context)
        if not self._memory:
            raise ValueError("the context has no memory (KV cache): cannot generate with it")

        n_ctx = int(llama.llama_n_ctx(context))
        n_ctx_seq = int(llama.llama_n_ctx_seq(context))
        self._unified = n_seq_max > 1 and n_ctx_seq >= n_ctx
        # Split KV: each sequence has its own n_ctx_seq cells (sequences beyond ``lanes`` are
        # unusable, so they do not count). Unified: one shared pool; each lane is held to an
        # equal share so one long generation cannot make another's decode fail for want of
        # cells.
        if self._unified:
            self._ctx_per_lane = n_ctx // lanes
            self._cells_total = n_ctx
        else:
            self._ctx_per_lane = n_ctx_seq
            self._cells_total = n_ctx_seq * lanes
        n_batch = int(llama.llama_n_batch(context))
        if n_batch <= lanes:
            raise ValueError(f"the context's n_batch ({n_batch}) must exceed lanes ({lanes})")
        # llama_decode refuses a batch over n_batch: a chunk plus one token per lane must fit.
        self._chunk = min(prefill_chunk_tokens, n_batch - lanes)
        self._capacity = self._chunk + lanes
        self._high = kv_pressure_high
        self._low = kv_pressure_low
        self._approaching_tokens = max(1, math.ceil(approaching_limit * self._ctx_per_lane))
        self._pressured = False

        # Decode and batch threads: every core by default (``n_threads`` overrides, e.g. to
        # leave a core to the host). Set here so the engine does not depend on how the context
        # was created.
        threads = n_threads if n_threads is not None else max(1, os.cpu_count() or 1)
        if threads < 1:
            raise ValueError("n_threads must be >= 1")
        llama.llama_set_n_threads(context, threads, threads)
        self._template = model_chat_template(llama, model)
        self._add_bos = True  # llama_tokenize adds BOS only if the vocabulary asks for it
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}

        # Start from an empty KV so ``lane.tokens`` mirrors it exactly.
        llama.llama_memory_clear(self._memory, False)

        # One batch for the engine's lifetime; every slot carries exactly one sequence id.
        self._batch = llama.llama_batch_init(self._capacity, 0, 1)
        self._b_token = self._batch.token
        self._b_pos = self._batch.pos
        self._b_logits = self._batch.logits
        self._b_seq = [self._batch.seq_id[i] for i in range(self._capacity)]
        n_seq_id = self._batch.n_seq_id
        for i in range(self._capacity):
            n_seq_id[i] = 1
        self._batch_freed = False

        self._cond = threading.Condition(threading.Lock())
        self._inbox: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self._ids: set[str] = set()  # request ids without a gen_done yet (guarded by _cond)
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None

        # Decode-thread state.
        self._by_id: dict[str, _Request] = {}
        self._with_deadline = 0  # requests in _by_id with a deadline (skip _expire when none)
        self._queue: collections.deque[_Request] = collections.deque()
        self._prefilling: collections.deque[_Request] = collections.deque()
        self._decoding: list[_Request] = []
        self._sessions: dict[str, _Lane] = {}
        self.emit_failures = 0

    # ---------------------------------------------------------------- public, any thread

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    def context_tokens_per_lane(self) -> int:
        """Most tokens (prompt + completion) one lane's sequence may hold; enforced per request."""
        return self._ctx_per_lane

    @property
    def kv_unified(self) -> bool:
        """Whether the context shares one KV buffer across sequences (``kv_unified``)."""
        return self._unified

    def start(self) -> None:
        """Start the decode thread (once). Requests submitted before are served from then on."""
        with self._cond:
            if self._thread is not None or self._stopping:
                raise RuntimeError("the engine was already started or stopped")
            self._thread = threading.Thread(target=self._run, name=DECODE_THREAD_NAME, daemon=True)
            self._thread.start()

    def submit(self, request: GenerateRequest) -> None:
        """Queue ``request``; never blocks, never raises for a bad request.

        An invalid request (or a duplicate of an in-flight request id) is answered with
        ``gen_done`` failed/invalid_configuration. After :meth:`stop` every request is answered
        with ``gen_done`` cancelled.
        """
        submitted = time.monotonic()
        error = _validation_error(request) if isinstance(request, GenerateRequest) else "type"
        if error is not None and not isinstance(request, GenerateRequest):
            return  # nothing to answer: there is no request id
        with self._cond:
            if error is None and request.request_id in self._ids:
                error = "duplicate request_id"
            state = _Request(request, submitted, error)
            if self._closed:
                closed = True
            else:
                closed = False
                if error is None:
                    self._ids.add(request.request_id)
                self._inbox.append(("submit", state, None))
                self._cond.notify()
        if closed:
            if error is not None:
                message = self._done_message(
                    state,
                    GenerationOutcome.FAILED,
                    StopReason.ERROR,
                    ReasonCode.INVALID_CONFIGURATION,
                )
            else:
                message = self._done_message(
                    state, GenerationOutcome.CANCELLED, StopReason.CANCELLED
                )
            self._emit(message)

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request; takes effect before the next decode step."""
        with self._cond:
            if request_id in self._ids:
                self._inbox.append(("cancel", request_id, None))
                self._cond.notify()

    def drop_session(self, session: str, reason: str = _DEFAULT_DROP_REASON) -> None:
        """Forget ``session`` and free its lane's KV (``session`` evicted with ``reason``).

        ``reason`` is echoed in the event when it is a short snake_case word (the host normally
        passes "dropped"); anything else becomes "dropped". A request of that session that is
        running keeps running; its lane is cleared when it ends.
        """
        if not isinstance(reason, str) or not _SESSION_REASON.fullmatch(reason):
            reason = _DEFAULT_DROP_REASON
        with self._cond:
            self._inbox.append(("drop", session, reason))
            self._cond.notify()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every pending request with ``cancelled`` and join the decode thread. Idempotent."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is None:
            self._shutdown()  # never started: answer the inbox from this thread
        elif thread is not threading.current_thread():
            thread.join(timeout_s)

    # ---------------------------------------------------------------- messages

    def _emit(self, message: dict[str, Any]) -> None:
        if not self._observations and message["msg"] not in _ESSENTIAL_MESSAGES:
            return
        try:
            self._emit_fn(message)
        except Exception:  # noqa: BLE001 - a broken consumer must not kill the decode thread
            self.emit_failures += 1

    def _release_observations(self, r: _Request) -> None:
        """Send the observations held back while the first token's text went out first: the
        client's time to first token does not wait for the host to turn them into events."""
        held, r.held_observations = r.held_observations, []
        for message in held:
            self._emit(message)

    def _emit_kv(self, event: str, used: int, total: int, request_id: str | None = None) -> None:
        message: dict[str, Any] = {
            "msg": "kv",
            "event": event,
            "cells_used": used,
            "cells_total": total,
        }
        if request_id is not None:
            message["request_id"] = request_id
        self._emit(message)

    def _emit_session(self, lane: _Lane, session: str, event: str, reason: str | None) -> None:
        message: dict[str, Any] = {
            "msg": "session",
            "session": session,
            "event": event,
            "lane": lane.seq,
            "tokens": len(lane.tokens),
        }
        if reason is not None:
            message["reason"] = reason
        self._emit(message)

    def _done_message(
        self,
        r: _Request,
        outcome: GenerationOutcome,
        stop_reason: StopReason,
        reason: ReasonCode | None = None,
    ) -> dict[str, Any]:
        if reason is None and outcome is GenerationOutcome.CANCELLED:
            reason = ReasonCode.CANCELLATION
        elif reason is None and outcome is GenerationOutcome.TIMED_OUT:
            reason = ReasonCode.TIMEOUT
        prefill_s = 0.0
        if r.t_prefill_start:
            prefill_s = (r.t_prefill_end or time.monotonic()) - r.t_prefill_start
        prefilled = r.prefill_pos - r.reused
        decode_s = r.t_last - r.t_first if r.sampled >= 2 else 0.0
        return {
            "msg": "gen_done",
            "request_id": r.id,
            "outcome": outcome.value,
            "reason": None if reason is None else reason.value,
            "stop_reason": stop_reason.value,
            "prompt_tokens": len(r.prompt) if r.prompt_count is None else r.prompt_count,
            "completion_tokens": r.completion_tokens,
            "reused_tokens": r.reused,
            "prefill_ms": round(prefill_s * 1000.0, 3),
            "decode_ms": round(decode_s * 1000.0, 3),
            "ttft_ms": round((r.t_first - r.submitted) * 1000.0, 3) if r.sampled else None,
            "prefill_tokens_per_s": round(prefilled / prefill_s, 2) if prefill_s > 0 else None,
            # Inter-token rate: tokens after the first over the time between first and last.
            "decode_tokens_per_s": round((r.sampled - 1) / decode_s, 2) if decode_s > 0 else None,
            "shared_steps": r.shared_steps,
            "max_batch": r.max_batch,
        }

    # ---------------------------------------------------------------- decode thread

    def _run(self) -> None:
        try:
            self._emit_kv("initialized", 0, self._cells_total)
            while not self._stopping:
                try:
                    busy = self._iterate()
                except Exception:  # noqa: BLE001 - the decode thread must outlive any bug
                    # Not attributable to one request: fail the running ones, and any request
                    # the failure left on no list (it would never get its gen_done), keep serving.
                    listed = {id(r) for r in (*self._queue, *self._prefilling, *self._decoding)}
                    orphans = [r for r in self._by_id.values() if id(r) not in listed]
                    for r in (*self._prefilling, *self._decoding, *orphans):
                        self._fail(r)
                    continue
                if not busy:
                    with self._cond:
                        while not self._inbox and not self._stopping:
                            self._cond.wait()
        finally:
            self._shutdown()

    def _iterate(self) -> bool:
        """Inbox, deadlines, admission, then one decode step; False when there is no work."""
        if self._inbox:
            self._drain_inbox()
        if self._stopping:
            return True
        if self._with_deadline:
            self._expire(time.monotonic())
        if self._queue:
            self._admit()
        if self._prefilling or self._decoding:
            self._step()  # checks KV pressure itself
            return True
        # Requests may have ended outside a step (cancel, deadline, drop): report KV now, the
        # thread is about to sleep.
        self._check_pressure()
        return False

    def _drain_inbox(self) -> None:
        with self._cond:
            items = list(self._inbox)
            self._inbox.clear()
        for kind, first, second in items:
            # One item at a time: whatever one raises, the others drained with it are handled.
            try:
                if kind == "submit":
                    self._accept(first)
                elif kind == "cancel":
                    r = self._by_id.get(first)
                    if r is not None:
                        self._finish(r, GenerationOutcome.CANCELLED, StopReason.CANCELLED)
                else:
                    self._drop(first, second)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                if kind == "submit" and first.phase is not _Phase.DONE:
                    self._fail(first)

    def _accept(self, r: _Request) -> None:
        """Validate, tokenize and queue a submitted request (or answer it at once)."""
        if r.error is not None:
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INVALID_CONFIGURATION
            )
            return
        self._by_id[r.id] = r
        if r.deadline is not None:
            self._with_deadline += 1
        spec = r.spec
        try:
            if spec.messages is not None:
                text = apply_chat_template(self._llama, self._template, spec.messages)
            else:
                assert spec.prompt is not None  # validated: exactly one of prompt/messages
                text = spec.prompt
            prompt, counted = self._tokenize_for_lane(text)
        except (ChatTemplateError, ValueError, UnicodeError):
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INVALID_CONFIGURATION
            )
            return
        except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INTERNAL_RUNTIME_FAILURE
            )
            return
        if prompt is None:
            # Longer than a lane: refused before any lane or session is touched (no decode).
            r.prompt_count = counted
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.CONTEXT_EXHAUSTED
            )
            return
        r.prompt = prompt
        bias_outside_vocab = any(t >= self._n_vocab for t, _b in spec.sampling.logit_bias)
        if not r.prompt or bias_outside_vocab:
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INVALID_CONFIGURATION
            )
            return
        self._queue.append(r)

    def _tokenize_for_lane(self, text: str) -> tuple[list[int] | None, int]:
        """The prompt's tokens (None when they cannot fit a lane) and how many there are (at
        least 2**31 when llama.cpp reports an int32 overflow).

        The buffer holds one token more than a lane, whatever the prompt's size: llama_tokenize
        still counts a longer prompt and returns minus the count (INT32_MIN when the count
        overflows int32), so a huge prompt costs its tokenization, never a buffer of its size.
        """
        data = text.encode("utf-8")
        if len(data) > _MAX_TOKENIZE_BYTES:
            # llama_tokenize's text_len is an int32_t. Not counted: only "more than a lane holds"
            # is known (2 GiB of text is millions of tokens even with long tokens).
            return None, self._ctx_per_lane + 1
        capacity = self._ctx_per_lane + 1
        buffer = (self._llama.llama_token * capacity)()
        count = int(
            self._llama.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, self._add_bos, True
            )
        )
        if count < 0:
            return None, -count
        if count > self._ctx_per_lane:
            return None, count
        tokens: list[int] = buffer[:count]
        return tokens, count

    def _drop(self, session: str, reason: str) -> None:
        lane = self._sessions.pop(session, None)
        if lane is None:
            return
        lane.session = None
        self._emit_session(lane, session, "evicted", reason)
        if lane.request is None:
            self._clear_lane(lane)
        # else: the running request finishes normally; its lane is cleared then (no session).
        self._check_pressure()

    def _expire(self, now: float) -> None:
        """Deadlines, checked between decode steps for queued and running requests."""
        expired: list[_Request] | None = None
        for group in (self._queue, self._prefilling, self._decoding):
            for r in group:
                if r.deadline is not None and now >= r.deadline:
                    if expired is None:
                        expired = []
                    expired.append(r)
        if expired is not None:
            for r in expired:
                self._finish(r, GenerationOutcome.TIMED_OUT, StopReason.TIMEOUT)

    def _admit(self) -> None:
        """Move queued requests into lanes, FIFO among the requests that can run now.

        A request whose session is busy in its lane waits without blocking the ones behind it.
        """
        if all(lane.request is not None for lane in self._lanes):
            return
        waiting: list[_Request] = []
        while self._queue:
            r = self._queue.popleft()
            try:
                lane = self._pick_lane(r)
                if lane is None:
                    waiting.append(r)
                    if r.spec.session is None or r.spec.session not in self._sessions:
                        break  # no lane at all: nobody behind can run either
                    continue
                self._start(r, lane)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                self._fail(r)
        self._queue.extendleft(reversed(waiting))

    def _pick_lane(self, r: _Request) -> _Lane | None:
        session = r.spec.session
        if session is not None and session in self._sessions:
            lane = self._sessions[session]
            return lane if lane.request is None else None
        idle = [lane for lane in self._lanes if lane.request is None]
        if not idle:
            return None
        for lane in idle:
            if lane.session is None:
                return lane
        # Every idle lane keeps a warm session: displace the least recently used one.
        lane = min(idle, key=lambda candidate: candidate.last_used)
        evicted = lane.session
        assert evicted is not None
        del self._sessions[evicted]
        lane.session = None
        self._emit_session(lane, evicted, "evicted", "lane_needed")
        self._clear_lane(lane)
        return lane

    def _start(self, r: _Request, lane: _Lane) -> None:
        """Bind ``r`` to ``lane``: reuse the session prefix, build the sampler, start prefill."""
        lane.request = r
        r.lane = lane
        session = r.spec.session
        prompt = r.prompt
        n_prompt = len(prompt)
        cache = CacheResult.NONE
        if session is not None:
            if lane.session == session:
                cached = lane.tokens
                common = 0
                limit = min(len(cached), n_prompt)
                while common < limit and cached[common] == prompt[common]:
                    common += 1
                # Decode at least the last prompt token again: its logits are needed.
                keep = min(common, n_prompt - 1)
                diverged = len(cached) > common
                if keep < len(cached):
                    if not self._llama.llama_memory_seq_rm(self._memory, lane.seq, keep, -1):
                        # Partial removal unsupported (e.g. recurrent memory): start over.
                        self._clear_lane(lane)
                        keep = 0
                    del lane.tokens[keep:]
                r.reused = keep
                if keep == 0:
                    cache = CacheResult.MISS
                elif keep == n_prompt - 1:
                    cache = CacheResult.HIT
                else:
                    cache = CacheResult.PARTIAL
                self._emit_session(lane, session, "trimmed" if diverged else "reused", None)
            else:
                lane.session = session
                self._sessions[session] = lane
                cache = CacheResult.MISS
                self._emit_session(lane, session, "created", None)
        params = r.spec.sampling
        r.sampler = build_sampler_chain(self._llama, self._vocab, params)
        if params.penalizes:
            r.sampler.accept(prompt[-params.repeat_last_n :])
        r.detok = Detokenizer(self._llama, self._vocab, self._pieces)
        r.stops = StopMatcher(r.spec.stop)
        r.prefill_pos = r.reused
        r.phase = _Phase.PREFILL
        now = time.monotonic()
        r.t_prefill_start = r.t_prefill_progress = now
        self._prefilling.append(r)
        self._emit(
            {
                "msg": "gen_started",
                "request_id": r.id,
                "lane": lane.seq,
                "session": session,
                "prompt_tokens": n_prompt,
                "reused_tokens": r.reused,
                "cache": cache.value,
            }
        )

    def _step(self) -> None:
        """One llama_decode: every decoding lane's next token + one prefill chunk."""
        token = self._b_token
        pos = self._b_pos
        logits = self._b_logits
        seq = self._b_seq
        n = 0
        decoding = self._decoding
        for r in decoding:
            lane = r.lane
            assert lane is not None
            token[n] = r.pending_token
            pos[n] = len(lane.tokens)
            seq[n][0] = lane.seq
            logits[n] = 1
            r.out_index = n
            n += 1
        prefill: _Request | None = None
        take = 0
        if self._prefilling:
            prefill = self._prefilling.popleft()
            lane = prefill.lane
            assert lane is not None
            start = prefill.prefill_pos
            take = min(self._chunk, len(prefill.prompt) - start)
            prompt = prefill.prompt
            lane_seq = lane.seq
            for i in range(start, start + take):
                token[n] = prompt[i]
                pos[n] = i
                seq[n][0] = lane_seq
                logits[n] = 0
                n += 1
            if start + take == len(prefill.prompt):
                logits[n - 1] = 1
                prefill.out_index = n - 1
            else:
                prefill.out_index = -1
                self._prefilling.append(prefill)  # round-robin: next chunk goes to the next one
        self._batch.n_tokens = n
        n_seqs = len(decoding) + (1 if prefill is not None else 0)
        participants = decoding if prefill is None else [*decoding, prefill]
        if n_seqs > 1:
            for r in participants:
                r.shared_steps += 1
                if n_seqs > r.max_batch:
                    r.max_batch = n_seqs
        else:
            for r in participants:
                if r.max_batch < 1:
                    r.max_batch = 1

        result = self._llama.llama_decode(self._ctx, self._batch)
        now = time.monotonic()
        if result != 0:
            self._decode_failed(participants, aborted=result == DECODE_ABORTED)
            return

        # The batch is in the KV now: mirror it.
        for r in decoding:
            lane = r.lane
            assert lane is not None
            lane.tokens.append(r.pending_token)
        if prefill is not None:
            lane = prefill.lane
            assert lane is not None
            lane.tokens.extend(prefill.prompt[prefill.prefill_pos : prefill.prefill_pos + take])
            prefill.prefill_pos += take
            if prefill.out_index < 0:
                if now - prefill.t_prefill_progress >= PREFILL_PROGRESS_INTERVAL_S:
                    prefill.t_prefill_progress = now
                    self._emit(
                        {
                            "msg": "gen_prefill_progress",
                            "request_id": prefill.id,
                            "done": prefill.prefill_pos - prefill.reused,
                            "total": len(prefill.prompt) - prefill.reused,
                        }
                    )
            else:
                prefill.t_prefill_end = now
                prefill.held_observations.append(
                    {
                        "msg": "gen_prefill_done",
                        "request_id": prefill.id,
                        "tokens": prefill.prefill_pos - prefill.reused,
                        "ms": round((now - prefill.t_prefill_start) * 1000.0, 3),
                    }
                )
                prefill.phase = _Phase.DECODE
                decoding.append(prefill)

        for r in list(decoding):
            if r.out_index < 0:
                continue
            try:
                self._on_logits(r, now)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                self._fail(r)
        self._check_pressure()

    def _on_logits(self, r: _Request, now: float) -> None:
        """Sample ``r``'s next token from this step's logits and stream its text."""
        llama = self._llama
        index = r.out_index
        r.out_index = -1
        sampler = r.sampler
        assert sampler is not None
        token = int(llama.llama_sampler_sample(sampler.pointer, self._ctx, index))
        r.sampled += 1
        if self._token_observations:
            # Opt-in debug evidence: the token's ordinal and timing only, never the token.
            self._emit(
                {
                    "msg": "gen_token",
                    "request_id": r.id,
                    "index": r.sampled - 1,
                    "step_ms": round((now - (r.t_last or r.submitted)) * 1000.0, 3),
                }
            )
        r.t_last = now
        if r.sampled == 1:
            r.t_first = r.t_progress = now
            r.held_observations.append(
                {
                    "msg": "gen_first_token",
                    "request_id": r.id,
                    "ttft_ms": round((now - r.submitted) * 1000.0, 3),
                }
            )
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        if eog:
            self._finish(r, GenerationOutcome.COMPLETED, StopReason.EOS)
            return
        r.completion_tokens += 1
        detok = r.detok
        stops = r.stops
        assert detok is not None
        assert stops is not None
        text = detok.push(token)
        if stops.active:
            text, stopped = stops.push(text)
            if stopped:
                if text:
                    self._emit({"msg": "gen_text", "request_id": r.id, "text": text})
                self._finish(r, GenerationOutcome.COMPLETED, StopReason.STOP)
                return
        # A finishing request sends this token's text together with the flushed tail (one
        # gen_text per request per step).
        if r.completion_tokens >= r.spec.max_tokens:
            self._finish(r, GenerationOutcome.COMPLETED, StopReason.LENGTH, text=text)
            return
        lane = r.lane
        assert lane is not None
        used = len(lane.tokens)
        if used >= self._ctx_per_lane:
            # The sampled token has no cell left to be decoded into.
            self._finish(
                r,
                GenerationOutcome.COMPLETED,
                StopReason.LENGTH,
                ReasonCode.CONTEXT_EXHAUSTED,
                text=text,
            )
            return
        if text:
            self._emit({"msg": "gen_text", "request_id": r.id, "text": text})
        if r.held_observations:
            self._release_observations(r)
        if now - r.t_progress >= GEN_PROGRESS_INTERVAL_S:
            r.t_progress = now
            self._emit(
                {"msg": "gen_progress", "request_id": r.id, "generated": r.completion_tokens}
            )
        r.pending_token = token
        if not r.approaching_sent and used + 1 >= self._approaching_tokens:
            r.approaching_sent = True
            self._emit_kv("approaching_limit", used + 1, self._ctx_per_lane, r.id)

    def _decode_failed(self, participants: list[_Request], aborted: bool = False) -> None:
        """llama_decode refused or failed: the requests in that batch fail (or, when the native
        abort callback stopped it, are cancelled); the engine goes on."""
        for r in list(participants):
            self._fail(r, aborted)

    def _fail(self, r: _Request, aborted: bool = False) -> None:
        """Fail ``r`` with internal_runtime_failure (cancelled when ``aborted``) and reset its
        lane to an empty KV.

        After an error the lane's KV may hold part of a batch, so it is not trusted: a session
        keeps its lane with no tokens (``session`` trimmed, tokens 0).
        """
        lane = r.lane
        if aborted:
            self._finish(
                r, GenerationOutcome.CANCELLED, StopReason.CANCELLED, ReasonCode.CANCELLATION
            )
        else:
            self._finish(
                r, GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INTERNAL_RUNTIME_FAILURE
            )
        if lane is None or lane.request is not None:
            return
        lane.tokens.clear()
        # Best effort: keep serving the other lanes whatever happens here.
        with contextlib.suppress(Exception):
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)
        if lane.session is not None:
            self._emit_session(lane, lane.session, "trimmed", None)

    def _finish(
        self,
        r: _Request,
        outcome: GenerationOutcome,
        stop_reason: StopReason,
        reason: ReasonCode | None = None,
        *,
        text: str = "",
    ) -> None:
        """The single exit of every request: flush text, free, release the lane, gen_done.

        ``text`` is completion text not yet sent (the last token's); it goes out in the same
        gen_text as the flushed tail. A stop-string or failed ending flushes nothing: held-back
        text of a stop is cut, and a failure's text is not trusted.
        """
        if r.phase is _Phase.DONE:
            return
        phase = r.phase
        r.phase = _Phase.DONE
        try:
            if (
                stop_reason is not StopReason.STOP
                and stop_reason is not StopReason.ERROR
                and r.detok is not None
                and r.stops is not None
            ):
                tail = r.detok.flush()
                if r.stops.active:
                    released, _stopped = r.stops.push(tail)
                    text += released + r.stops.flush()
                else:
                    text += tail
            if text:
                self._emit({"msg": "gen_text", "request_id": r.id, "text": text})
        except Exception:  # noqa: BLE001 - the terminal below must still be sent
            pass
        self._release_observations(r)
        # A request may already be off its list (popped for admission or for a prefill chunk).
        with contextlib.suppress(ValueError):
            if phase is _Phase.QUEUED:
                self._queue.remove(r)
            elif phase is _Phase.PREFILL:
                self._prefilling.remove(r)
            elif phase is _Phase.DECODE:
                self._decoding.remove(r)
        if r.sampler is not None:
            r.sampler.close()
        lane = r.lane
        if lane is not None:
            lane.request = None
            lane.last_used = time.monotonic()
            if lane.session is None:
                try:
                    self._clear_lane(lane)
                except Exception:  # noqa: BLE001 - the terminal below must still be sent
                    lane.tokens.clear()
        if self._by_id.pop(r.id, None) is not None and r.deadline is not None:
            self._with_deadline -= 1
        message = self._done_message(r, outcome, stop_reason, reason)
        with self._cond:
            if r.error is None:
                self._ids.discard(r.id)
        self._emit(message)

    def _clear_lane(self, lane: _Lane) -> None:
        if lane.tokens:
            lane.tokens.clear()
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)

    def _check_pressure(self) -> None:
        """Hysteresis: crossed at >= high, cleared at <= low; never flaps in between."""
        total = self._cells_total
        used = 0
        for lane in self._lanes:
            used += len(lane.tokens)
        if not self._pressured:
            if used >= self._high * total:
                self._pressured = True
                self._emit_kv("pressure_crossed", used, total)
                if self._unified:
                    used = self._relieve_pressure(used)
                    if used <= self._low * total:
                        self._pressured = False
                        self._emit_kv("pressure_cleared", used, total)
        elif used <= self._low * total:
            self._pressured = False
            self._emit_kv("pressure_cleared", used, total)

    def _relieve_pressure(self, used: int) -> int:
        """Unified KV only: idle warm sessions share the pool (and widen every attention window),
        so evict them least recently used first until usage is back at the low mark.

        With a split KV each lane has its own reserved cells and evicting frees nothing others
        can use, so warm sessions are kept.
        """
        idle = sorted(
            (lane for lane in self._lanes if lane.request is None and lane.session is not None),
            key=lambda lane: lane.last_used,
        )
        for lane in idle:
            if used <= self._low * self._cells_total:
                break
            session = lane.session
            assert session is not None
            used -= len(lane.tokens)
            del self._sessions[session]
            lane.session = None
            self._emit_session(lane, session, "evicted", "pressure")
            self._clear_lane(lane)
        return used

    def _shutdown(self) -> None:
        """Answer everything still pending with ``cancelled``; free the batch. Runs once."""
        with self._cond:
            if self._closed:
                return
            self._stopping = True
        while True:
            with self._cond:
                items = list(self._inbox)
                self._inbox.clear()
                if not items:
                    # From here on submit() answers by itself: nothing can slip in between.
                    self._closed = True
                    break
            for kind, first, _second in items:
                if kind == "submit":
                    r = first
                    if r.error is not None:
                        self._finish(
                            r,
                            GenerationOutcome.FAILED,
                            StopReason.ERROR,
                            ReasonCode.INVALID_CONFIGURATION,
                        )
                    else:
                        self._by_id[r.id] = r
                        if r.deadline is not None:
                            self._with_deadline += 1
        for r in list(self._by_id.values()):
            self._finish(r, GenerationOutcome.CANCELLED, StopReason.CANCELLED)
        if not self._batch_freed:
            self._batch_freed = True
            self._llama.llama_batch_free(self._batch)
