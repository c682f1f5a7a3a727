"""Engine messages → events: the scheduler's translation tables, and where the events go.

What the engine says about a request (``engine/protocol_messages.py``) becomes events by table
lookup, not by a chain of tests: :data:`OBSERVATION_EVENTS` maps each observation type to the events
it stands for, :data:`OUTCOME_EVENTS` maps a generation outcome to its generation and request
terminals, :data:`CACHE_EVENTS`, :data:`KV_EVENTS` and :data:`SESSION_EVENTS` map the engine's enums
to event ids. An :class:`Emission` is one event of a request before it is stamped: its id and the
fields the message gives it; :class:`ServingEvents` stamps it with the request's scope and submits
it.

Serving events (request, prefill, generation, session, KV) are submitted only while serving
events are on (:class:`~skippyctl.engine.options.EngineOptions`); model availability and host
facts go through :meth:`ServingEvents.always`, which the events-off baseline keeps.

Privacy: the tables read counts, durations, enums and logical ids only; completion text is never
an event (the scheduler hands ``GenText`` to the request's own stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.engine.protocol_messages import (
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenSpecSwitched,
    GenStarted,
    GenToken,
    KvChange,
    SessionChange,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    BatchingMode,
    Event,
    NumericSummary,
    Progress,
    Scope,
    StateChange,
    StopReason,
    make_event,
    summaries,
)
from skippyctl.events.figures import speculation_summaries, terminal_summaries
from skippyctl.events.reasons import (
    CacheResult,
    GenerationOutcome,
    Outcome,
    ProgressUnit,
    ReasonCode,
)
from skippyctl.runtime.requests import RequestHandle


@dataclass(frozen=True, slots=True)
class Emission:
    """One event of a request, before it is stamped with the request's scope."""

    event_id: EventId
    numbers: tuple[NumericSummary, ...] = ()
    progress: Progress | None = None
    duration_ms: float | None = None
    outcome: Outcome | None = None
    reason: ReasonCode | None = None
    stop_reason: StopReason | None = None
    batching: BatchingMode | None = None
    states: tuple[str, str] | None = None
    """The previous and current state of what the event is about, when it switched one."""


OUTCOME_EVENTS: Final[Mapping[GenerationOutcome, tuple[EventId, EventId, Outcome]]] = {
    GenerationOutcome.COMPLETED: (
        EventId.GENERATION_COMPLETED,
        EventId.REQUEST_COMPLETED,
        Outcome.SUCCESS,
    ),
    GenerationOutcome.CANCELLED: (
        EventId.GENERATION_CANCELLED,
        EventId.REQUEST_CANCELLED,
        Outcome.CANCELLED,
    ),
    GenerationOutcome.TIMED_OUT: (
        EventId.GENERATION_TIMED_OUT,
        EventId.REQUEST_TIMED_OUT,
        Outcome.FAILURE,
    ),
    GenerationOutcome.FAILED: (
        EventId.GENERATION_FAILED,
        EventId.REQUEST_FAILED,
        Outcome.FAILURE,
    ),
}
"""Outcome → (generation terminal, request terminal, event outcome)."""
CACHE_EVENTS: Final[Mapping[CacheResult, EventId]] = {
    CacheResult.HIT: EventId.PROMPT_CACHE_RESTORE_HIT,
    CacheResult.PARTIAL: EventId.PROMPT_CACHE_RESTORE_PARTIAL,
    CacheResult.MISS: EventId.PROMPT_CACHE_RESTORE_MISS,
}
"""A request without a session (``none``) restores nothing and says so by silence."""
KV_EVENTS: Final[Mapping[KvChange, EventId]] = {
    KvChange.INITIALIZED: EventId.KV_CACHE_INITIALIZATION_COMPLETED,
    KvChange.PRESSURE_CROSSED: EventId.CACHE_PRESSURE_CROSSED,
    KvChange.RESET: EventId.CACHE_RESET,
    KvChange.PRESSURE_CLEARED: EventId.CACHE_PRESSURE_CLEARED,
    KvChange.APPROACHING_LIMIT: EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT,
}
SESSION_EVENTS: Final[Mapping[SessionChange, EventId]] = {
    SessionChange.CREATED: EventId.SESSION_CREATED,
    SessionChange.TRIMMED: EventId.SESSION_TRIMMED,
    SessionChange.EVICTED: EventId.SESSION_RESET,
    SessionChange.RESTORED: EventId.SESSION_RESTORED,
}
"""A ``reused`` session is reported by its request's cache event instead."""
KV_TRIMMING_CHANGES: Final = frozenset({SessionChange.TRIMMED, SessionChange.EVICTED})
EVICTION_REASONS: Final[Mapping[str, ReasonCode]] = {
    "lane_needed": ReasonCode.RESERVATION_EXHAUSTED,
    "pressure": ReasonCode.RESERVATION_EXHAUSTED,
    "capacity": ReasonCode.RESERVATION_EXHAUSTED,
    "ttl": ReasonCode.IDLE,
}
"""Why a session lost its KV, by the engine's or the host's word: every lane or the session
registry taken (a lane needed for another request, KV pressure, more sessions than the registry
keeps), or idle past its TTL. Any other word is ``unknown_failure``."""


