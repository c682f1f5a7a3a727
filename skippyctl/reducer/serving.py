"""Sessions and in-flight requests (admission, prefill, generation).

session_requested                 absent        requested
session_created | session_idle    any           idle       (lane, context tokens recorded)
session_active                    any           active
session_draining                  any           draining
session_trimmed | _reset | _restored            (same state; trim counted)
session_closed | _failed | _abandoned           removed

request_received                  absent        received
request_queued                    received      queued     (queue depth)
request_admitted                  received|queued admitted (queue wait)
request_execution_started,
  prompt_processing_started,
  prefill_started                 ≤ admitted    prefill
generation_started,
  first_token_produced            ≤ prefill     decode     (time to first token)
generation_progress                             (generated tokens)
request_completed | _cancelled | _timed_out | _failed | _rejected
                                  any           removed; kept in the capped recent list
generation_completed                            model throughput figures
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.reducer.common import (
    NO_TRANSITIONS,
    Handler,
    Step,
    bounded_put,
    count,
    drop,
    put,
    reject,
)
from skippyctl.reducer.immutable import evolve
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

_SESSION_TARGETS: Final[dict[EventId, SessionState]] = {
    EventId.SESSION_REQUESTED: SessionState.REQUESTED,
    EventId.SESSION_CREATED: SessionState.IDLE,
    EventId.SESSION_IDLE: SessionState.IDLE,
    EventId.SESSION_ACTIVE: SessionState.ACTIVE,
    EventId.SESSION_DRAINING: SessionState.DRAINING,
}
_SESSION_FACTS: Final = frozenset(
    {EventId.SESSION_TRIMMED, EventId.SESSION_RESET, EventId.SESSION_RESTORED}
)
_SESSION_ENDS: Final = frozenset(
    {EventId.SESSION_CLOSED, EventId.SESSION_FAILED, EventId.SESSION_ABANDONED}
)

_ORDER: Final = (
    RequestState.RECEIVED,
    RequestState.QUEUED,
    RequestState.ADMITTED,
    RequestState.PREFILL,
    RequestState.DECODE,
)
_REQUEST_TARGETS: Final[dict[EventId, RequestState]] = {
    EventId.REQUEST_QUEUED: RequestState.QUEUED,
    EventId.REQUEST_ADMITTED: RequestState.ADMITTED,
    EventId.REQUEST_EXECUTION_STARTED: RequestState.PREFILL,
    EventId.PROMPT_PROCESSING_STARTED: RequestState.PREFILL,
    EventId.PREFILL_STARTED: RequestState.PREFILL,
    EventId.GENERATION_STARTED: RequestState.DECODE,
    EventId.FIRST_TOKEN_PRODUCED: RequestState.DECODE,
}
_REQUEST_ENDS: Final = frozenset(
    {
        EventId.REQUEST_COMPLETED,
        EventId.REQUEST_CANCELLED,
        EventId.REQUEST_TIMED_OUT,
        EventId.REQUEST_FAILED,
        EventId.REQUEST_REJECTED,
    }
)


def _int(event: Event, key: SummaryKey) -> int | None:
    value = event.summary_value(key)
    return None if value is None else int(value)


def on_session(state: RuntimeView, event: Event) -> Step:
    session_id = event.scope.session_id
    if session_id is None:
        return reject(state)
    current = state.sessions.get(session_id)
    if event.id in _SESSION_ENDS:
        if current is None:
            return reject(state, duplicate=True)
        return evolve(state, sessions=drop(state.sessions, session_id)), NO_TRANSITIONS
    if event.id in _SESSION_FACTS:
        if current is None:
            return reject(state)
        trimmed = current.trimmed + (event.id is EventId.SESSION_TRIMMED)
        updated = evolve(current, trimmed=trimmed, updated_mono_ns=event.mono_ns)
        return evolve(state, sessions=put(state.sessions, session_id, updated)), NO_TRANSITIONS
    target = _SESSION_TARGETS[event.id]
    if current is not None and current.state is target and event.id is not EventId.SESSION_CREATED:
        return reject(state, duplicate=True)
    lane = _int(event, SummaryKey.LANES)
    ctx = _int(event, SummaryKey.CONTEXT_TOKENS)
    base = current or SessionView(session_id=session_id, state=target)
    view = evolve(
        base,
        state=target,
        model_id=event.scope.model_id or base.model_id,
        lane=lane if lane is not None else base.lane,
        context_tokens=ctx if ctx is not None else base.context_tokens,
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
    return count(evolve(state, sessions=sessions), evicted_sessions=evicted), NO_TRANSITIONS


def on_request_received(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    if request_id is None:
        return reject(state)
    if request_id in state.requests:
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
    return count(evolve(state, requests=requests), evicted_requests=evicted), NO_TRANSITIONS


def on_request_step(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    view = None if request_id is None else state.requests.get(request_id)
    if view is None or request_id is None:
        return reject(state)
    target = _REQUEST_TARGETS[event.id]
    if _ORDER.index(target) < _ORDER.index(view.state):
        return reject(state)
    if target is view.state and event.id in (EventId.REQUEST_QUEUED, EventId.REQUEST_ADMITTED):
        return reject(state, duplicate=True)
    depth = _int(event, SummaryKey.QUEUE_DEPTH)
    wait = event.summary_value(SummaryKey.QUEUE_WAIT_MS)
    ttft = event.summary_value(SummaryKey.TIME_TO_FIRST_TOKEN_MS)
    prompt = _int(event, SummaryKey.PROMPT_TOKENS)
    updated = evolve(
        view,
        state=target,
        queue_depth=depth if depth is not None else view.queue_depth,
        queue_wait_ms=float(wait) if wait is not None else view.queue_wait_ms,
        time_to_first_token_ms=float(ttft) if ttft is not None else view.time_to_first_token_ms,
        prompt_tokens=prompt if prompt is not None else view.prompt_tokens,
        updated_mono_ns=event.mono_ns,
    )
    return evolve(state, requests=put(state.requests, request_id, updated)), NO_TRANSITIONS


def on_generation_progress(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    view = None if request_id is None else state.requests.get(request_id)
    if view is None or request_id is None or event.progress is None:
        return reject(state)
    if view.generated_tokens is not None and event.progress.current <= view.generated_tokens:
        return reject(state, duplicate=True)
    updated = evolve(view, generated_tokens=event.progress.current, updated_mono_ns=event.mono_ns)
    return evolve(state, requests=put(state.requests, request_id, updated)), NO_TRANSITIONS


def on_generation_completed(state: RuntimeView, event: Event) -> Step:
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    if model is None or model_id is None:
        return state, NO_TRANSITIONS
    rate = event.summary_value(SummaryKey.DECODE_TOKENS_PER_S)
    tokens = _int(event, SummaryKey.GENERATED_TOKENS) or 0
    updated = evolve(
        model,
        generated_tokens=model.generated_tokens + tokens,
        decode_tokens_per_s=float(rate) if rate is not None else model.decode_tokens_per_s,
    )
    return evolve(state, models=put(state.models, model_id, updated)), NO_TRANSITIONS


def on_request_end(state: RuntimeView, event: Event) -> Step:
    request_id = event.scope.request_id
    if request_id is None:
        return reject(state)
    view = state.requests.get(request_id)
    if view is None and event.id is not EventId.REQUEST_REJECTED:
        return reject(state, duplicate=True)
    outcome = RequestOutcome(
        request_id=request_id,
        model_id=event.scope.model_id,
        event_id=event.id.value,
        reason_code=event.reason_code,
        duration_ms=event.duration_ms,
    )
    recent = (*state.recent_requests, outcome)
    evicted = max(0, len(recent) - MAX_RECENT_REQUESTS)
    state = evolve(
        state,
        requests=drop(state.requests, request_id),
        recent_requests=recent[evicted:],
    )
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    if model is not None and model_id is not None and event.id is EventId.REQUEST_COMPLETED:
        model = evolve(model, completed_requests=model.completed_requests + 1)
        state = evolve(state, models=put(state.models, model_id, model))
    return count(state, evicted_recent=evicted), NO_TRANSITIONS


HANDLERS: Final[dict[EventId, Handler]] = {
    **{event_id: on_session for event_id in (*_SESSION_TARGETS, *_SESSION_FACTS, *_SESSION_ENDS)},
    EventId.REQUEST_RECEIVED: on_request_received,
    **{event_id: on_request_step for event_id in _REQUEST_TARGETS},
    EventId.GENERATION_PROGRESS: on_generation_progress,
    EventId.GENERATION_COMPLETED: on_generation_completed,
    **{event_id: on_request_end for event_id in _REQUEST_ENDS},
}
