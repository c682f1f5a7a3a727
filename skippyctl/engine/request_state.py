"""Request state in the batch engine: what was asked, where it is, what it has counted.

:class:`GenerateRequest` is what a caller submits (the worker builds it from a
:class:`~skippyctl.engine.protocol_commands.Generate` command). :class:`RequestState` is its mutable
state from submit to its one ``gen_done``: phase, prompt, sampler, counters, timings, the
observations held back until its first text went out. :class:`RequestBoard` holds the live requests
by phase and counts those with a deadline, so the per-step path skips deadline checks when there are
none.

Pure Python (no llama.cpp); decode thread only, except :class:`RequestState` construction in
``submit``. Nothing here holds prompt text beyond the request spec itself, and the messages built
here (:meth:`RequestState.done_message`) carry counts and durations only (its figures).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from skippyctl.config.stream_wire import SocketChunks
from skippyctl.engine.chat_template import ChatMessage
from skippyctl.engine.lanes import Lane
from skippyctl.engine.protocol_messages import (
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    TokenLogprob,
)
from skippyctl.engine.sampling import SamplerChain, SamplingParams
from skippyctl.engine.spec_gate import LaneGate
from skippyctl.engine.speculation import AdaptiveWindow
from skippyctl.engine.text import Detokenizer, StopMatcher
from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import GenerationOutcome, ReasonCode


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
    # -- chat template inputs (jinja)
    tools: tuple[dict[str, Any], ...] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    hold_text: bool = False
    """Hold the text until the host says who writes the stream (``Generate.hold_text``)."""


def validation_error(request: GenerateRequest) -> str | None:
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
        # llama-server's rule: a turn says something, or calls tools.
        or not all(
            m.content is not None or m.parts is not None or m.tool_calls for m in request.messages
        )
    ):
        return "messages"
    if request.tools is not None and (
        not isinstance(request.tools, tuple) or not all(isinstance(t, dict) for t in request.tools)
    ):
        return "tools"
    if request.chat_template_kwargs is not None and not isinstance(
        request.chat_template_kwargs, dict
    ):
        return "chat_template_kwargs"
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


class Phase(StrEnum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class RequestState:
    """Mutable state of one submitted request. Created by ``submit``, then decode thread only."""

    __slots__ = (
        "approaching_sent",
        "deadline",
        "detok",
        "draft",
        "error",
        "gate",
        "gbnf",
        "generated_tokens",
        "held_observations",
        "id",
        "lane",
        "logprobs",
        "max_batch",
        "open_window",
        "out_index",
        "pending_token",
        "phase",
        "plugin_commits",
        "prompt_count",
        "prefill_pos",
        "prompt",
        "refusal",
        "reused",
        "runahead",
        "sampled",
        "sampler",
        "shared_decode_steps",
        "spec",
        "spec_accepted",
        "spec_discarded",
        "spec_late",
        "spec_proposed",
        "spec_windows",
        "stops",
        "stream",
        "submitted",
        "t_first",
        "t_last",
        "t_prefill_end",
        "t_prefill_progress",
        "t_prefill_start",
        "t_progress",
        "text_held",
        "window",
        "wrote_stream",
    )

    def __init__(self, spec: GenerateRequest, submitted: float, error: str | None) -> None:
        self.spec = spec
        self.id = spec.request_id
        self.submitted = submitted
        self.error = error
        self.deadline: float | None = None if error else spec.deadline_mono_s
        self.phase = Phase.QUEUED
        self.lane: Lane | None = None
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
        self.gbnf: str | None = None
        """The grammar of a constrained request, made once at intake (a JSON schema's GBNF)."""
        self.refusal: tuple[ReasonCode, str | None] | None = None
        """Why intake refused the request, and what to tell the requester (a chat template's
        error), when it did: found on the submitting thread, answered on the decode thread."""
        self.logprobs: list[TokenLogprob] | None = (
            None if error or spec.sampling.logprobs is None else []
        )
        """Log-probabilities of committed tokens not yet sent (requests that asked only)."""
        self.generated_tokens = 0
        self.sampled = 0
        self.held_observations: list[GenPrefillDone | GenFirstToken] = []
        """Sent after the first token's text (the client's first text must not wait for the
        host to turn them into events), and before gen_done if the request ends first."""
        self.shared_decode_steps = 0
        self.max_batch = 0
        self.window: AdaptiveWindow | None = None
        """How many proposals the request verifies next; None when its model does not
        speculate."""
        self.draft: list[int] = []
        """Tokens proposed to follow ``pending_token``, verified in the current step."""
        self.gate: LaneGate | None = None
        """With ``--spec auto``: whether its proposals pay, and their acceptance."""
        self.spec_windows = 0
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.spec_late = 0
        """Proposal queries of this request whose answer came after the deadline (dropped)."""
        self.spec_discarded = 0
        """Run-ahead proposals dropped unexecuted because a window before them diverged."""
        self.runahead: list[int] = []
        """Proposals past the current window (``SpecConfig.runahead_tokens``, or the tail a
        step cut off): the first is the token expected after it, the rest the next window."""
        self.plugin_commits: list[int] | None = None
        """With serving plugins: committed tokens not yet handed to them (one delta a step)."""
        self.open_window: list[int] | None = None
        """While a window verifies: its proposed and accepted counts, so a commit that ends the
        request inside it can tell the proposer (outcome ``stopped``) before its finish."""
        self.approaching_sent = False
        self.text_held: list[str] | None = (
            [] if spec.hold_text and spec.sampling.logprobs is None and not error else None
        )
        """While the host has not said who writes the stream (``hold_text``): the text so far,
        a piece per token; None once it has (or when it was not asked to hold)."""
        self.wrote_stream = False
        """The engine was handed the client's connection (its terminal says so)."""
        self.stream: SocketChunks | None = None
        """The client's connection while the engine writes this request's text to it itself
        (``AttachStream``); closed before its ``GenDone``."""
        self.t_prefill_start = 0.0
        self.t_prefill_end = 0.0
        self.t_prefill_progress = 0.0
        self.t_first = 0.0
        self.t_last = 0.0
        self.t_progress = 0.0

    def take_held(self) -> list[GenPrefillDone | GenFirstToken]:
        """The held-back observations, in order; none are held afterwards."""
        held, self.held_observations = self.held_observations, []
        return held

    def done_message(
        self,
        outcome: GenerationOutcome,
        stop_reason: StopReason,
        reason: ReasonCode | None = None,
        session_tokens: int | None = None,
    ) -> GenDone:
        """This request's terminal with its figures (see :class:`GenerationFigures`) and, for
        a session's request, the tokens its session holds in KV now."""
        if reason is None and outcome is GenerationOutcome.CANCELLED:
            reason = ReasonCode.CANCELLATION
        elif reason is None and outcome is GenerationOutcome.TIMED_OUT:
            reason = ReasonCode.TIMEOUT
        wrote = True if self.wrote_stream else None
        return GenDone(
            self.id,
            outcome,
            reason,
            stop_reason,
            self.figures(),
            wrote_stream=wrote,
            session_tokens=session_tokens,
        )

    def figures(self) -> GenerationFigures:
        """What this request measured so far (its terminal's, when it has ended)."""
        prefill_s = 0.0
        if self.t_prefill_start:
            prefill_s = (self.t_prefill_end or time.monotonic()) - self.t_prefill_start
        prefilled = self.prefill_pos - self.reused
        decode_s = self.t_last - self.t_first if self.sampled >= 2 else 0.0
        waited_s = self.t_prefill_start - self.submitted
        return GenerationFigures(
            prompt_tokens=len(self.prompt) if self.prompt_count is None else self.prompt_count,
            reused_tokens=self.reused,
            generated_tokens=self.generated_tokens,
            engine_wait_ms=round(max(0.0, waited_s) * 1000.0, 3) if self.t_prefill_start else None,
            prefill_ms=round(prefill_s * 1000.0, 3),
            ttft_ms=round((self.t_first - self.submitted) * 1000.0, 3) if self.sampled else None,
            decode_ms=round(decode_s * 1000.0, 3),
            prefill_tokens_per_s=round(prefilled / prefill_s, 2) if prefill_s > 0 else None,
            # Inter-token rate: tokens after the first over the time between first and last.
            decode_tokens_per_s=round((self.sampled - 1) / decode_s, 2) if decode_s > 0 else None,
            shared_decode_steps=self.shared_decode_steps,
            max_batch=self.max_batch,
            spec_windows=self.spec_windows,
            spec_proposed=self.spec_proposed,
            spec_accepted=self.spec_accepted,
            spec_rejected=self.spec_proposed - self.spec_accepted,
            spec_late=self.spec_late,
            spec_discarded=self.spec_discarded,
        )


class RequestBoard:
    """The live requests of one engine: by id, and by phase in FIFO lists. Decode thread only.

    A request is *tracked* from acceptance to its terminal (``by_id``); it is on exactly one
    phase list while it waits (``queue``), prefills (``prefilling``, round-robin) or decodes
    (``decoding``) — except transiently, while the decode thread holds it popped."""

    __slots__ = ("by_id", "decoding", "prefilling", "queue", "with_deadline")

    def __init__(self) -> None:
        self.by_id: dict[str, RequestState] = {}
        self.with_deadline = 0
        """Tracked requests with a deadline: the step loop skips :meth:`expired` when 0."""
        self.queue: deque[RequestState] = deque()
        self.prefilling: deque[RequestState] = deque()
        self.decoding: list[RequestState] = []

    def track(self, r: RequestState) -> None:
        self.by_id[r.id] = r
        if r.deadline is not None:
            self.with_deadline += 1

    def untrack(self, r: RequestState) -> None:
        if self.by_id.pop(r.id, None) is not None and r.deadline is not None:
            self.with_deadline -= 1

    def unlist(self, r: RequestState, phase: Phase) -> None:
        """Take ``r`` off the list of ``phase`` (it may be off already: popped for admission or
        for a prefill chunk)."""
        with contextlib.suppress(ValueError):
            if phase is Phase.QUEUED:
                self.queue.remove(r)
            elif phase is Phase.PREFILL:
                self.prefilling.remove(r)
            elif phase is Phase.DECODE:
                self.decoding.remove(r)

    def running(self) -> tuple[RequestState, ...]:
        """Requests holding a lane (prefilling or decoding)."""
        return (*self.prefilling, *self.decoding)

    def orphans(self) -> list[RequestState]:
        """Tracked requests on no list (a failure left them between lists)."""
        listed = {id(r) for r in (*self.queue, *self.prefilling, *self.decoding)}
        return [r for r in self.by_id.values() if id(r) not in listed]

    def expired(self, now: float) -> list[RequestState]:
        """Listed requests whose deadline is at or before ``now``."""
        expired: list[RequestState] = []
        for group in (self.queue, self.prefilling, self.decoding):
            for r in group:
                if r.deadline is not None and now >= r.deadline:
                    expired.append(r)
        return expired
