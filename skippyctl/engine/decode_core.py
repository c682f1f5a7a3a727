"""The decode thread's work in the batch engine: lanes, batch stepping, sampling, terminals.

:class:`DecodeCore` is the llama.cpp part of ``engine/generation.py``: it admits accepted requests
into lanes (decisions from ``engine/lanes.py``, applied to the KV here), builds and decodes one
``llama_batch`` per step, samples each lane's next token, streams its text and ends every request
through :meth:`DecodeCore.finish`, its single exit. Decode thread only — no locks here; the
thread, the inbox and the public entry points are :class:`~skippyctl.engine.generation.BatchEngine`.

Each step holds the next token of every decoding lane plus, if any request is prefilling, up to
``prefill_chunk_tokens`` prompt tokens in all, taken round-robin from the prefilling requests
(several short prompts start in the same step, as llama-server does), so a long prompt never
stalls running generations and generations never starve prefill. Logits are requested only
for each decoding lane's token and for the last prompt token of a prefill that completes in the
step (the batch itself is ``engine/batch.py``).

Session state files: :meth:`DecodeCore.export_sessions` writes idle sessions' KV sequences
(``llama_state_seq_get_data``) and :meth:`DecodeCore.restore_sessions` reads them back into free
lanes (``llama_state_seq_set_data``; llama.cpp refuses another lane count: one KV stream per
lane) — the file format and its checks are ``engine/kv_state.py``.

The memory API is ``llama_get_memory`` + ``llama_memory_seq_rm``/``_clear`` (the older
``llama_kv_self_*`` functions no longer exist in the bundled llama.cpp).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Final

from skippyctl.config.load_options import SpecMode
from skippyctl.engine import kv_state
from skippyctl.engine.batch import StepBatch
from skippyctl.engine.draft import DraftModel
from skippyctl.engine.lanes import (
    KvGeometry,
    Lane,
    LaneTable,
    PressureGauge,
    cache_result,
    common_prefix,
)
from skippyctl.engine.protocol_messages import (
    ComputeFailed,
    EngineMessage,
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenStarted,
    GenText,
    GenToken,
    Kv,
    KvChange,
    SessionChange,
    SessionChanged,
    StateExported,
    StateImported,
)
from skippyctl.engine.request_state import Phase, RequestBoard, RequestState
from skippyctl.engine.sampling import build_sampler_chain
from skippyctl.engine.speculation import (
    SPEC_OFF,
    AdaptiveWindow,
    ServingPlugins,
    SpecConfig,
)
from skippyctl.engine.text import (
    ChatTemplateError,
    Detokenizer,
    StopMatcher,
    apply_chat_template,
    model_chat_template,
    tokenize_at_most,
)
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import GenerationOutcome, ReasonCode
from skippyctl.plugins.builtin.ngram import NgramPlugin
from skippyctl.plugins.inprocess import InProcessPlugin

PREFILL_PROGRESS_INTERVAL_S: Final = 0.25
"""At most one GenPrefillProgress per request per interval, none for a shorter prefill."""
GEN_PROGRESS_INTERVAL_S: Final = 0.5
"""At most one GenProgress per request per interval (2 per second)."""
COPY_MIN_GAIN_TOKENS: Final = 16
"""Copy another lane's KV into a new request's lane only when it saves at least this many
prefill tokens (more for long lanes, see ``DecodeCore.__init__``)."""
DECODE_ABORTED: Final = 2
"""llama_decode's return value when the abort callback stopped it (llama.h)."""

DECODE_RETURN_REASONS: Final[dict[int, ReasonCode]] = {
    1: ReasonCode.CONTEXT_EXHAUSTED,  # no KV slot for the batch
    -1: ReasonCode.INVALID_CONFIGURATION,  # invalid input batch
    -2: ReasonCode.RESOURCE_ALLOCATION_FAILURE,  # a buffer (graph, KV update) failed to allocate
    -3: ReasonCode.INTERNAL_RUNTIME_FAILURE,  # the backend's compute failed
}
"""What a failed llama_decode's return value means (llama.h and llama-context.cpp of 0.3.36);
any other value is ``unknown_failure``."""

_ESSENTIAL_MESSAGES: Final = frozenset(
    {GenText, GenDone, StateExported, StateImported, ComputeFailed}
)
"""What the host needs to serve a request; with ``observations=False`` nothing else is sent."""
_COMPLETED: Final = GenerationOutcome.COMPLETED
_FAILED: Final = GenerationOutcome.FAILED
_CANCELLED: Final = GenerationOutcome.CANCELLED


