"""Sessions and in-flight requests (admission, prefill, generation).

The allowed moves are the rows of `SESSION_MOVES` and `REQUEST_MOVES` (reducer.moves); the
handlers look each event up there and make the field updates. A request only moves forward.
`generation_completed` adds the model's throughput figures (no request moves).

    session            from → to
    session_requested  absent | any other → requested
    session_created    absent | any → idle — lane, context tokens recorded; a repeat records them
                         again
    session_idle       absent | any other → idle — lane, context tokens, reused tokens
    session_active     absent | any other → active
    session_draining   absent | any other → draining
    session_restored   absent | any → idle — lane, context tokens recorded (its KV read back from a
                         state file after a reload)
    session_trimmed    any → same — trims counted
      session_reset
    session_closed     any → removed
      session_failed
      session_abandoned

    request                    from → to
    request_received           absent → received — known: a duplicate
    request_queued             received → queued — queue depth
    request_admitted           received | queued → admitted — queue wait
    request_execution_started  any but decode → prefill — prompt tokens
      prompt_processing_started
      prefill_started
    generation_started         any → decode — time to first token
      first_token_produced
    generation_progress        any → same — generated tokens
    request_completed          any → removed — kept in the capped recent list
      request_cancelled
      request_timed_out
      request_failed
    request_rejected           absent | any → removed — kept in the capped recent list
"""

from __future__ import annotations

from typing import Final, assert_never

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.reducer.common import (
    NO_TRANSITIONS,
    Handler,
    Step,
    bounded_put,
    count,
    reject,
)
from skippyctl.reducer.immutable import remove_item, revise, revise_item
from skippyctl.reducer.moves import ABSENT, REMOVED, SAME, Effect, Move, MoveTable, entering, moves
from skippyctl.reducer.state import (
    MAX_RECENT_REQUESTS,
    MAX_REQUESTS,
    MAX_SESSIONS,
    RequestOutcome,
    RequestState,
    RequestView,
    RuntimeView,
    SessionState,
    SessionView,
)

_E = EventId
_SS = SessionState
_R = RequestState


_ANY_SESSION: Final[frozenset[_SS]] = frozenset(_SS)

SESSION_MOVES: Final[MoveTable[SessionState]] = MoveTable(
    "session",
    SessionState,
    (
        Move(entering(_SS.REQUESTED), _E.SESSION_REQUESTED, _SS.REQUESTED),
        Move(
            frozenset({ABSENT, *_ANY_SESSION}),
            _E.SESSION_CREATED,
            _SS.IDLE,
            note="lane, context tokens recorded; a repeat records them again",
        ),
        Move(
            entering(_SS.IDLE),
            _E.SESSION_IDLE,
            _SS.IDLE,
            note="lane, context tokens, reused tokens",
        ),
        Move(entering(_SS.ACTIVE), _E.SESSION_ACTIVE, _SS.ACTIVE),
        Move(entering(_SS.DRAINING), _E.SESSION_DRAINING, _SS.DRAINING),
        Move(
            frozenset({ABSENT, *_ANY_SESSION}),
            _E.SESSION_RESTORED,
            _SS.IDLE,
            note=(
                "lane, context tokens recorded (its KV read back from a state file after a reload)"
            ),
        ),
        *moves(
            _ANY_SESSION,
            (_E.SESSION_TRIMMED, _E.SESSION_RESET),
            SAME,
            note="trims counted",
        ),
        *moves(
            _ANY_SESSION,
            (_E.SESSION_CLOSED, _E.SESSION_FAILED, _E.SESSION_ABANDONED),
            REMOVED,
        ),
    ),
)

_ANY_REQUEST: Final[frozenset[_R]] = frozenset(_R)
_ENDS: Final = (_E.REQUEST_COMPLETED, _E.REQUEST_CANCELLED, _E.REQUEST_TIMED_OUT, _E.REQUEST_FAILED)

