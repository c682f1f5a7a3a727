"""Model availability. Readiness is gated here: native completion is not availability.

The allowed moves are the rows of `MOVES` (reducer.moves); the handlers look each event up there
and make the field updates. An event of another operation than the one loading the model is
refused, except a crash or an unload (they concern the model whatever loaded it).

    model                                     from → to
    model_load_requested                      absent | settled → requested
    model_load_started                        requested → loading
    model_load_phase_changed                  loading → same
      model_load_progress
      backend_device_selected
      model_memory_allocation_summary
    model_load_phase_changed                  initializing → same — context phases and buffers
      model_memory_allocation_summary
    native_model_load_completed               loading → initializing, announces native_model_loaded
    serving_backend_initialization_started    initializing → same
    serving_backend_initialization_completed  initializing → available, announces model_available —
                                                once its topology is ready or degraded (*)
    model_load_failed                         in load → failed
      serving_backend_initialization_failed
    model_load_cancelled                      in load → cancelled
    engine_process_crashed                    serving | unloading → unavailable, announces
                                                model_unavailable — otherwise ignored (**)
    model_recovery_failed                     unavailable → failed — the runtime stopped restarting
                                                its engine (crash_loop)
    model_recovery_failed                     failed → same — its last restart's load failed: the
                                                reason becomes crash_loop
    model_recovery_failed                     serving → same — a silent engine that then exited: its
                                                crash follows
    topology_ready                            initializing | degraded | unavailable → available,
                                                announces model_available — once its backend is
                                                ready (*)
    topology_degraded                         available → degraded, announces model_degraded
    topology_unavailable                      serving → unavailable, announces model_unavailable
    unload_requested                          serving | unavailable → unloading
    unload_completed                          unloading → unloaded
    unload_failed                             unloading → unavailable, announces model_unavailable

"settled" = failed | cancelled | unloaded | unavailable; "in load" = requested | loading |
initializing; "serving" = available | degraded.
(*) a model served by a topology becomes available only when both its serving backend and its
topology are ready; a backend that completes first is recorded as ready and the model waits. A
topology already degraded when the backend completes (a slow stage link found at once) serves
too: the model becomes available and at once degraded (model_available, model_degraded).
(**) a crash during a load is not a rejection: that load is settled by model_load_failed.
A restart of a crashed engine (``load --restart on-failure``) is a new load of the model:
model_recovery_started marks the view's ``recovery_attempt``, the restart's model_load_requested
keeps it, and model_recovery_completed or _failed ends it (a failed restart's load has the
model failed already: model_recovery_failed then gives it its reason).
The topology_* rows project a topology's new state (topology.py) onto the models it serves: a
model no row fits stays as it is, which is not a rejection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, SummaryKey, summaries
from skippyctl.events.reasons import Outcome
from skippyctl.reducer.common import (
    NO_TRANSITIONS,
    Handler,
    Step,
    bounded_put,
    count,
    put,
    reject,
    transition,
)
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.moves import ABSENT, SAME, Effect, Move, MoveTable, moves
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    MAX_MODELS,
    SERVING_MODEL_STATES,
    SETTLED_MODEL_STATES,
    ModelState,
    ModelView,
    RuntimeView,
    TopologyState,
)

_E = EventId
_M = ModelState

MOVES: Final[MoveTable[ModelState]] = MoveTable(
    "model",
    ModelState,
    (
        Move(frozenset({ABSENT, *SETTLED_MODEL_STATES}), _E.MODEL_LOAD_REQUESTED, _M.REQUESTED),
        Move(frozenset({_M.REQUESTED}), _E.MODEL_LOAD_STARTED, _M.LOADING),
        *moves(
            {_M.LOADING},
            (
                _E.MODEL_LOAD_PHASE_CHANGED,
                _E.MODEL_LOAD_PROGRESS,
                _E.BACKEND_DEVICE_SELECTED,
                _E.MODEL_MEMORY_ALLOCATION_SUMMARY,
            ),
            SAME,
        ),
        *moves(
            {_M.INITIALIZING},
            (_E.MODEL_LOAD_PHASE_CHANGED, _E.MODEL_MEMORY_ALLOCATION_SUMMARY),
            SAME,
            note="context phases and buffers",
        ),
        Move(
            frozenset({_M.LOADING}),
            _E.NATIVE_MODEL_LOAD_COMPLETED,
            _M.INITIALIZING,
            _E.NATIVE_MODEL_LOADED,
        ),
        Move(frozenset({_M.INITIALIZING}), _E.SERVING_BACKEND_INITIALIZATION_STARTED, SAME),
        Move(
            frozenset({_M.INITIALIZING}),
            _E.SERVING_BACKEND_INITIALIZATION_COMPLETED,
            _M.AVAILABLE,
            _E.MODEL_AVAILABLE,
            "once its topology is ready or degraded (*)",
        ),
        *moves(
            LOADING_MODEL_STATES,
            (_E.MODEL_LOAD_FAILED, _E.SERVING_BACKEND_INITIALIZATION_FAILED),
            _M.FAILED,
        ),
        Move(LOADING_MODEL_STATES, _E.MODEL_LOAD_CANCELLED, _M.CANCELLED),
        Move(
            SERVING_MODEL_STATES | {_M.UNLOADING},
            _E.ENGINE_PROCESS_CRASHED,
            _M.UNAVAILABLE,
            _E.MODEL_UNAVAILABLE,
            "otherwise ignored (**)",
        ),
        Move(
            frozenset({_M.UNAVAILABLE}),
            _E.MODEL_RECOVERY_FAILED,
            _M.FAILED,
            None,
            "the runtime stopped restarting its engine (crash_loop)",
        ),
        Move(
            frozenset({_M.FAILED}),
            _E.MODEL_RECOVERY_FAILED,
            SAME,
            None,
            "its last restart's load failed: the reason becomes crash_loop",
        ),
        Move(
            SERVING_MODEL_STATES,
            _E.MODEL_RECOVERY_FAILED,
            SAME,
            None,
            "a silent engine that then exited: its crash follows",
        ),
        Move(
            frozenset({_M.INITIALIZING, _M.DEGRADED, _M.UNAVAILABLE}),
            _E.TOPOLOGY_READY,
            _M.AVAILABLE,
            _E.MODEL_AVAILABLE,
            "once its backend is ready (*)",
        ),
        Move(frozenset({_M.AVAILABLE}), _E.TOPOLOGY_DEGRADED, _M.DEGRADED, _E.MODEL_DEGRADED),
        Move(SERVING_MODEL_STATES, _E.TOPOLOGY_UNAVAILABLE, _M.UNAVAILABLE, _E.MODEL_UNAVAILABLE),
        Move(SERVING_MODEL_STATES | {_M.UNAVAILABLE}, _E.UNLOAD_REQUESTED, _M.UNLOADING),
        Move(frozenset({_M.UNLOADING}), _E.UNLOAD_COMPLETED, _M.UNLOADED),
        Move(frozenset({_M.UNLOADING}), _E.UNLOAD_FAILED, _M.UNAVAILABLE, _E.MODEL_UNAVAILABLE),
    ),
    groups={
        "settled": SETTLED_MODEL_STATES,
        "in load": LOADING_MODEL_STATES,
        "serving": SERVING_MODEL_STATES,
    },
)
MOVE_TABLES: Final = (MOVES,)


_WITH_CAPACITY: Final = frozenset({EventId.MODEL_AVAILABLE, EventId.MODEL_CAPACITY_CHANGED})
"""Announcements that carry the model's context and lanes."""