def eviction_reason(word: str | None) -> ReasonCode | None:
    """The reason code of an eviction's word (None without one)."""
    if word is None:
        return None
    return EVICTION_REASONS.get(word, ReasonCode.UNKNOWN_FAILURE)


"""Session changes that also dropped KV cells: ``cache_trimmed`` says so for the KV."""
_STOP_CONDITIONS: Final = frozenset({StopReason.EOS, StopReason.STOP_STRING, StopReason.LENGTH})


def _started(message: GenStarted, has_session: bool) -> tuple[Emission, ...]:
    prompt, reused = message.prompt_tokens, message.reused_tokens
    found: list[Emission] = [
        Emission(EventId.PROMPT_PROCESSING_STARTED),
        Emission(EventId.TOKENIZATION_COMPLETED, summaries(prompt_tokens=prompt)),
    ]
    # Every request looks for its prompt's prefix in the lanes' KV (its session's, or what an
    # earlier request left): hit when it reused any token. The session-level outcome follows.
    lookup = EventId.CACHE_LOOKUP_HIT if reused > 0 else EventId.CACHE_LOOKUP_MISS
    found.append(Emission(lookup, summaries(reused_tokens=reused, prompt_tokens=prompt)))
    cache_event = CACHE_EVENTS.get(message.cache)
    if cache_event is not None:
        found.append(Emission(cache_event, summaries(reused_tokens=reused, prompt_tokens=prompt)))
    if has_session:
        found.append(Emission(EventId.SESSION_ACTIVE, summaries(lanes=message.lane)))
    found.append(Emission(EventId.PREFILL_STARTED, summaries(prompt_tokens=prompt - reused)))
    return tuple(found)


def _prefill_progress(message: GenPrefillProgress, _session: bool) -> tuple[Emission, ...]:
    progress = Progress(message.done, message.total, ProgressUnit.TOKENS)
    return (Emission(EventId.PREFILL_PROGRESS, progress=progress),)


def _prefill_done(message: GenPrefillDone, _session: bool) -> tuple[Emission, ...]:
    return (
        Emission(
            EventId.PREFILL_COMPLETED,
            summaries(prompt_tokens=message.tokens),
            duration_ms=message.ms,
        ),
        Emission(EventId.GENERATION_STARTED),
    )


def _first_token(message: GenFirstToken, _session: bool) -> tuple[Emission, ...]:
    numbers = summaries(time_to_first_token_ms=message.ttft_ms)
    return (Emission(EventId.FIRST_TOKEN_PRODUCED, numbers),)


def _progress(message: GenProgress, _session: bool) -> tuple[Emission, ...]:
    progress = Progress(message.generated, None, ProgressUnit.TOKENS)
    return (Emission(EventId.GENERATION_PROGRESS, progress=progress),)


