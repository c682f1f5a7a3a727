"""Model availability. Readiness is gated here: native completion is not availability.

    event                                     from                  to            emits
    model_load_requested                      absent | settled      requested
    model_load_started                        requested             loading
    model_load_phase_changed, _progress,
      backend_device_selected,
      model_memory_allocation_summary         loading               loading
    native_model_load_completed              loading              initializing  native_model_loaded
    serving_backend_initialization_started    initializing          initializing
    serving_backend_initialization_completed  initializing          available*    model_available
    model_load_failed,
      serving_backend_initialization_failed   requested..init.      failed
    model_load_cancelled                      requested..init.      cancelled
    engine_process_crashed                    available | degraded  unavailable   model_unavailable
    topology_ready                            initializing*         available     model_available
                                              degraded|unavailable* available     model_available
    topology_degraded                         available             degraded      model_degraded
    topology_unavailable                      available | degraded  unavailable   model_unavailable
    unload_requested                          serving | unavailable unloading
    unload_completed                          unloading             unloaded
    unload_failed                             unloading             unavailable   model_unavailable

(*) a model served by a topology becomes available only when both its serving backend and its
topology are ready. "settled" = failed, cancelled, unloaded, unavailable.
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

_UNLOADABLE: Final = SERVING_MODEL_STATES | {ModelState.UNAVAILABLE}


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
    extra = summaries(context_tokens=view.context_tokens, lanes=view.lanes)
    return transition(
        event_id,
        cause,
        previous.value,
        view.state.value,
        scope=scope,
        outcome=outcome,
        duration_ms=duration_ms,
        extra=extra if event_id is EventId.MODEL_AVAILABLE else (),
    )


def _move(
    state: RuntimeView,
    event: Event,
    allowed: frozenset[ModelState],
    target: ModelState,
    amend: Callable[[ModelView], ModelView] = lambda view: view,
) -> tuple[RuntimeView, ModelView | None, ModelState | None]:
    view = _model_of(state, event)
    if view is None or view.state not in allowed:
        return state, None, None
    foreign = event.operation_id is not None and view.operation_id not in (None, event.operation_id)
    if foreign and event.id not in _ANY_OPERATION:
        return state, None, None
    moved = amend(evolve(view, state=target, updated_mono_ns=event.mono_ns))
    return _store(state, moved), moved, view.state


# Events that concern the model whatever operation loaded it.
_ANY_OPERATION: Final = frozenset(
    {
        EventId.ENGINE_PROCESS_CRASHED,
        EventId.UNLOAD_REQUESTED,
        EventId.UNLOAD_COMPLETED,
        EventId.UNLOAD_FAILED,
    }
)


def _is_duplicate(state: RuntimeView, event: Event, target: ModelState) -> bool:
    view = _model_of(state, event)
    return view is not None and view.state is target


def on_load_requested(state: RuntimeView, event: Event) -> Step:
    model_id = event.scope.model_id
    if model_id is None:
        return reject(state)
    current = state.models.get(model_id)
    if current is not None and current.state not in SETTLED_MODEL_STATES:
        return reject(state, duplicate=current.operation_id == event.operation_id)
    view = ModelView(
        model_id=model_id,
        state=ModelState.REQUESTED,
        operation_id=event.operation_id,
        topology_id=event.scope.topology_id,
        requested_mono_ns=event.mono_ns,
        updated_mono_ns=event.mono_ns,
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
    new, moved, _ = _move(state, event, frozenset({ModelState.REQUESTED}), ModelState.LOADING)
    if moved is None:
        return reject(state, duplicate=_is_duplicate(state, event, ModelState.LOADING))
    return new, NO_TRANSITIONS


def on_loading_fact(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or view.state is not ModelState.LOADING:
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
    new, moved, previous = _move(
        state,
        event,
        frozenset({ModelState.LOADING}),
        ModelState.INITIALIZING,
        lambda view: evolve(
            view,
            model_size_bytes=None if size is None else int(size),
            parameters=None if params is None else int(params),
        ),
    )
    if moved is None or previous is None:
        return reject(state, duplicate=_is_duplicate(state, event, ModelState.INITIALIZING))
    return new, (_announce(EventId.NATIVE_MODEL_LOADED, moved, previous, event),)


def on_backend_started(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or view.state is not ModelState.INITIALIZING:
        return reject(state)
    return state, NO_TRANSITIONS


def _topology_ready(state: RuntimeView, view: ModelView) -> bool:
    if view.topology_id is None:
        return True
    topology = state.topologies.get(view.topology_id)
    return topology is not None and topology.state is TopologyState.READY


def _load_duration_ms(view: ModelView, now_ns: int) -> float | None:
    if view.requested_mono_ns is None:
        return None
    return round((now_ns - view.requested_mono_ns) / 1e6, 3)


def on_backend_completed(state: RuntimeView, event: Event) -> Step:
    view = _model_of(state, event)
    if view is None or view.state is not ModelState.INITIALIZING or view.backend_ready:
        return reject(state, duplicate=view is not None and view.backend_ready)
    if event.operation_id is not None and view.operation_id != event.operation_id:
        return reject(state)
    ctx = event.summary_value(SummaryKey.CONTEXT_TOKENS)
    lanes = event.summary_value(SummaryKey.LANES)
    ready = evolve(
        view,
        backend_ready=True,
        context_tokens=None if ctx is None else int(ctx),
        lanes=None if lanes is None else int(lanes),
        updated_mono_ns=event.mono_ns,
    )
    if not _topology_ready(state, ready):
        return _store(state, ready), NO_TRANSITIONS
    return _become_available(state, ready, event)


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
    return _store(state, available), (announce,)


def settle_load(target: ModelState) -> Handler:
    def handler(state: RuntimeView, event: Event) -> Step:
        new, moved, _ = _move(
            state,
            event,
            LOADING_MODEL_STATES,
            target,
            lambda view: evolve(view, reason_code=event.reason_code),
        )
        if moved is None:
            return reject(state, duplicate=_is_duplicate(state, event, target))
        return new, NO_TRANSITIONS

    return handler


def on_engine_crashed(state: RuntimeView, event: Event) -> Step:
    new, moved, previous = _move(
        state,
        event,
        SERVING_MODEL_STATES | {ModelState.UNLOADING},
        ModelState.UNAVAILABLE,
        lambda view: evolve(view, reason_code=event.reason_code, backend_ready=False),
    )
    if moved is None or previous is None:
        return state, NO_TRANSITIONS  # a crash during a load is settled by model_load_failed
    return new, (
        _announce(EventId.MODEL_UNAVAILABLE, moved, previous, event, outcome=Outcome.FAILURE),
    )


def on_topology_changed(
    state: RuntimeView, event: Event, topology: LogicalId, to: TopologyState
) -> Step:
    """Project a topology's new state onto the models it serves."""
    transitions: list[Event] = []
    for view in list(state.models.values()):
        if view.topology_id != topology:
            continue
        target: ModelState | None = None
        announce: EventId | None = None
        if (
            to is TopologyState.READY
            and view.backend_ready
            and view.state
            in (
                ModelState.INITIALIZING,
                ModelState.DEGRADED,
                ModelState.UNAVAILABLE,
            )
        ):
            state, emitted = _become_available(state, view, event)
            transitions.extend(emitted)
            continue
        if to is TopologyState.DEGRADED and view.state is ModelState.AVAILABLE:
            target, announce = ModelState.DEGRADED, EventId.MODEL_DEGRADED
        elif to is TopologyState.UNAVAILABLE and view.state in SERVING_MODEL_STATES:
            target, announce = ModelState.UNAVAILABLE, EventId.MODEL_UNAVAILABLE
        if target is None or announce is None:
            continue
        moved = evolve(view, state=target, updated_mono_ns=event.mono_ns)
        state = _store(state, moved)
        transitions.append(_announce(announce, moved, view.state, event))
    return state, tuple(transitions)