# A request only moves forward (received → queued → admitted → prefill → decode).
REQUEST_MOVES: Final[MoveTable[RequestState]] = MoveTable(
    "request",
    RequestState,
    (
        Move(frozenset({ABSENT}), _E.REQUEST_RECEIVED, _R.RECEIVED, note="known: a duplicate"),
        Move(frozenset({_R.RECEIVED}), _E.REQUEST_QUEUED, _R.QUEUED, note="queue depth"),
        Move(
            frozenset({_R.RECEIVED, _R.QUEUED}),
            _E.REQUEST_ADMITTED,
            _R.ADMITTED,
            note="queue wait",
        ),
        *moves(
            {_R.RECEIVED, _R.QUEUED, _R.ADMITTED, _R.PREFILL},
            (_E.REQUEST_EXECUTION_STARTED, _E.PROMPT_PROCESSING_STARTED, _E.PREFILL_STARTED),
            _R.PREFILL,
            note="prompt tokens",
        ),
        *moves(
            _ANY_REQUEST,
            (_E.GENERATION_STARTED, _E.FIRST_TOKEN_PRODUCED),
            _R.DECODE,
            note="time to first token",
        ),
        Move(_ANY_REQUEST, _E.GENERATION_PROGRESS, SAME, note="generated tokens"),
        *moves(_ANY_REQUEST, _ENDS, REMOVED, note="kept in the capped recent list"),
        Move(
            frozenset({ABSENT, *_ANY_REQUEST}),
            _E.REQUEST_REJECTED,
            REMOVED,
            note="kept in the capped recent list",
        ),
    ),
)
MOVE_TABLES: Final = (SESSION_MOVES, REQUEST_MOVES)


_STEP_FIELDS: Final[dict[SummaryKey, tuple[str, type[int] | type[float]]]] = {
    SummaryKey.QUEUE_DEPTH: ("queue_depth", int),
    SummaryKey.QUEUE_WAIT_MS: ("queue_wait_ms", float),
    SummaryKey.TIME_TO_FIRST_TOKEN_MS: ("time_to_first_token_ms", float),
    SummaryKey.PROMPT_TOKENS: ("prompt_tokens", int),
}
"""The summaries a request step records, by the `RequestView` field they set."""


def _int(event: Event, key: SummaryKey) -> int | None:
    value = event.summary_value(key)
    return None if value is None else int(value)


def on_session(state: RuntimeView, event: Event) -> Step:
    session_id = event.scope.session_id
    if session_id is None:
        return reject(state)
    current = state.sessions.get(session_id)
    now = ABSENT if current is None else current.state
    row = SESSION_MOVES.find(event.id, now)
    if row is None:
        return reject(state, duplicate=SESSION_MOVES.repeats(event.id, now))
    match row.target:
        case Effect.REMOVED:
            return revise(state, sessions=remove_item(state.sessions, session_id)), NO_TRANSITIONS
        case Effect.SAME:
            if current is None:  # no row leads from absent to `same`
                return reject(state)
            trimmed = current.trimmed + (event.id is EventId.SESSION_TRIMMED)
            updated = revise(current, trimmed=trimmed, updated_mono_ns=event.mono_ns)
            sessions = revise_item(state.sessions, session_id, updated)
            return revise(state, sessions=sessions), NO_TRANSITIONS
        case SessionState() as target:
            return _place_session(state, event, session_id, current, target)
        case _ as unreachable:
            assert_never(unreachable)


def _place_session(
    state: RuntimeView,
    event: Event,
    session_id: LogicalId,
    current: SessionView | None,
    target: SessionState,
) -> Step:
    lane = _int(event, SummaryKey.LANES)
    ctx = _int(event, SummaryKey.CONTEXT_TOKENS)
    reused = _int(event, SummaryKey.REUSED_TOKENS)
    base = current or SessionView(session_id=session_id, state=target)
    view = revise(
        base,
        state=target,
        model_id=event.scope.model_id or base.model_id,
        lane=lane if lane is not None else base.lane,
        context_tokens=ctx if ctx is not None else base.context_tokens,
        reused_tokens=reused if reused is not None else base.reused_tokens,
        updated_mono_ns=event.mono_ns,
    )
    placed = bounded_put(
        state.sessions,
        session_id,
        view,
        MAX_SESSIONS,
        lambda s: s.state is SessionState.IDLE,
        lambda s: s.updated_mono_ns,
    )
    if placed is None:
        return reject(state)
    sessions, evicted = placed
    return count(revise(state, sessions=sessions), evicted_sessions=evicted), NO_TRANSITIONS