def _model_of(state: RuntimeView, event: Event) -> ModelView | None:
    model_id = event.scope.model_id
    return None if model_id is None else state.models.get(model_id)


def _store(state: RuntimeView, view: ModelView) -> RuntimeView:
    return evolve(state, models=put(state.models, view.model_id, view))


def _announce(
    event_id: EventId,
    view: ModelView,
    previous: ModelState,
    cause: Event,
    outcome: Outcome | None = None,
    duration_ms: float | None = None,
) -> Event:
    scope = Scope(model_id=view.model_id, device_id=view.device_id, topology_id=view.topology_id)
    extra = summaries(
        context_tokens=view.context_tokens,
        lanes=view.lanes,
        context_tokens_per_lane=view.context_tokens_per_lane,
    )
    return transition(
        event_id,
        cause,
        previous.value,
        view.state.value,
        scope=scope,
        outcome=outcome,
        duration_ms=duration_ms,
        extra=extra if event_id in _WITH_CAPACITY else (),
    )


def _move(
    state: RuntimeView,
    event: Event,
    amend: Callable[[ModelView], ModelView] = lambda view: view,
) -> tuple[RuntimeView, ModelView, ModelState, Move[ModelState]] | None:
    """The table's move of the event's model to another state; None when there is none."""
    view = _model_of(state, event)
    if view is None:
        return None
    row = MOVES.find(event.id, view.state)
    if row is None or isinstance(row.target, Effect):
        return None
    foreign = event.operation_id is not None and view.operation_id not in (None, event.operation_id)
    if foreign and event.id not in _ANY_OPERATION:
        return None
    moved = amend(evolve(view, state=row.target, updated_mono_ns=event.mono_ns))
    return _store(state, moved), moved, view.state, row