def on_unload_requested(state: RuntimeView, event: Event) -> Step:
    new, moved, _ = _move(state, event, _UNLOADABLE, ModelState.UNLOADING)
    if moved is None:
        return reject(state, duplicate=_is_duplicate(state, event, ModelState.UNLOADING))
    return new, NO_TRANSITIONS


def on_unload_completed(state: RuntimeView, event: Event) -> Step:
    new, moved, _ = _move(
        state,
        event,
        frozenset({ModelState.UNLOADING}),
        ModelState.UNLOADED,
        lambda view: evolve(view, backend_ready=False, progress=None),
    )
    if moved is None:
        return reject(state, duplicate=_is_duplicate(state, event, ModelState.UNLOADED))
    return new, NO_TRANSITIONS


def on_unload_failed(state: RuntimeView, event: Event) -> Step:
    new, moved, previous = _move(
        state,
        event,
        frozenset({ModelState.UNLOADING}),
        ModelState.UNAVAILABLE,
        lambda view: evolve(view, reason_code=event.reason_code),
    )
    if moved is None or previous is None:
        return reject(state)
    return new, (
        _announce(EventId.MODEL_UNAVAILABLE, moved, previous, event, outcome=Outcome.FAILURE),
    )


HANDLERS: Final[dict[EventId, Handler]] = {
    EventId.MODEL_LOAD_REQUESTED: on_load_requested,
    EventId.MODEL_LOAD_STARTED: on_load_started,
    EventId.MODEL_LOAD_PHASE_CHANGED: on_loading_fact,
    EventId.MODEL_LOAD_PROGRESS: on_loading_fact,
    EventId.MODEL_MEMORY_ALLOCATION_SUMMARY: on_loading_fact,
    EventId.NATIVE_MODEL_LOAD_COMPLETED: on_native_completed,
    EventId.SERVING_BACKEND_INITIALIZATION_STARTED: on_backend_started,
    EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED: on_backend_completed,
    EventId.MODEL_LOAD_FAILED: settle_load(ModelState.FAILED),
    EventId.SERVING_BACKEND_INITIALIZATION_FAILED: settle_load(ModelState.FAILED),
    EventId.MODEL_LOAD_CANCELLED: settle_load(ModelState.CANCELLED),
    EventId.ENGINE_PROCESS_CRASHED: on_engine_crashed,
    EventId.UNLOAD_REQUESTED: on_unload_requested,
    EventId.UNLOAD_COMPLETED: on_unload_completed,
    EventId.UNLOAD_FAILED: on_unload_failed,
}