def on_request_received(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    if request_id is None:
        return reject(state)
    known = state.requests.get(request_id)
    if REQUEST_MOVES.find(event.id, ABSENT if known is None else known.state) is None:
        return reject(state, duplicate=True)
    view = RequestView(
        request_id=request_id,
        state=RequestState.RECEIVED,
        model_id=event.scope.model_id,
        session_id=event.scope.session_id,
        received_mono_ns=event.mono_ns,
        updated_mono_ns=event.mono_ns,
    )
    # Every request is evictable: the table is a bounded view, not the scheduler's truth.
    placed = bounded_put(
        state.requests, request_id, view, MAX_REQUESTS, lambda r: True, lambda r: r.updated_mono_ns
    )
    assert placed is not None
    requests, evicted = placed
    return count(revise(state, requests=requests), evicted_requests=evicted), NO_TRANSITIONS


def on_request_step(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    view = None if request_id is None else state.requests.get(request_id)
    if view is None or request_id is None:
        return reject(state)
    row = REQUEST_MOVES.find(event.id, view.state)
    if row is None or isinstance(row.target, Effect):
        return reject(state, duplicate=REQUEST_MOVES.repeats(event.id, view.state))
    changes: dict[str, object] = {"state": row.target, "updated_mono_ns": event.mono_ns}
    # One pass over the summaries (the first of a key counts, as `summary_value` reads it).
    for item in event.summaries:
        step_field = _STEP_FIELDS.get(item.key)
        if step_field is not None and step_field[0] not in changes:
            changes[step_field[0]] = step_field[1](item.value)
    updated = revise(view, **changes)
    return revise(state, requests=revise_item(state.requests, request_id, updated)), NO_TRANSITIONS


def on_generation_progress(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    view = None if request_id is None else state.requests.get(request_id)
    if view is None or request_id is None or event.progress is None:
        return reject(state)
    if REQUEST_MOVES.find(event.id, view.state) is None:
        return reject(state)
    if view.generated_tokens is not None and event.progress.current <= view.generated_tokens:
        return reject(state, duplicate=True)
    updated = revise(view, generated_tokens=event.progress.current, updated_mono_ns=event.mono_ns)
    return revise(state, requests=revise_item(state.requests, request_id, updated)), NO_TRANSITIONS


def on_generation_completed(state: RuntimeView, event: Event) -> Step:
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    if model is None or model_id is None:
        return state, NO_TRANSITIONS
    rate = event.summary_value(SummaryKey.DECODE_TOKENS_PER_S)
    tokens = _int(event, SummaryKey.GENERATED_TOKENS) or 0
    proposed = _int(event, SummaryKey.SPEC_PROPOSED_TOKENS) or 0
    accepted = _int(event, SummaryKey.SPEC_ACCEPTED_TOKENS) or 0
    updated = revise(
        model,
        generated_tokens=model.generated_tokens + tokens,
        decode_tokens_per_s=float(rate) if rate is not None else model.decode_tokens_per_s,
        spec_proposed_tokens=model.spec_proposed_tokens + proposed,
        spec_accepted_tokens=model.spec_accepted_tokens + accepted,
    )
    state = revise(state, models=revise_item(state.models, model_id, updated))
    session_id = event.scope.session_id
    session = None if session_id is None else state.sessions.get(session_id)
    if proposed and session is not None and session_id is not None:
        session = revise(
            session,
            spec_proposed_tokens=session.spec_proposed_tokens + proposed,
            spec_accepted_tokens=session.spec_accepted_tokens + accepted,
        )
        state = revise(state, sessions=revise_item(state.sessions, session_id, session))
    return state, NO_TRANSITIONS


def on_request_end(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    if request_id is None:
        return reject(state)
    view = state.requests.get(request_id)
    now = ABSENT if view is None else view.state
    if REQUEST_MOVES.find(event.id, now) is None:
        return reject(state, duplicate=REQUEST_MOVES.repeats(event.id, now))
    outcome = RequestOutcome(
        request_id=request_id,
        model_id=event.scope.model_id,
        event_id=event.id.value,
        reason_code=event.reason_code,
        duration_ms=event.duration_ms,
    )
    recent = (*state.recent_requests, outcome)
    evicted = max(0, len(recent) - MAX_RECENT_REQUESTS)
    state = revise(
        state,
        requests=remove_item(state.requests, request_id),
        recent_requests=recent[evicted:],
    )
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    if model is not None and model_id is not None and event.id is EventId.REQUEST_COMPLETED:
        model = revise(model, completed_requests=model.completed_requests + 1)
        state = revise(state, models=revise_item(state.models, model_id, model))
    return count(state, evicted_recent=evicted), NO_TRANSITIONS


_REQUEST_HANDLERS: Final[dict[EventId, Handler]] = {
    EventId.REQUEST_RECEIVED: on_request_received,
    EventId.GENERATION_PROGRESS: on_generation_progress,
    **{event_id: on_request_end for event_id in (*_ENDS, EventId.REQUEST_REJECTED)},
}

HANDLERS: Final[dict[EventId, Handler]] = {
    **{event_id: on_session for event_id in SESSION_MOVES.events},
    **{
        event_id: _REQUEST_HANDLERS.get(event_id, on_request_step)
        for event_id in REQUEST_MOVES.events
    },
    EventId.GENERATION_COMPLETED: on_generation_completed,
}