class DecodeCore:
    """Requests, lanes and the batch of one llama.cpp context (see the module docstring).

    ``emit`` gets every message; ``released`` is called for each request as it ends, just before
    its ``GenDone`` is emitted. The core owns its ``llama_batch`` and sampler chains, not the
    model or context.
    """

    def __init__(
        self,
        llama: ModuleType,
        model: int | ctypes.c_void_p,
        context: Any,
        *,
        lanes: int,
        emit: Callable[[EngineMessage], None],
        released: Callable[[RequestState], None],
        prefill_chunk_tokens: int = 256,
        kv_pressure_high: float = 0.85,
        kv_pressure_low: float = 0.70,
        approaching_limit: float = 0.90,
        n_threads: int | None = None,
        observations: bool = True,
        token_observations: bool = False,
        speculation: SpecConfig = SPEC_OFF,
        plugins: ServingPlugins | None = None,
        draft: DraftModel | None = None,
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
        self._released = released
        # Benchmark baseline (serving events off): only text, terminals and session state
        # outcomes are sent.
        self._observations = observations
        self._token_observations = observations and token_observations
        self._lanes = LaneTable(lanes)
        self._vocab = llama.llama_model_get_vocab(model)
        self._n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        self._memory = llama.llama_get_memory(context)
        if not self._memory:
            raise ValueError("the context has no memory (KV cache): cannot generate with it")

        kv = KvGeometry.of(
            n_ctx=int(llama.llama_n_ctx(context)),
            n_ctx_seq=int(llama.llama_n_ctx_seq(context)),
            n_seq_max=n_seq_max,
            lanes=lanes,
        )
        self._unified = kv.unified
        self._ctx_per_lane = kv.tokens_per_lane
        self._cells_total = kv.cells_total
        # A copy moves a whole lane's KV stream (split KV) — about the cost of prefilling
        # 1/64 of the lane's cells on a CPU here —, so it must save more than that; with a
        # unified KV it only shares cells, which costs nothing.
        self._copied: list[Lane] = []
        """Lanes whose KV copy waits for the next llama_decode (``Lane.copy_pending``)."""
        self._copy_min_gain = (
            1 if kv.unified else max(COPY_MIN_GAIN_TOKENS, kv.tokens_per_lane // 64)
        )
        n_batch = int(llama.llama_n_batch(context))
        if n_batch <= lanes:
            raise ValueError(f"the context's n_batch ({n_batch}) must exceed lanes ({lanes})")
        # llama_decode refuses a batch over n_batch: a chunk plus every lane's next token and,
        # speculating, the step's proposals must fit.
        self._spec = speculation
        self._plugins = plugins
        """The model's serving plugins (sidecars): they see each request's lifecycle and
        committed tokens and, with ``--spec plugin``, propose; a failing plugin never fails a
        request."""
        self.plugin_failures = 0
        """Calls into serving plugins or a proposer that raised (counted; the request carries
        on)."""
        # Every mode proposes through the same calls (ServingPlugins): the sidecars' link, the
        # built-in n-gram plugin called in this process, or the draft model.
        self._ngram: InProcessPlugin | None = None
        """With ``--spec ngram``: the built-in n-gram plugin, in this process (the core owns it)."""
        self._local: InProcessPlugin | DraftModel | None = None
        """A proposer in this process, whose failures it counts itself."""
        self._proposals: ServingPlugins | None = None
        """Where this model's proposals come from; None: it does not speculate."""
        if speculation.mode is SpecMode.NGRAM:
            self._ngram = InProcessPlugin(NgramPlugin(), self._n_vocab)
            self._local = self._proposals = self._ngram
        elif speculation.mode is SpecMode.DRAFT and draft is not None:
            self._local = self._proposals = draft
        elif speculation.mode is SpecMode.PLUGIN:
            self._proposals = plugins
        streams: list[ServingPlugins] = [] if plugins is None else [plugins]
        if self._proposals is not None and self._proposals is not plugins:
            streams.append(self._proposals)
        self._streams = tuple(streams)
        """What sees each request's begin, committed deltas and end: the sidecars' link and the
        proposer, each once."""
        # A sidecar query costs a round trip, so the tail of a window that a step cut short
        # (see _propose) is kept as the next window; so is any run-ahead that was asked for.
        self._keep_cut_tail = speculation.mode is SpecMode.PLUGIN or speculation.runahead_tokens > 0
        slots = speculation.step_slots(lanes)
        if n_batch <= slots:
            raise ValueError(
                f"the context's n_batch ({n_batch}) must exceed the decoding slots ({slots})"
            )
        self._chunk = min(prefill_chunk_tokens, n_batch - slots)
        self._pressure = PressureGauge(self._cells_total, kv_pressure_high, kv_pressure_low)
        self._approaching_tokens = max(1, math.ceil(approaching_limit * self._ctx_per_lane))

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

        # One batch for the engine's lifetime: a chunk plus the decoding slots.
        self._batch = StepBatch(llama, self._chunk + slots)
        self._board = RequestBoard()
        self.emit_failures = 0

    # ---------------------------------------------------------------- properties

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    @property
    def context_tokens_per_lane(self) -> int:
        return self._ctx_per_lane

    @property
    def kv_unified(self) -> bool:
        return self._unified

    @property
    def proposal_failures(self) -> int:
        """Calls into the plugins or a proposer that raised, and failed calls and invalid
        answers inside an in-process proposer (the n-gram plugin, a draft decode): each cost
        only its proposals."""
        local = self._local.failures if self._local is not None else 0
        return self.plugin_failures + local

    # ---------------------------------------------------------------- messages

    def emit(self, message: EngineMessage) -> None:
        """Send ``message`` (unless observations are off and it is not essential); never raises."""
        if not self._observations and type(message) not in _ESSENTIAL_MESSAGES:
            return
        try:
            self._emit_fn(message)
        except Exception:  # noqa: BLE001 - a broken consumer must not kill the decode thread
            self.emit_failures += 1

    def _release_observations(self, r: RequestState) -> None:
        """Send the observations held back while the first token's text went out first."""
        for message in r.take_held():
            self.emit(message)

    def _emit_session(
        self, lane: Lane, session: str, event: SessionChange, reason: str | None = None
    ) -> None:
        self.emit(SessionChanged(session, event, lane.seq, len(lane.tokens), reason))

    # ---------------------------------------------------------------- the decode loop's calls

    def announce(self) -> None:
        """The first message of the decode thread: the KV it serves from."""
        self.emit(Kv(KvChange.INITIALIZED, 0, self._cells_total))

    def work(self) -> bool:
        """Deadlines, admission, then one decode step; False when there is no work."""
        board = self._board
        if board.with_deadline:
            for r in board.expired(time.monotonic()):
                self.finish(r, GenerationOutcome.TIMED_OUT, StopReason.TIMEOUT)
        if board.queue:
            self._admit()
        if board.prefilling or board.decoding:
            self._step()  # checks KV pressure itself
            return True
        # Requests may have ended outside a step (cancel, deadline, drop): report KV now, the
        # thread is about to sleep.
        self._check_pressure()
        return False

    def fail_running(self) -> None:
        """After a failure no request can be blamed for: fail the running requests, and any the
        failure left on no list (they would never get their GenDone)."""
        for r in (*self._board.running(), *self._board.orphans()):
            self.fail(r)

    def cancel(self, request_id: str) -> None:
        r = self._board.by_id.get(request_id)
        if r is not None:
            self.finish(r, _CANCELLED, StopReason.CANCELLED)

    def track(self, r: RequestState) -> None:
        """Count a valid request as live without starting it (at shutdown, to cancel it)."""
        self._board.track(r)

    def cancel_all(self) -> None:
        """End every live request with ``cancelled`` and free the batch (at shutdown, once)."""
        for r in list(self._board.by_id.values()):
            self.finish(r, _CANCELLED, StopReason.CANCELLED)
        self._batch.free()
        if self._ngram is not None:
            self._ngram.close()

    def refuse(self, r: RequestState, reason: ReasonCode) -> None:
        self.finish(r, _FAILED, StopReason.ERROR, reason)

    def accept(self, r: RequestState) -> None:
        """Validate, tokenize and queue a submitted request (or answer it at once)."""
        if r.error is not None:
            self.refuse(r, ReasonCode.INVALID_CONFIGURATION)
            return
        self._board.track(r)
        spec = r.spec
        try:
            if spec.messages is not None:
                text = apply_chat_template(self._llama, self._template, spec.messages)
            else:
                assert spec.prompt is not None  # validated: exactly one of prompt/messages
                text = spec.prompt
            prompt, counted = tokenize_at_most(
                self._llama, self._vocab, text, self._ctx_per_lane, add_special=self._add_bos
            )
        except (ChatTemplateError, ValueError, UnicodeError):
            self.refuse(r, ReasonCode.INVALID_CONFIGURATION)
            return
        except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
            self.refuse(r, ReasonCode.INTERNAL_RUNTIME_FAILURE)
            return
        if prompt is None:
            # Longer than a lane: refused before any lane or session is touched (no decode).
            r.prompt_count = counted
            self.refuse(r, ReasonCode.CONTEXT_EXHAUSTED)
            return
        r.prompt = prompt
        bias_outside_vocab = any(t >= self._n_vocab for t, _b in spec.sampling.logit_bias)
        if not r.prompt or bias_outside_vocab:
            self.refuse(r, ReasonCode.INVALID_CONFIGURATION)
            return
        self._board.queue.append(r)

    # ---------------------------------------------------------------- session state files

    def _state_geometry(self) -> kv_state.Geometry:
        return kv_state.Geometry(len(self._lanes), self._ctx_per_lane)

    def export_sessions(
        self,
        files: Mapping[str, str],
        budget_bytes: int,
        fingerprint: bytes,
        report_missing: bool = False,
    ) -> None:
        """Write the KV state of each idle session named in ``files`` (session → path), most
        recently used first, while the files fit in ``budget_bytes``; one ``StateExported``
        each. A session over the budget is not written (``reservation_exhausted``). With
        ``report_missing`` a named session without an idle lane holding KV gets a failed one
        (``invalid_configuration``); else it is left out (an unload names every session)."""
        llama = self._llama
        left = budget_bytes
        if report_missing:
            idle = {lane.session for lane in self._lanes.idle_sessions_mru()}
            for named in files:
                if named not in idle:
                    self._exported(
                        named, time.perf_counter(), 0, 0, ReasonCode.INVALID_CONFIGURATION
                    )
        for lane in self._lanes.idle_sessions_mru():
            session = lane.session
            if session is None or session not in files or lane.copy_pending:
                continue
            started = time.perf_counter()
            tokens = len(lane.tokens)
            size = int(llama.llama_state_seq_get_size(self._ctx, lane.seq))
            estimate = kv_state.file_bytes(tokens, size)
            if size <= 0:
                self._exported(session, started, tokens, 0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                continue
            if estimate > left:
                self._exported(session, started, tokens, estimate, ReasonCode.RESERVATION_EXHAUSTED)
                continue
            buffer = (ctypes.c_uint8 * size)()
            got = int(llama.llama_state_seq_get_data(self._ctx, buffer, size, lane.seq))
            if got <= 0 or got > size:
                self._exported(session, started, tokens, 0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                continue
            try:
                written = kv_state.write_state(
                    files[session],
                    fingerprint,
                    self._state_geometry(),
                    lane.tokens,
                    memoryview(buffer)[:got],
                )
            except OSError:
                self._exported(session, started, tokens, 0, ReasonCode.ARTIFACT_IO_FAILURE)
                continue
            left -= written
            self._exported(session, started, tokens, written, None)

    def _exported(
        self, session: str, started: float, tokens: int, size: int, reason: ReasonCode | None
    ) -> None:
        ms = round((time.perf_counter() - started) * 1000.0, 3)
        self.emit(StateExported(session, reason is None, tokens, size, ms, reason))

    def restore_sessions(
        self, files: Sequence[tuple[str, str]], max_bytes: int, fingerprint: bytes
    ) -> None:
        """Read each ``(session, path)`` back into a free lane (before any request): the
        session's next request reuses its tokens like any warm session's. One
        ``StateImported`` each, and ``session`` restored for each that worked; a refused file
        leaves its lane empty (that session just prefills again)."""
        llama = self._llama
        geometry = self._state_geometry()
        for session, path in files:
            started = time.perf_counter()
            if self._lanes.has_session(session):
                continue  # named twice: the first one won
            lane = self._lanes.restore_lane()
            if lane is None:
                self._imported(session, started, 0, 0, ReasonCode.RESERVATION_EXHAUSTED)
                continue
            try:
                saved = kv_state.read_state(path, fingerprint, self._ctx_per_lane, max_bytes)
            except kv_state.StateRefused as refused:
                self._imported(session, started, 0, 0, refused.reason)
                continue
            size = kv_state.file_bytes(len(saved.tokens), len(saved.state))
            if saved.geometry.lanes != geometry.lanes or any(
                t < 0 or t >= self._n_vocab for t in saved.tokens
            ):
                # Another lane layout (llama.cpp keeps one KV stream per lane) or another
                # vocabulary: not this context's state.
                self._imported(
                    session, started, 0, size, ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                )
                continue
            state = (ctypes.c_uint8 * len(saved.state)).from_buffer_copy(saved.state)
            read = int(llama.llama_state_seq_set_data(self._ctx, state, len(saved.state), lane.seq))
            if read != len(saved.state):
                with contextlib.suppress(Exception):
                    llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)
                self._imported(
                    session, started, 0, size, ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                )
                continue
            self._lanes.bind_restored(lane, session, saved.tokens, time.monotonic())
            self._imported(session, started, len(saved.tokens), size, None)
            self._emit_session(lane, session, SessionChange.RESTORED)
        self._check_pressure()

    def _imported(
        self, session: str, started: float, tokens: int, size: int, reason: ReasonCode | None
    ) -> None:
        ms = round((time.perf_counter() - started) * 1000.0, 3)
        self.emit(StateImported(session, reason is None, tokens, size, ms, reason))

    def drop(self, session: str, reason: str) -> None:
        lane = self._lanes.drop(session)
        if lane is None:
            return
        self._emit_session(lane, session, SessionChange.EVICTED, reason)
        if lane.request_id is None:
            self._clear_lane(lane)
        # else: the running request finishes normally; its lane is cleared then (no session).
        self._check_pressure()

    def _admit(self) -> None:
        """Move queued requests into lanes, FIFO among the requests that can run now.

        A request whose session is busy in its lane waits without blocking the ones behind it.
        """
        lanes = self._lanes
        if lanes.all_busy():
            return
        queue = self._board.queue
        waiting: list[RequestState] = []
        while queue:
            r = queue.popleft()
            try:
                session = r.spec.session
                pick = lanes.pick(session, r.prompt)
                if pick is None:
                    waiting.append(r)
                    if session is None or not lanes.has_session(session):
                        break  # no lane at all: nobody behind can run either
                    continue
                if pick.displaced is not None:
                    self._emit_session(
                        pick.lane, pick.displaced, SessionChange.EVICTED, "lane_needed"
                    )
                self._start(r, pick.lane)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                self.fail(r)
        queue.extendleft(reversed(waiting))

    def _start(self, r: RequestState, lane: Lane) -> None:
        """Bind ``r`` to ``lane``: reuse the session prefix, build the sampler, start prefill."""
        r.lane = lane
        session = r.spec.session
        prompt = r.prompt
        claim = self._lanes.claim(lane, r.id, session, prompt)
        keep = claim.keep
        donor = self._lanes.donor(lane, prompt, keep, self._copy_min_gain)
        if donor is not None:
            # Whole-lane copy (llama.cpp copies a split KV's stream only whole: p0/p1 = -1,
            # anything else aborts), done at the next llama_decode; the tail is trimmed below.
            self._llama.llama_memory_seq_cp(self._memory, donor.seq, lane.seq, -1, -1)
            lane.tokens = donor.tokens[:]
            lane.copy_pending = True
            self._copied.append(lane)
            keep = min(common_prefix(lane.tokens, prompt), len(prompt) - 1)
        if keep == 0:
            self._clear_lane(lane)
        elif keep < len(lane.tokens):
            if not self._llama.llama_memory_seq_rm(self._memory, lane.seq, keep, -1):
                # Partial removal unsupported (e.g. recurrent memory): start over.
                self._clear_lane(lane)
                keep = 0
            del lane.tokens[keep:]
        r.reused = keep
        if claim.change is not None:
            assert session is not None
            self._emit_session(lane, session, claim.change)
        params = r.spec.sampling
        r.sampler = build_sampler_chain(self._llama, self._vocab, params)
        if params.penalizes:
            r.sampler.accept(prompt[-params.repeat_last_n :])
        r.detok = Detokenizer(self._llama, self._vocab, self._pieces)
        r.stops = StopMatcher(r.spec.stop)
        if self._proposals is not None:
            r.window = AdaptiveWindow()
        if self._streams:
            r.plugin_commits = []
            for plugins in self._streams:
                self._to_plugins(plugins.begin, r.id, session, prompt, r.reused)
        r.prefill_pos = r.reused
        r.phase = Phase.PREFILL
        now = time.monotonic()
        r.t_prefill_start = r.t_prefill_progress = now
        self._board.prefilling.append(r)
        cache = cache_result(session is not None, keep, len(prompt))
        self.emit(GenStarted(r.id, lane.seq, session, len(prompt), r.reused, cache))

    def _step(self) -> None:
        """One llama_decode: every decoding lane's next token + prefill chunks."""
        board = self._board
        decoding = board.decoding
        chunks = self._prefill_chunks()
        if self._spec.enabled:
            self._propose(decoding)
        participants = self._batch.fill(decoding, chunks)
        n_seqs = len(participants)
        if n_seqs > 1:
            for r in participants:
                r.shared_decode_steps += 1
                if n_seqs > r.max_batch:
                    r.max_batch = n_seqs
        else:
            for r in participants:
                if r.max_batch < 1:
                    r.max_batch = 1

        result = self._batch.decode(self._ctx)
        if self._copied:  # llama_decode performed the pending KV copies first
            for copied in self._copied:
                copied.copy_pending = False
            self._copied.clear()
        now = time.monotonic()
        if result != 0:
            self._decode_failed(participants, aborted=result == DECODE_ABORTED, result=result)
            return

        # The batch is in the KV now: mirror it.
        for r in decoding:
            lane = r.lane
            assert lane is not None
            lane.tokens.append(r.pending_token)
        for prefill, take in chunks:
            self._prefilled(prefill, take, now)

        for r in list(decoding):
            if r.out_index < 0:
                continue
            try:
                self._on_logits(r, now)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                self.fail(r)
        if self._streams:
            for r in decoding:  # the ones still running: an ended one handed its tokens over
                self._hand_commits(r)
        self._check_pressure()

    def _to_plugins(self, call: Callable[..., object], *args: object) -> None:
        """One call into the plugins' link; its failure is counted, never the request's."""
        try:
            call(*args)
        except Exception:  # noqa: BLE001 - a plugin can lose only its own observations
            self.plugin_failures += 1

    def _hand_commits(self, r: RequestState) -> None:
        """The tokens ``r`` committed since the last hand-over, as one delta."""
        pending = r.plugin_commits
        if pending:
            r.plugin_commits = []
            for plugins in self._streams:
                self._to_plugins(plugins.commit, r.id, pending)

    def _prefill_chunks(self) -> list[tuple[RequestState, int]]:
        """This step's prompt chunks: up to ``prefill_chunk_tokens`` tokens in all, taken
        round-robin from the prefilling requests — so requests that arrive together start
        together (each short prompt whole, in one step), and a long prompt never stalls the
        running generations for more than one chunk's worth of compute."""
        prefilling = self._board.prefilling
        budget = self._chunk
        chunks: list[tuple[RequestState, int]] = []
        for _ in range(len(prefilling)):
            if budget <= 0:
                break
            r = prefilling.popleft()
            take = min(budget, len(r.prompt) - r.prefill_pos)
            chunks.append((r, take))
            budget -= take
            if r.prefill_pos + take < len(r.prompt):
                prefilling.append(r)  # round-robin: its next chunk comes after the others'
        return chunks

    def _prefilled(self, prefill: RequestState, take: int, now: float) -> None:
        """Mirror a decoded prompt chunk; report progress, or move a complete prompt to decode."""
        lane = prefill.lane
        assert lane is not None
        lane.tokens.extend(prefill.prompt[prefill.prefill_pos : prefill.prefill_pos + take])
        prefill.prefill_pos += take
        if prefill.out_index < 0:
            if now - prefill.t_prefill_progress >= PREFILL_PROGRESS_INTERVAL_S:
                prefill.t_prefill_progress = now
                self.emit(
                    GenPrefillProgress(
                        prefill.id,
                        prefill.prefill_pos - prefill.reused,
                        len(prefill.prompt) - prefill.reused,
                    )
                )
            return
        prefill.t_prefill_end = now
        prefill.held_observations.append(
            GenPrefillDone(
                prefill.id,
                prefill.prefill_pos - prefill.reused,
                round((now - prefill.t_prefill_start) * 1000.0, 3),
            )
        )
        prefill.phase = Phase.DECODE
        self._board.decoding.append(prefill)

    def _propose(self, decoding: list[RequestState]) -> None:
        """Each decoding lane's proposals for this step, as many as its window, its lane's
        context and its ``max_tokens`` leave room for (every committed proposal and the token
        sampled after the last one count): the run-ahead of its last answer when that still
        holds, else one query to the proposer for all the lanes that need one."""
        limit = self._spec.lane_limit(len(decoding))
        wants: dict[str, int] = {}
        for r in decoding:
            window = r.window
            lane = r.lane
            if window is None or lane is None:
                continue
            # pending_token goes to len(lane.tokens); proposals to the positions after it.
            room = min(
                limit,
                window.window,
                self._ctx_per_lane - len(lane.tokens) - 1,
                r.spec.max_tokens - r.generated_tokens - 1,
            )
            if room <= 0:
                r.draft = []
            elif r.runahead:  # the last answer's next window still holds: no query
                r.draft, r.runahead = r.runahead[:room], r.runahead[room:]
            else:
                wants[r.id] = room
        if wants:
            self._ask(decoding, wants)
        if not self._unified and len(decoding) > 1:
            # With one KV stream per lane llama.cpp cuts a batch into micro-batches that take
            # the same number of tokens from each sequence (split_equal): lanes with longer
            # windows than others would cost whole extra forward passes. So every lane
            # verifies as many proposals as the one with the fewest (none if one has none).
            shortest = min(len(r.draft) for r in decoding)
            keep_tail = self._keep_cut_tail
            for r in decoding:
                if len(r.draft) > shortest:
                    if keep_tail:  # the cut tail still follows the shorter window: run-ahead
                        r.runahead = r.draft[shortest:] + r.runahead
                    r.draft = r.draft[:shortest]

    def _ask(self, decoding: list[RequestState], wants: dict[str, int]) -> None:
        """The proposer's proposals for this step's lanes (a sidecar's waited for at most their
        deadline; a late answer proposes nothing and is counted on the request)."""
        proposals = self._proposals
        assert proposals is not None
        ahead = self._spec.runahead_tokens
        try:
            answers = proposals.propose({rid: room + ahead for rid, room in wants.items()})
            late = proposals.late()
        except Exception:  # noqa: BLE001 - no proposal is the worst a proposer can do
            self.plugin_failures += 1
            return
        for r in decoding:
            room = wants.get(r.id)
            if room is None:
                continue
            if r.id in late:
                r.spec_late += 1
            answer = answers.get(r.id, [])
            # Past the window: the token expected after it, then the next window (run-ahead).
            r.draft, r.runahead = answer[:room], answer[room:]

    def _sample(self, r: RequestState, index: int) -> int:
        sampler = r.sampler
        assert sampler is not None
        return int(self._llama.llama_sampler_sample(sampler.pointer, self._ctx, index))

    def _on_logits(self, r: RequestState, now: float) -> None:
        """Sample ``r``'s next token from this step's logits and stream its text; with
        proposals, verify them: commit position after position while the sampled token is the
        proposed one (the sampler saw the same logits as without them), then drop the KV of the
        proposals that were not committed."""
        index = r.out_index
        r.out_index = -1
        draft = r.draft
        if not draft:
            token = self._sample(r, index)
            if self._commit(r, token, now) and r.runahead:
                self._verify_runahead(r, token, whole=True)
            return
        r.draft = []
        lane = r.lane
        assert lane is not None
        kv_end = len(lane.tokens) + len(draft)  # the pending token is in lane.tokens already
        accepted = 0
        running = True
        # Counted before the commits: a commit may end the request, and its terminal (the
        # receipt) is made right then.
        r.spec_windows += 1
        r.spec_proposed += len(draft)
        for offset in range(len(draft) + 1):
            token = self._sample(r, index + offset)
            matches = offset < len(draft) and token == draft[offset]
            if matches:
                r.spec_accepted += 1
            if not self._commit(r, token, now):
                running = False
                break
            if matches:
                lane.tokens.append(token)  # decoded in this step already: not pending
                accepted += 1
                continue
            break
        if running and r.runahead:
            self._verify_runahead(r, token, whole=accepted == len(draft))
        if r.window is not None:
            r.window.verified(len(draft), accepted, self._spec.draft_tokens)
        if self._proposals is not None:
            self._to_plugins(self._proposals.outcome, r.id, len(draft), accepted)
        if len(lane.tokens) < kv_end:
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, len(lane.tokens), -1)

    def _verify_runahead(self, r: RequestState, token: int, whole: bool) -> None:
        """Keep ``r``'s run-ahead proposals as its next window when its window verified
        ``whole`` and ``token`` (sampled after it, now pending) is the one they expected;
        otherwise they are stale: dropped unexecuted and counted."""
        if whole and r.runahead[0] == token:
            del r.runahead[0]
            return
        r.spec_discarded += len(r.runahead)
        r.runahead = []

    def _commit(self, r: RequestState, token: int, now: float) -> bool:
        """One sampled token of ``r``: end it (end of generation, a stop string, max_tokens,
        a full lane) or stream its text and make it the pending token. False once ``r`` ended."""
        llama = self._llama
        r.sampled += 1
        if self._token_observations:
            # Opt-in debug evidence: the token's ordinal and timing only, never the token.
            step_ms = round((now - (r.t_last or r.submitted)) * 1000.0, 3)
            self.emit(GenToken(r.id, r.sampled - 1, step_ms))
        r.t_last = now
        if r.sampled == 1:
            r.t_first = r.t_progress = now
            ttft_ms = round((now - r.submitted) * 1000.0, 3)
            r.held_observations.append(GenFirstToken(r.id, ttft_ms))
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        if eog:
            self.finish(r, _COMPLETED, StopReason.EOS)
            return False
        r.generated_tokens += 1
        if r.plugin_commits is not None:
            r.plugin_commits.append(token)
        detok = r.detok
        stops = r.stops
        assert detok is not None
        assert stops is not None
        text = detok.push(token)
        if stops.active:
            text, stopped = stops.push(text)
            if stopped:
                if text:
                    self.emit(GenText(r.id, text))
                self.finish(r, _COMPLETED, StopReason.STOP_STRING)
                return False
        # A finishing request sends this token's text together with the flushed tail (one
        # GenText per request per step).
        if r.generated_tokens >= r.spec.max_tokens:
            self.finish(r, _COMPLETED, StopReason.LENGTH, text=text)
            return False
        lane = r.lane
        assert lane is not None
        used = len(lane.tokens)
        if used >= self._ctx_per_lane:
            # The sampled token has no cell left to be decoded into.
            self.finish(r, _COMPLETED, StopReason.LENGTH, ReasonCode.CONTEXT_EXHAUSTED, text=text)
            return False
        if text:
            self.emit(GenText(r.id, text))
        if r.held_observations:
            self._release_observations(r)
        if now - r.t_progress >= GEN_PROGRESS_INTERVAL_S:
            r.t_progress = now
            self.emit(GenProgress(r.id, r.generated_tokens))
        r.pending_token = token
        if not r.approaching_sent and used + 1 >= self._approaching_tokens:
            r.approaching_sent = True
            self.emit(Kv(KvChange.APPROACHING_LIMIT, used + 1, self._ctx_per_lane, r.id))
        return True

    def _decode_failed(
        self, participants: list[RequestState], aborted: bool = False, result: int | None = None
    ) -> None:
        """llama_decode refused or failed: the requests in that batch fail (or, when the native
        abort callback stopped it, are cancelled); the engine goes on. A failure (not an abort)
        is reported first as ``ComputeFailed`` with its return value's reason."""
        if not aborted and result is not None:
            reason = DECODE_RETURN_REASONS.get(result, ReasonCode.UNKNOWN_FAILURE)
            self.emit(ComputeFailed(result, reason, len(participants)))
        for r in list(participants):
            self.fail(r, aborted)

    def fail(self, r: RequestState, aborted: bool = False) -> None:
        """Fail ``r`` with internal_runtime_failure (cancelled when ``aborted``) and reset its
        lane to an empty KV.

        After an error the lane's KV may hold part of a batch, so it is not trusted: a session
        keeps its lane with no tokens (``session`` trimmed, tokens 0).
        """
        lane = r.lane
        if aborted:
            self.finish(r, _CANCELLED, StopReason.CANCELLED, ReasonCode.CANCELLATION)
        else:
            self.refuse(r, ReasonCode.INTERNAL_RUNTIME_FAILURE)
        if lane is None or lane.request_id is not None:
            return
        lane.tokens.clear()
        # Best effort: keep serving the other lanes whatever happens here.
        with contextlib.suppress(Exception):
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)
        if lane.session is not None:
            self._emit_session(lane, lane.session, SessionChange.TRIMMED)

    def finish(
        self,
        r: RequestState,
        outcome: GenerationOutcome,
        stop_reason: StopReason,
        reason: ReasonCode | None = None,
        *,
        text: str = "",
    ) -> None:
        """The single exit of every request: flush text, free, release the lane, GenDone.

        ``text`` is completion text not yet sent (the last token's); it goes out in the same
        GenText as the flushed tail. A stop-string or failed ending flushes nothing: held-back
        text of a stop is cut, and a failure's text is not trusted.
        """
        if r.phase is Phase.DONE:
            return
        phase = r.phase
        r.phase = Phase.DONE
        try:
            if (
                stop_reason is not StopReason.STOP_STRING
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
                self.emit(GenText(r.id, text))
        except Exception:  # noqa: BLE001 - the terminal below must still be sent
            pass
        self._release_observations(r)
        board = self._board
        board.unlist(r, phase)
        if r.sampler is not None:
            r.sampler.close()
        lane = r.lane
        if lane is not None and (
            self._lanes.release(lane, time.monotonic()) or (self._unified and lane.session is None)
        ):
            try:
                self._clear_lane(lane)
            except Exception:  # noqa: BLE001 - the terminal below must still be sent
                lane.tokens.clear()
        board.untrack(r)
        message = r.done_message(outcome, stop_reason, reason)
        if r.plugin_commits is not None:
            self._plugins_end(r, message)
        self._released(r)
        self.emit(message)

    def _plugins_end(self, r: RequestState, done: GenDone) -> None:
        """The plugins' last word on ``r``: its stop reason and figures when it completed (the
        final committed suffix goes with them), else an abort with the reason."""
        self._hand_commits(r)
        r.plugin_commits = None
        if done.outcome is not _COMPLETED:
            # The plugin ABI's abort reasons are the stop reasons cancelled/timeout/error.
            stop = done.stop_reason
            reason = stop.value if stop in (StopReason.CANCELLED, StopReason.TIMEOUT) else "error"
            for plugins in self._streams:
                self._to_plugins(plugins.abort, r.id, reason)
            return
        for plugins in self._streams:
            self._to_plugins(plugins.finish, r.id, done.stop_reason, done.figures)

    def _clear_lane(self, lane: Lane) -> None:
        if lane.tokens:
            lane.tokens.clear()
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)

    def _check_pressure(self) -> None:
        """Report a pressure crossing (hysteresis in :class:`PressureGauge`); with a unified KV a
        crossing first evicts idle sessions, which may clear it at once."""
        used = self._lanes.cells_used()
        change = self._pressure.observe(used)
        if change is None:
            return
        total = self._cells_total
        self.emit(Kv(change, used, total))
        if change is KvChange.PRESSURE_CROSSED and self._unified:
            used = self._relieve_pressure(used)
            cleared = self._pressure.observe(used)
            if cleared is not None:
                self.emit(Kv(cleared, used, total))

    def _relieve_pressure(self, used: int) -> int:
        """Unified KV only: idle warm sessions share the pool (and widen every attention window),
        so evict them least recently used first until usage is back at the low mark.

        With a split KV each lane has its own reserved cells and evicting frees nothing others
        can use, so warm sessions are kept.
        """
        for lane in self._lanes.idle_sessions_lru():
            if self._pressure.relieved(used):
                break
            used -= len(lane.tokens)
            session = self._lanes.evict(lane)
            self._emit_session(lane, session, SessionChange.EVICTED, "pressure")
            self._clear_lane(lane)
        return used