def _token(message: GenToken, _session: bool) -> tuple[Emission, ...]:
    # Opt-in debug class: dropped (and counted) by the pipeline when disabled.
    numbers = summaries(generated_tokens=message.index + 1)
    return (Emission(EventId.GENERATION_TOKEN_OBSERVED, numbers, duration_ms=message.step_ms),)


def _spec_switched(message: GenSpecSwitched, _session: bool) -> tuple[Emission, ...]:
    numbers = summaries(spec_acceptance_pct=message.acceptance_pct, lanes=message.lanes)
    states = ("off", "on") if message.speculating else ("on", "off")
    return (Emission(EventId.SPECULATION_SWITCHED, numbers, states=states),)


Observation = (
    GenStarted
    | GenPrefillProgress
    | GenPrefillDone
    | GenFirstToken
    | GenProgress
    | GenToken
    | GenSpecSwitched
)
"""The observations that stand for events (``GenText`` is the request's stream, not an event)."""
OBSERVATION_EVENTS: Final[
    Mapping[type[Observation], Callable[[Any, bool], tuple[Emission, ...]]]
] = {
    GenStarted: _started,
    GenPrefillProgress: _prefill_progress,
    GenPrefillDone: _prefill_done,
    GenFirstToken: _first_token,
    GenProgress: _progress,
    GenToken: _token,
    GenSpecSwitched: _spec_switched,
}
"""Observation type → its events, given the message and whether the request has a session."""


def observation_emissions(message: Observation, has_session: bool) -> tuple[Emission, ...]:
    return OBSERVATION_EVENTS[type(message)](message, has_session)


def prefill_ended(outcome: GenerationOutcome, reason: ReasonCode | None) -> Emission:
    """The prefill's own terminal, for a request that ended before its prefill completed:
    ``prefill_cancelled`` when it was cancelled, else ``prefill_failed`` (a deadline, a crash,
    an engine error), with the request's reason."""
    if outcome is GenerationOutcome.CANCELLED:
        return Emission(EventId.PREFILL_CANCELLED, outcome=Outcome.CANCELLED, reason=reason)
    return Emission(EventId.PREFILL_FAILED, outcome=Outcome.FAILURE, reason=reason)


def done_emissions(
    message: GenDone, has_session: bool, duration_ms: float, prefilling: bool = False
) -> tuple[Emission, ...]:
    """The events of the engine's terminal for a request; ``duration_ms`` since it was received;
    ``prefilling``: its prefill had not completed (it gets its terminal first). Its figures
    become the generation terminal's numbers (``events/figures.py``: one table), and, when the
    request speculated, ``speculation_summarized``'s."""
    generation_event, request_event, outcome = OUTCOME_EVENTS[message.outcome]
    reason, stop, figures = message.reason, message.stop_reason, message.figures
    found: list[Emission] = []
    if prefilling and message.outcome is not GenerationOutcome.COMPLETED:
        found.append(prefill_ended(message.outcome, reason))
    if reason is ReasonCode.CONTEXT_EXHAUSTED:
        numbers = summaries(prompt_tokens=figures.prompt_tokens)
        found.append(Emission(EventId.CONTEXT_EXHAUSTED, numbers, reason=reason))
    if message.outcome is GenerationOutcome.COMPLETED and stop in _STOP_CONDITIONS:
        found.append(Emission(EventId.STOP_CONDITION_REACHED, stop_reason=stop))
    if figures.speculated:
        found.append(Emission(EventId.SPECULATION_SUMMARIZED, speculation_summaries(figures)))
    batching = BatchingMode.CONTINUOUS if figures.shared_decode_steps > 0 else BatchingMode.SINGLE
    found.append(
        Emission(
            generation_event,
            terminal_summaries(figures),
            outcome=outcome,
            reason=reason,
            stop_reason=stop,
            batching=batching,
        )
    )
    found.append(Emission(request_event, outcome=outcome, reason=reason, duration_ms=duration_ms))
    if has_session:
        if message.session_tokens:  # its lane kept them for the session's next request
            kept = summaries(context_tokens=message.session_tokens)
            found.append(Emission(EventId.CACHE_STATE_RECORDED, kept))
        # What the session holds in KV now and what this request found there.
        held = summaries(context_tokens=message.session_tokens, reused_tokens=figures.reused_tokens)
        found.append(Emission(EventId.SESSION_IDLE, held))
    return tuple(found)


