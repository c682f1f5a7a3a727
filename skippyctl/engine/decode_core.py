"""The decode thread's work in the batch engine: admission, batch stepping, sampling, terminals.

:class:`DecodeCore` is the llama.cpp part of ``engine/generation.py``: it admits accepted requests
into lanes, builds and decodes one ``llama_batch`` per step, samples each lane's next token,
streams its text and ends every request through :meth:`DecodeCore.finish`, its single exit.
Decode thread only — no locks here; the thread, the inbox and the public entry points are
:class:`~skippyctl.engine.generation.BatchEngine`. Its other jobs are collaborators it holds:
``engine/request_intake.py`` (prompt tokens, sampler and text tools), ``engine/lane_kv.py``
(``engine/lanes.py``'s decisions applied to the KV, pressure), ``engine/proposals.py``
(speculation's proposals and their verification, the plugins' stream of each request) and
``engine/session_files.py`` (session state files).

Each step holds the next token of every decoding lane plus, if any request is prefilling, up to
``prefill_chunk_tokens`` prompt tokens in all (the context's ``n_ubatch`` unless told), taken
round-robin from the prefilling requests (several short prompts start in the same step, as
llama-server does), so a long prompt never stalls running generations and generations never
starve prefill. One exception, with one KV stream per lane: prompts that all complete in a step
go alone when the decoding lanes would add a forward pass to it (``_prompts_first``). Logits are
requested only for each decoding lane's token and for the last prompt token of a prefill that
completes in the step (the batch itself is ``engine/batch.py``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from skippyctl.config.stream_wire import SocketChunks
from skippyctl.engine.batch import StepBatch, forward_passes, sequence_of
from skippyctl.engine.draft import DraftModel
from skippyctl.engine.lane_kv import LaneKv
from skippyctl.engine.lanes import KvGeometry, Lane, cache_result
from skippyctl.engine.logprobs import token_logprob
from skippyctl.engine.proposals import Proposals
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
    StateExported,
    StateImported,
)
from skippyctl.engine.request_intake import RequestIntake
from skippyctl.engine.request_state import Phase, RequestBoard, RequestState
from skippyctl.engine.session_files import SessionFiles
from skippyctl.engine.speculation import SPEC_OFF, ServingPlugins, SpecConfig
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import GenerationOutcome, ReasonCode
from skippyctl.plugins.api import ActivationContext

PREFILL_PROGRESS_INTERVAL_S: Final = 0.25
"""At most one GenPrefillProgress per request per interval, none for a shorter prefill."""
GEN_PROGRESS_INTERVAL_S: Final = 0.5
"""At most one GenProgress per request per interval (2 per second)."""
DECODE_ABORTED: Final = 2
"""llama_decode's return value when the abort callback stopped it (llama.h)."""