def _announced(
    row: Move[ModelState],
    view: ModelView,
    previous: ModelState,
    cause: Event,
    outcome: Outcome | None = None,
) -> tuple[Event, ...]:
    """The row's announcement, if it makes one."""
    if row.emits is None:
        return NO_TRANSITIONS
    return (_announce(row.emits, view, previous, cause, outcome=outcome),)


# Events that concern the model whatever operation loaded it.
_ANY_OPERATION: Final = frozenset(
    {
        EventId.ENGINE_PROCESS_CRASHED,
        EventId.UNLOAD_REQUESTED,
        EventId.UNLOAD_COMPLETED,
        EventId.UNLOAD_FAILED,
    }
)


def _is_duplicate(state: RuntimeView, event: Event) -> bool:
    """The model already is where the event leads."""
    view = _model_of(state, event)
    return view is not None and MOVES.repeats(event.id, view.state)


def _allows(view: ModelView | None, event: Event) -> bool:
    return view is not None and MOVES.find(event.id, view.state) is not None


def on_load_requested(state: RuntimeView, event: Event) -> Step:
    model_id = event.scope.model_id
    if model_id is None:
        return reject(state)
    current = state.models.get(model_id)
    if current is not None and MOVES.find(event.id, current.state) is None:
        return reject(state, duplicate=current.operation_id == event.operation_id)
    view = ModelView(
        model_id=model_id,
        state=ModelState.REQUESTED,
        operation_id=event.operation_id,
        topology_id=event.scope.topology_id,
        requested_mono_ns=event.mono_ns,
        updated_mono_ns=event.mono_ns,
        settings=event.settings,
    )
    if current is not None and current.recovery_attempt is not None:
        # The runtime's restart of a crashed engine: the recovery goes on through this load.
        view = evolve(
            view,
            recovery_attempt=current.recovery_attempt,
            restarts=current.restarts,
            served_capacity=current.served_capacity or (current.context_tokens, current.lanes),
        )
    placed = bounded_put(
        state.models,
        model_id,
        view,
        MAX_MODELS,
        lambda m: m.state in SETTLED_MODEL_STATES,
        lambda m: m.updated_mono_ns,
    )
    if placed is None:
        return reject(state)
    models, evicted = placed
    return count(evolve(state, models=models), evicted_models=evicted), NO_TRANSITIONS