def host_ended_emissions(
    outcome: GenerationOutcome,
    reason: ReasonCode,
    has_session: bool,
    duration_ms: float,
    prefilling: bool = False,
) -> tuple[Emission, ...]:
    """The events of a running request the host ended itself (its engine had not)."""
    generation_event, request_event, event_outcome = OUTCOME_EVENTS[outcome]
    found: list[Emission] = []
    if prefilling:
        found.append(prefill_ended(outcome, reason))
    if reason is ReasonCode.CONTEXT_EXHAUSTED:
        found.append(Emission(EventId.CONTEXT_EXHAUSTED, reason=reason))
    stop = host_stop_reason(reason)
    found.append(Emission(generation_event, outcome=event_outcome, reason=reason, stop_reason=stop))
    found.append(
        Emission(request_event, outcome=event_outcome, reason=reason, duration_ms=duration_ms)
    )
    if has_session:
        found.append(Emission(EventId.SESSION_IDLE))
    return tuple(found)


def host_stop_reason(reason: ReasonCode) -> StopReason:
    """Why a request the host ended stopped: its deadline, or an error."""
    return StopReason.TIMEOUT if reason is ReasonCode.TIMEOUT else StopReason.ERROR


def unstarted_emission(reason: ReasonCode, duration_ms: float) -> Emission:
    """The terminal of a request that ended while queued (deadline or cancel)."""
    if reason is ReasonCode.TIMEOUT:
        return Emission(
            EventId.REQUEST_TIMED_OUT,
            outcome=Outcome.FAILURE,
            reason=reason,
            duration_ms=duration_ms,
        )
    return Emission(
        EventId.REQUEST_CANCELLED, outcome=Outcome.CANCELLED, reason=reason, duration_ms=duration_ms
    )


class ServingEvents:
    """Where a model server's events go: serving events only while they are on."""

    def __init__(self, submit: Callable[[Event], object], enabled: bool = True) -> None:
        self._submit = submit
        self.enabled = enabled
        """False only for the events-off benchmark baseline: request, prefill, generation,
        session and KV events are not submitted; model availability still is."""

    def request(self, handle: RequestHandle, emissions: Iterable[Emission]) -> None:
        """Submit events of ``handle``'s request, in order."""
        if not self.enabled:
            return
        scope = Scope(
            model_id=handle.model_id, session_id=handle.session_id, request_id=handle.request_id
        )
        for e in emissions:
            self._submit(
                make_event(
                    e.event_id,
                    operation_id=handle.request_id,
                    scope=scope,
                    outcome=e.outcome,
                    reason_code=e.reason,
                    duration_ms=e.duration_ms,
                    progress=e.progress,
                    stop_reason=e.stop_reason,
                    batching=e.batching,
                    summaries=e.numbers,
                    state=None if e.states is None else StateChange(*e.states),
                )
            )

    def fact(
        self, event_id: EventId, scope: Scope, numbers: tuple[NumericSummary, ...] = ()
    ) -> None:
        """A serving fact outside a request (session, KV)."""
        if self.enabled:
            self._submit(make_event(event_id, scope=scope, summaries=numbers))

    def event(self, event: Event) -> None:
        """A serving event built by the caller (e.g. a rejection without a request scope)."""
        if self.enabled:
            self._submit(event)

    def always(self, event: Event) -> None:
        """Model availability or a host fact: submitted with serving events off too."""
        self._submit(event)