DECODE_RETURN_REASONS: Final[dict[int, ReasonCode]] = {
    1: ReasonCode.CONTEXT_EXHAUSTED,  # no KV slot for the batch
    -1: ReasonCode.INVALID_CONFIGURATION,  # invalid input batch
    -2: ReasonCode.OUT_OF_MEMORY,  # a buffer (graph, KV update) failed to allocate
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


GATHER_AFTER_END_S: Final = 0.2
"""Requests that ended this long before a new one arrived at an idle engine count as sessions
that may be coming back (``DecodeCore._gathering``); so does, in a step, one that ended this
long before it (``DecodeCore._arrival_may_wait``)."""
GATHER_WAIT_S: Final = 0.004
"""The most an idle engine holds the first of them for the others: about what the host takes
for each request, far below one prefill step."""
CONCURRENT_ARRIVALS_S: Final = 10.0
"""How long after a request started beside decoding lanes another is expected to: meanwhile a
step with a lane free, taken soon after a generation ended, verifies no proposals (spec_gate,
"Bound"); one client's requests, each after the last, never start beside decoding lanes and
keep whole windows."""


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
        prefill_chunk_tokens: int | None = None,
        kv_pressure_high: float = 0.85,
        kv_pressure_low: float = 0.70,
        approaching_limit: float = 0.90,
        n_threads: int | None = None,
        observations: bool = True,
        token_observations: bool = False,
        speculation: SpecConfig = SPEC_OFF,
        plugins: ServingPlugins | None = None,
        draft: DraftModel | None = None,
        chat_template: str | None = None,
        plugin_activation: ActivationContext | None = None,
    ) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        n_seq_max = int(llama.llama_n_seq_max(context))
        if lanes > n_seq_max:
            raise ValueError(f"lanes ({lanes}) exceeds the context's n_seq_max ({n_seq_max})")
        if prefill_chunk_tokens is None:
            # llama-server fills a batch with prompt and llama_decode splits it in n_ubatch
            # pieces: a prompt chunked the same way is the same computation, so a greedy reply
            # is the same text (chunks of another size round differently and can tip a near tie).
            prefill_chunk_tokens = int(llama.llama_n_ubatch(context))
        if prefill_chunk_tokens < 1:
            raise ValueError("prefill_chunk_tokens must be >= 1")
        if not 0.0 < kv_pressure_low < kv_pressure_high <= 1.0:
            raise ValueError("need 0 < kv_pressure_low < kv_pressure_high <= 1")
        if not 0.0 < approaching_limit <= 1.0:
            raise ValueError("approaching_limit must be in (0, 1]")
        self._llama = llama
        self._ctx = context
        self._emit_fn = emit
        self._released = released
        # Benchmark baseline (serving events off): only text, terminals and session state
        # outcomes are sent.
        self._observations = observations
        self._token_observations = observations and token_observations
        geometry = KvGeometry.of(
            n_ctx=int(llama.llama_n_ctx(context)),
            n_ctx_seq=int(llama.llama_n_ctx_seq(context)),
            n_seq_max=n_seq_max,
            lanes=lanes,
        )
        self._kv = LaneKv(
            llama,
            context,
            geometry,
            lanes=lanes,
            pressure_high=kv_pressure_high,
            pressure_low=kv_pressure_low,
            emit=self.emit,
        )
        self._lanes = self._kv.table
        self._unified = geometry.unified
        self._ctx_per_lane = geometry.tokens_per_lane
        n_batch = int(llama.llama_n_batch(context))
        if n_batch <= lanes:
            raise ValueError(f"the context's n_batch ({n_batch}) must exceed lanes ({lanes})")
        # llama_decode refuses a batch over n_batch: every lane's next token and, speculating,
        # the step's proposals must fit, and so must a chunk beside the lanes' tokens (and
        # their proposals, in a mode that verifies some in a step with a chunk).
        speculation = speculation.within_batch(n_batch, lanes)
        self._spec = speculation
        slots = speculation.step_slots(lanes)
        if n_batch <= slots:
            raise ValueError(
                f"the context's n_batch ({n_batch}) must exceed the decoding slots ({slots})"
            )
        beside_chunk = speculation.beside_chunk(lanes)
        self._chunk = min(prefill_chunk_tokens, n_batch - beside_chunk)
        self._approaching_tokens = max(1, math.ceil(approaching_limit * self._ctx_per_lane))

        # Decode and batch threads: every core by default (``n_threads`` overrides, e.g. to
        # leave a core to the host). Set here so the engine does not depend on how the context
        # was created.
        threads = n_threads if n_threads is not None else max(1, os.cpu_count() or 1)
        if threads < 1:
            raise ValueError("n_threads must be >= 1")
        llama.llama_set_n_threads(context, threads, threads)
        self._intake = RequestIntake(
            llama, model, tokens_per_lane=self._ctx_per_lane, chat_template=chat_template
        )
        self._vocab = self._intake.vocab
        self._n_vocab = self._intake.n_vocab
        self._eog: dict[int, bool] = {}

        # The model's serving plugins (sidecars) see each request's lifecycle and committed
        # tokens and, with ``--spec plugin``, propose; a failing plugin never fails a request.
        self._proposals = Proposals(
            speculation,
            plugins,
            draft,
            n_vocab=self._intake.n_vocab,
            kv=self._kv,
            sample=self._sample,
            commit=self._commit,
            emit=self.emit,
            activation=plugin_activation,
        )
        self._streams = self._proposals.streams
        self.session_files = SessionFiles(
            llama, context, self._kv, n_vocab=self._intake.n_vocab, emit=self.emit
        )
        """Session state files out and in, on the decode thread (``BatchEngine``'s inbox)."""
        # One batch for the engine's lifetime: a step's decoding slots, or a chunk beside the
        # lanes' tokens, whichever is more.
        self._batch = StepBatch(llama, max(slots, self._chunk + beside_chunk))
        self._board = RequestBoard()
        self._steps = 0
        """Decode steps so far (which step generations ended in)."""
        self._concurrent_start = -math.inf
        """When a request last started while other lanes were decoding (monotonic s)."""
        self._ended: list[tuple[int, float]] = []
        """The step and time at which generations ended lately (for gathering the sessions
        that come back)."""
        self.gather_until: float | None = None
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
        """Failed calls into the plugins or a proposer (``Proposals.failures``)."""
        return self._proposals.failures

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

    # ---------------------------------------------------------------- the decode loop's calls

    def announce(self) -> None:
        """The first message of the decode thread: the KV it serves from."""
        self.emit(Kv(KvChange.INITIALIZED, 0, self._kv.cells_total))

    def work(self) -> bool:
        """Deadlines, admission, then one decode step; False when there is no work."""
        board = self._board
        if board.with_deadline:
            for r in board.expired(time.monotonic()):
                self.finish(r, GenerationOutcome.TIMED_OUT, StopReason.TIMEOUT)
        if board.queue:
            self._admit()
        self.gather_until = None
        if board.prefilling and not board.decoding and self._gathering():
            return False
        if board.prefilling or board.decoding:
            self._step()  # checks KV pressure itself
            return True
        # Requests may have ended outside a step (cancel, deadline, drop): report KV now, the
        # thread is about to sleep.
        self._kv.check_pressure()
        return False

    def _gathering(self) -> bool:
        """Whether an idle engine waits a moment before prefilling what arrived: when several
        generations ended in the same step just before and fewer requests have come since, the
        rest are on their way (sessions in lockstep), and one step for all beats a step for the
        first."""
        first = min(r.submitted for r in self._board.prefilling)
        lately = [step for step, t in self._ended if first - GATHER_AFTER_END_S <= t <= first]
        # Together: in the last step that ended any (one after another is a lone client).
        ended = [step for step in lately if step == lately[-1]]
        if len(ended) < 2 or len(self._board.prefilling) + len(self._board.queue) >= len(ended):
            return False
        until = first + GATHER_WAIT_S
        if time.monotonic() >= until:
            return False
        self.gather_until = until
        return True

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
        self._proposals.close()

    def refuse(self, r: RequestState, reason: ReasonCode, detail: str | None = None) -> None:
        self.finish(r, _FAILED, StopReason.ERROR, reason, detail=detail)

    def prepare(self, r: RequestState) -> None:
        """Tokenize a submitted request, on the thread that submits it (``request_intake``)."""
        if r.error is None:
            self._intake.prepare(r)

    def accept(self, r: RequestState) -> None:
        """Queue a prepared request (or answer it at once)."""
        if r.error is not None:
            self.refuse(r, ReasonCode.INVALID_CONFIGURATION)
            return
        self._board.track(r)
        if r.refusal is not None:
            self.refuse(r, *r.refusal)
            return
        self._board.queue.append(r)

    def drop(self, session: str, reason: str) -> None:
        self._kv.drop(session, reason)

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
                    self._kv.emit_session(
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
        r.reused = keep = self._kv.reuse(lane, prompt, claim.keep)
        if claim.change is not None:
            assert session is not None
            self._kv.emit_session(lane, session, claim.change)
        self._intake.equip(r)
        self._proposals.begin(r, session, prompt)
        r.prefill_pos = r.reused
        r.phase = Phase.PREFILL
        now = time.monotonic()
        r.t_prefill_start = r.t_prefill_progress = now
        if self._board.decoding:
            self._concurrent_start = now
        self._board.prefilling.append(r)
        cache = cache_result(session is not None, keep, len(prompt))
        self.emit(GenStarted(r.id, lane.seq, session, len(prompt), r.reused, cache))

    def _step(self) -> None:
        """One llama_decode: every decoding lane's next token + prefill chunks."""
        self._steps += 1
        board = self._board
        decoding = board.decoding
        chunks = self._prefill_chunks()
        stepping = [] if self._prompts_first(decoding, chunks) else decoding
        if self._spec.enabled and stepping:
            self._proposals.propose(stepping, chunks, self._arrival_may_wait())
        participants = self._batch.fill(stepping, chunks)
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

        started = time.perf_counter()
        result = self._batch.decode(self._ctx)
        self._kv.copies_done()
        if self._spec.gated:
            self._proposals.stepped(time.perf_counter() - started)
        now = time.monotonic()
        if result != 0:
            self._decode_failed(participants, aborted=result == DECODE_ABORTED, result=result)
            return

        # The batch is in the KV now: mirror it.
        for r in stepping:
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
                self._proposals.hand_commits(r)
        self._kv.check_pressure()

    def _arrival_may_wait(self) -> bool:
        """Whether a request is due during this step and would wait for it: a lane is free, a
        generation ended lately (its client's next request is on its way: a chat's next turn)
        and requests came lately while others decoded. Measured at 4 sessions (the real model,
        ``benchmarks/concurrent.py``): windows there, even cut to half a plain step, made later
        turns' first tokens 16 % slower than none (58.1 against 49.9 ms; unbounded: 2.3×)."""
        now = time.monotonic()
        if now - self._concurrent_start >= CONCURRENT_ARRIVALS_S or self._lanes.all_busy():
            return False
        ended = self._ended
        return bool(ended) and now - ended[-1][1] < GATHER_AFTER_END_S

    def _prompts_first(
        self, decoding: list[RequestState], chunks: list[tuple[RequestState, int]]
    ) -> bool:
        """Whether this step decodes the prompt chunks alone, the decoding lanes waiting one step.

        With one KV stream per lane a step costs a forward pass per micro-batch
        (:func:`forward_passes`): three 2-token prompts beside a decoding lane take two passes,
        alone one. When every chunk completes its prompt here and the decoding lanes would add
        a pass, the prompts go first: their first tokens come a pass sooner, and the decoding
        lanes wait one step, once (``benchmarks/step_passes.py`` measures both compositions).
        A prompt that needs more steps never holds the decoding lanes back (they join every
        one of its chunks), nor does a unified KV (one pass for any batch), nor speculation
        asked for by name (its proposals are made for the step that verifies them; ``--spec
        auto`` proposes after this choice, for the lanes that step).
        """
        fixed_speculation = self._spec.enabled and not self._spec.gated
        if not decoding or not chunks or self._unified or fixed_speculation:
            return False
        if any(r.prefill_pos + take < len(r.prompt) for r, take in chunks):
            return False
        prompts = [(sequence_of(r), take) for r, take in chunks]
        together = prompts + [(sequence_of(r), 1) for r in decoding]
        return forward_passes(prompts) < forward_passes(together)

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

    def _sample(self, r: RequestState, index: int) -> int:
        sampler = r.sampler
        assert sampler is not None
        token = int(self._llama.llama_sampler_sample(sampler.pointer, self._ctx, index))
        if r.logprobs is not None:
            detok = r.detok
            assert detok is not None
            top = r.spec.sampling.logprobs or 0
            r.logprobs.append(
                token_logprob(self._llama, self._ctx, index, self._n_vocab, token, top, detok.piece)
            )
        return token

    def _send_text(self, r: RequestState, text: str) -> None:
        """Stream ``r``'s new text: held while the host has not said who writes the stream
        (``hold_text``), to the client directly while the engine holds its connection
        (``attach_stream``), otherwise as a ``GenText`` for the host (with the
        log-probabilities of its tokens not yet sent)."""
        if r.text_held is not None:
            r.text_held.append(text)
            return
        stream = r.stream
        if stream is not None:
            self._write_stream(r, stream, stream.write(text))
            return
        if not r.logprobs:
            self.emit(GenText(r.id, text))
            return
        sent, r.logprobs = tuple(r.logprobs), []
        self.emit(GenText(r.id, text, sent))

    def _write_stream(self, r: RequestState, stream: SocketChunks, rest: bytes | None) -> None:
        """After a write to ``r``'s client: when the socket took less than the chunk, the host
        writes the rest, then everything after it (the connection is the host's again)."""
        if rest is None:
            return
        r.stream = None
        stream.close()
        if rest:
            self.emit(GenText(r.id, rest.decode("latin-1"), framed=True))

    def attach_stream(self, request_id: str, chunks: SocketChunks) -> None:
        """Write ``request_id``'s text to its client through ``chunks``: what was held until
        now, then each piece as it comes. Only a request that holds its text (the host wrote
        nothing of it, so these writes are the stream's first); ``chunks`` is closed
        otherwise."""
        r = self._board.by_id.get(request_id)
        held = None if r is None or r.phase is Phase.DONE else r.text_held
        if r is None or held is None:
            chunks.close()
            return
        r.text_held = None
        r.stream = chunks
        r.wrote_stream = True
        if held:
            self._write_stream(r, chunks, chunks.write_all(held))

    def release_text(self, request_id: str) -> None:
        """Send ``request_id``'s held text to the host, and the rest of it as it comes."""
        r = self._board.by_id.get(request_id)
        if r is not None:
            self._release_text(r)

    def _release_text(self, r: RequestState) -> None:
        held, r.text_held = r.text_held, None
        if held:
            self.emit(GenText(r.id, "".join(held)))

    def _on_logits(self, r: RequestState, now: float) -> None:
        """Sample ``r``'s next token from this step's logits and stream its text; with
        proposals, verify them (``Proposals.verify``)."""
        index = r.out_index
        r.out_index = -1
        if r.draft:
            self._proposals.verify(r, index, now)
            return
        token = self._sample(r, index)
        if self._commit(r, token, now) and r.runahead:
            self._proposals.check_runahead(r, token, whole=True)

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
            if r.logprobs:
                r.logprobs.pop()  # the end token is not part of the reply
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
                    self._send_text(r, text)
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
            self._send_text(r, text)
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
        abort callback stopped it, are cancelled); the engine goes on. Its return value is
        reported first as ``ComputeFailed`` with its reason (``cancellation`` for an abort)."""
        if result is not None:
            reason = (
                ReasonCode.CANCELLATION
                if aborted
                else DECODE_RETURN_REASONS.get(result, ReasonCode.UNKNOWN_FAILURE)
            )
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
        self._kv.distrust(lane)

    def finish(
        self,
        r: RequestState,
        outcome: GenerationOutcome,
        stop_reason: StopReason,
        reason: ReasonCode | None = None,
        *,
        text: str = "",
        detail: str | None = None,
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
        if phase is Phase.DECODE:
            now = time.monotonic()
            self._ended = [e for e in self._ended if now - e[1] < GATHER_AFTER_END_S]
            self._ended.append((self._steps, now))
        # Nobody said who writes the stream: its text goes to the host with the terminal.
        self._release_text(r)
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
            if text or r.logprobs:
                self._send_text(r, text)
        except Exception:  # noqa: BLE001 - the terminal below must still be sent
            pass
        if r.stream is not None:
            # Before GenDone: the host writes the stream's end once it has it.
            r.stream.close()
            r.stream = None
        self._release_observations(r)
        board = self._board
        board.unlist(r, phase)
        if r.sampler is not None:
            r.sampler.close()
        session_tokens = None
        if r.lane is not None:
            if r.lane.session is not None:  # what its session's next request may reuse
                session_tokens = len(r.lane.tokens)
            self._kv.release(r.lane)
        board.untrack(r)
        message = r.done_message(outcome, stop_reason, reason, session_tokens)
        if detail is not None:
            message = dataclasses.replace(message, detail=detail)
        self._proposals.end(r, message)
        self._released(r)
        self.emit(message)