def on_load_started(state: RuntimeView, event: Event) -> Step:
    step = _move(state, event)
    if step is None:
        return reject(state, duplicate=_is_duplicate(state, event))
    return step[0], NO_TRANSITIONS


def on_loading_fact(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or not _allows(view, event):
        return reject(state)
    if event.operation_id is not None and view.operation_id != event.operation_id:
        return reject(state)
    updated = evolve(view, updated_mono_ns=event.mono_ns)
    if event.progress is not None:
        if view.progress is not None and event.progress.current <= view.progress.current:
            return reject(state, duplicate=True)
        updated = evolve(updated, progress=event.progress)
    if event.id is EventId.BACKEND_DEVICE_SELECTED:
        free = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
        total = event.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
        updated = evolve(
            updated,
            device_id=event.scope.device_id,
            device_memory_free_bytes=None if free is None else int(free),
            device_memory_total_bytes=None if total is None else int(total),
        )
    return _store(state, updated), NO_TRANSITIONS


def on_native_completed(state: RuntimeView, event: Event) -> Step:
    size = event.summary_value(SummaryKey.MODEL_SIZE_BYTES)
    params = event.summary_value(SummaryKey.PARAMETERS)
    step = _move(
        state,
        event,
        lambda view: evolve(
            view,
            model_size_bytes=None if size is None else int(size),
            parameters=None if params is None else int(params),
            chat_template=event.settings or view.chat_template,
        ),
    )
    if step is None:
        return reject(state, duplicate=_is_duplicate(state, event))
    new, moved, previous, row = step
    return new, _announced(row, moved, previous, event)


def on_backend_started(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or not _allows(view, event):
        return reject(state)
    return state, NO_TRANSITIONS


def _topology_state(state: RuntimeView, view: ModelView) -> TopologyState | None:
    topology = None if view.topology_id is None else state.topologies.get(view.topology_id)
    return None if topology is None else topology.state


def _topology_ready(state: RuntimeView, view: ModelView) -> bool:
    """No topology, or one that serves (ready, or degraded: a slow link still serves)."""
    if view.topology_id is None:
        return True
    return _topology_state(state, view) in (TopologyState.READY, TopologyState.DEGRADED)


def _load_duration_ms(view: ModelView, now_ns: int) -> float | None:
    if view.requested_mono_ns is None:
        return None
    return round((now_ns - view.requested_mono_ns) / 1e6, 3)


def on_backend_completed(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or not _allows(view, event) or view.backend_ready:
        return reject(state, duplicate=view is not None and view.backend_ready)
    if event.operation_id is not None and view.operation_id != event.operation_id:
        return reject(state)
    ctx = event.summary_value(SummaryKey.CONTEXT_TOKENS)
    lanes = event.summary_value(SummaryKey.LANES)
    per_lane = event.summary_value(SummaryKey.CONTEXT_TOKENS_PER_LANE)
    invariant = event.summary_value(SummaryKey.BATCH_INVARIANT)
    ready = evolve(
        view,
        backend_ready=True,
        context_tokens=None if ctx is None else int(ctx),
        lanes=None if lanes is None else int(lanes),
        context_tokens_per_lane=None if per_lane is None else int(per_lane),
        batch_invariant=None if invariant is None else bool(invariant),
        updated_mono_ns=event.mono_ns,
    )
    if not _topology_ready(state, ready):
        return _store(state, ready), NO_TRANSITIONS
    state, announced = _become_available(state, ready, event)
    if _topology_state(state, ready) is not TopologyState.DEGRADED:
        return state, announced
    available = state.models[ready.model_id]
    row = MOVES.find(EventId.TOPOLOGY_DEGRADED, ModelState.AVAILABLE)
    if row is None or not isinstance(row.target, ModelState):  # the tables say no such move
        return state, announced
    degraded = evolve(available, state=row.target, updated_mono_ns=event.mono_ns)
    return _store(state, degraded), announced + _announced(
        row, degraded, ModelState.AVAILABLE, event
    )


def _become_available(state: RuntimeView, view: ModelView, cause: Event) -> Step:
    duration = _load_duration_ms(view, cause.mono_ns) if view.load_duration_ms is None else None
    available = evolve(
        view,
        state=ModelState.AVAILABLE,
        reason_code=None,
        load_duration_ms=view.load_duration_ms if duration is None else duration,
        updated_mono_ns=cause.mono_ns,
    )
    announce = _announce(
        EventId.MODEL_AVAILABLE,
        available,
        view.state,
        cause,
        outcome=Outcome.SUCCESS,
        duration_ms=duration,
    )
    before = view.served_capacity
    if before is None:
        return _store(state, available), (announce,)
    available = evolve(available, served_capacity=None)
    if before == (available.context_tokens, available.lanes):
        return _store(state, available), (announce,)
    # A restart that planned another context (free memory changed since): what it serves now.
    changed = _announce(EventId.MODEL_CAPACITY_CHANGED, available, ModelState.AVAILABLE, cause)
    return _store(state, available), (announce, changed)


def on_load_settled(state: RuntimeView, event: Event) -> Step:
    step = _move(state, event, lambda view: evolve(view, reason_code=event.reason_code))
    if step is None:
        return reject(state, duplicate=_is_duplicate(state, event))
    return step[0], NO_TRANSITIONS


def on_engine_crashed(state: RuntimeView, event: Event) -> Step:
    step = _move(
        state,
        event,
        lambda view: evolve(view, reason_code=event.reason_code, backend_ready=False),
    )
    if step is None:
        return state, NO_TRANSITIONS  # a crash during a load is settled by model_load_failed
    new, moved, previous, row = step
    return new, _announced(row, moved, previous, event, outcome=Outcome.FAILURE)


def on_recovery_started(state: RuntimeView, event: Event) -> Step:
    """A restart of the model's engine is under way (its number in ``attempt``); an engine
    that went silent is waited for without one."""
    view = _model_of(state, event)
    attempt = event.summary_value(SummaryKey.ATTEMPT)
    if view is None or attempt is None:
        return state, NO_TRANSITIONS
    restarting = evolve(view, recovery_attempt=int(attempt), restarts=view.restarts + 1)
    return _store(state, restarting), NO_TRANSITIONS


def on_recovery_completed(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None:
        return state, NO_TRANSITIONS
    return _store(state, evolve(view, recovery_attempt=None)), NO_TRANSITIONS


def on_recovery_failed(state: RuntimeView, event: Event) -> Step:
    """The runtime stopped restarting the model: it is failed, with the reason."""
    view = _model_of(state, event)
    row = None if view is None else MOVES.find(event.id, view.state)
    if view is None or row is None:
        return reject(state)

    def ended(failed: ModelView) -> ModelView:
        return evolve(failed, recovery_attempt=None, reason_code=event.reason_code)

    if row.target is SAME:
        kept = (
            ended(view) if view.state is ModelState.FAILED else evolve(view, recovery_attempt=None)
        )
        return _store(state, kept), NO_TRANSITIONS
    step = _move(state, event, ended)
    if step is None:
        return reject(state)
    new, moved, previous, row = step
    return new, _announced(row, moved, previous, event, outcome=Outcome.FAILURE)


def on_topology_changed(state: RuntimeView, event: Event, topology: LogicalId) -> Step:
    """Project a topology's new state (the event) onto the models it serves."""
    transitions: list[Event] = []
    for view in list(state.models.values()):
        if view.topology_id != topology:
            continue
        row = MOVES.find(event.id, view.state)
        if row is None or isinstance(row.target, Effect):
            continue
        if row.target is ModelState.AVAILABLE:
            if view.backend_ready:
                state, emitted = _become_available(state, view, event)
                transitions.extend(emitted)
            continue
        moved = evolve(view, state=row.target, updated_mono_ns=event.mono_ns)
        state = _store(state, moved)
        transitions.extend(_announced(row, moved, view.state, event))
    return state, tuple(transitions)


def on_idle_timer(state: RuntimeView, event: Event) -> Step:
    """``model_idle_timer_started`` / ``_cleared``: when a serving model unloads if unused."""
    view = _model_of(state, event)
    if view is None or view.state not in SERVING_MODEL_STATES:
        return reject(state)
    ttl = event.summary_value(SummaryKey.IDLE_TTL_MS)
    if event.id is EventId.MODEL_IDLE_TIMER_STARTED and ttl is not None:
        expires: int | None = event.wall_ns + int(ttl * 1e6)
    else:
        ttl, expires = None, None
    idle = evolve(view, idle_ttl_ms=ttl, idle_expires_wall_ns=expires)
    return _store(state, idle), NO_TRANSITIONS


def on_unload_requested(state: RuntimeView, event: Event) -> Step:
    step = _move(
        state, event, lambda view: evolve(view, idle_ttl_ms=None, idle_expires_wall_ns=None)
    )
    if step is None:
        return reject(state, duplicate=_is_duplicate(state, event))
    return step[0], NO_TRANSITIONS


def on_unload_completed(state: RuntimeView, event: Event) -> Step:
    # The reason stays with the unloaded model when the runtime unloaded it on its own account
    # (idle, max_models, memory_budget): `ps` and the dashboard say why it is gone.
    step = _move(
        state,
        event,
        lambda view: evolve(
            view, backend_ready=False, progress=None, reason_code=event.reason_code
        ),
    )
    if step is None:
        return reject(state, duplicate=_is_duplicate(state, event))
    return step[0], NO_TRANSITIONS


def on_unload_failed(state: RuntimeView, event: Event) -> Step:
    step = _move(state, event, lambda view: evolve(view, reason_code=event.reason_code))
    if step is None:
        return reject(state)  # unavailable already: a misfit, not a repeat (no unload is pending)
    new, moved, previous, row = step
    return new, _announced(row, moved, previous, event, outcome=Outcome.FAILURE)


HANDLERS: Final[dict[EventId, Handler]] = {
    EventId.MODEL_LOAD_REQUESTED: on_load_requested,
    EventId.MODEL_LOAD_STARTED: on_load_started,
    EventId.MODEL_LOAD_PHASE_CHANGED: on_loading_fact,
    EventId.MODEL_LOAD_PROGRESS: on_loading_fact,
    EventId.MODEL_MEMORY_ALLOCATION_SUMMARY: on_loading_fact,
    EventId.NATIVE_MODEL_LOAD_COMPLETED: on_native_completed,
    EventId.SERVING_BACKEND_INITIALIZATION_STARTED: on_backend_started,
    EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED: on_backend_completed,
    EventId.MODEL_LOAD_FAILED: on_load_settled,
    EventId.SERVING_BACKEND_INITIALIZATION_FAILED: on_load_settled,
    EventId.MODEL_LOAD_CANCELLED: on_load_settled,
    EventId.ENGINE_PROCESS_CRASHED: on_engine_crashed,
    EventId.MODEL_RECOVERY_STARTED: on_recovery_started,
    EventId.MODEL_RECOVERY_COMPLETED: on_recovery_completed,
    EventId.MODEL_RECOVERY_FAILED: on_recovery_failed,
    EventId.UNLOAD_REQUESTED: on_unload_requested,
    EventId.MODEL_IDLE_TIMER_STARTED: on_idle_timer,
    EventId.MODEL_IDLE_TIMER_CLEARED: on_idle_timer,
    EventId.UNLOAD_COMPLETED: on_unload_completed,
    EventId.UNLOAD_FAILED: on_unload_failed,
}
