"""The reducer: `reduce(state, event) -> (state, transitions)`.

Pure and total: it never raises for an unexpected event; an event that does not fit the current
state is counted (`rejected_transitions`, or `duplicate_transitions` when it repeats the current
state) and the state is returned unchanged. Each family declares its allowed moves as data — rows
of (from-states, event id, to-state) in `MoveTable`s (reducer.moves) that its handlers consult —
and states them at the top of its module: models (availability, readiness gating), topology
(stages, topologies), serving (sessions, requests), resources (KV, devices), health (runtime,
event system); node (derived) states its derivation.

After every event the node's availability, the set of available models, the node's capacity (the
lanes of the models that serve) and its resource pressure (a serving model's KV or a device's
memory under pressure) are derived again; a change is announced as a reducer transition
(`node_*`, `available_model_set_changed`, `node_capacity_changed`,
`node_resource_pressure_changed`).
Transitions are projections: they are dispatched, never reduced again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, summaries
from skippyctl.events.reasons import DeliveryClass, Severity
from skippyctl.reducer import health, models, resources, serving, topology
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, transition
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.node import derive_node
from skippyctl.reducer.state import (
    MAX_RECENT_EVENTS,
    SERVING_MODEL_STATES,
    ModelState,
    NodeState,
    RuntimeView,
    available_models,
)

Transitions = tuple[Event, ...]

FAMILIES: Final = (health, models, topology, serving, resources)


def merge_handlers(*maps: Mapping[EventId, Handler]) -> dict[EventId, Handler]:
    """One handler map from the families'; an event id claimed by two families is a programming
    error (a plain dict merge would let the later family silently replace the earlier handler),
    so it fails at import. An event that belongs to two families has one handler that composes
    both (e.g. `resources.on_backend_device_selected`)."""
    merged: dict[EventId, Handler] = {}
    for handlers in maps:
        for event_id, handler in handlers.items():
            if event_id in merged:
                raise ValueError(f"reducer families both handle {event_id.value}")
            merged[event_id] = handler
    return merged


_HANDLERS: Final[dict[EventId, Handler]] = merge_handlers(*(f.HANDLERS for f in FAMILIES))

NODE_EVENTS: Final[dict[NodeState, EventId]] = {
    NodeState.STARTING: EventId.NODE_STARTING,
    NodeState.ACCEPTING: EventId.NODE_ACCEPTING_REQUESTS,
    NodeState.DEGRADED: EventId.NODE_DEGRADED,
    NodeState.UNAVAILABLE: EventId.NODE_UNAVAILABLE,
    NodeState.DRAINING: EventId.NODE_DRAINING,
    NodeState.STOPPED: EventId.NODE_STOPPED,
}

_RECENT_SEVERITIES: Final = frozenset({Severity.WARNING, Severity.ERROR, Severity.FATAL})


def reduce(state: RuntimeView, event: Event) -> tuple[RuntimeView, Transitions]:
    """Apply one event. Never raises for any event; see the family modules for the tables."""
    handler = _HANDLERS.get(event.id)
    if handler is None:
        return _remember(state, (event,)), NO_TRANSITIONS
    before = state
    state, transitions = handler(state, event)
    if _inputs_of_derivation_changed(before, state):
        state, derived = _derive(state, event, available_models(before))
        transitions = transitions + derived
    return _remember(state, (event, *transitions)), transitions


def _inputs_of_derivation_changed(before: RuntimeView, after: RuntimeView) -> bool:
    """Node state depends only on these; the views are immutable, so identity says enough."""
    return (
        after.models is not before.models
        or after.runtime is not before.runtime
        or after.stages is not before.stages
        or after.devices is not before.devices
        or after.topologies is not before.topologies
    )


def _derive(
    state: RuntimeView, cause: Event, before: frozenset[LogicalId]
) -> tuple[RuntimeView, Transitions]:
    out: list[Event] = []
    after = available_models(state)
    if after != before:
        out.append(
            transition(
                EventId.AVAILABLE_MODEL_SET_CHANGED,
                cause,
                None,
                f"{len(after)} available",
                scope=Scope(),
                extra=summaries(count=len(after)),
            )
        )
    node = derive_node(state)
    if node is not state.node:
        out.append(
            transition(NODE_EVENTS[node], cause, state.node.value, node.value, scope=Scope())
        )
        state = evolve(state, node=node)
    serving = [m for m in state.models.values() if m.state in SERVING_MODEL_STATES]
    lanes = sum(m.lanes or 0 for m in serving)
    if lanes != state.node_lanes:
        out.append(
            transition(
                EventId.NODE_CAPACITY_CHANGED,
                cause,
                f"{state.node_lanes} lanes",
                f"{lanes} lanes",
                scope=Scope(),
                extra=summaries(lanes=lanes, count=len(serving)),
            )
        )
        state = evolve(state, node_lanes=lanes)
    pressure = any(m.kv.pressure for m in serving) or any(
        d.memory_pressure for d in state.devices.values()
    )
    if pressure is not state.node_pressure:
        out.append(
            transition(
                EventId.NODE_RESOURCE_PRESSURE_CHANGED,
                cause,
                _PRESSURE[state.node_pressure],
                _PRESSURE[pressure],
                scope=Scope(),
            )
        )
        state = evolve(state, node_pressure=pressure)
    return state, tuple(out)


_PRESSURE: Final = {False: "normal", True: "pressure"}


def _remember(state: RuntimeView, events: tuple[Event, ...]) -> RuntimeView:
    """Keep lifecycle and warning events in the capped recent list (evictions counted)."""
    keep = tuple(
        e
        for e in events
        if e.delivery is DeliveryClass.TERMINAL
        or e.severity in _RECENT_SEVERITIES
        or e.state is not None
    )
    if not keep:
        return state
    recent = state.recent_events + keep
    evicted = len(recent) - MAX_RECENT_EVENTS
    if evicted <= 0:
        return evolve(state, recent_events=recent)
    counters = state.counters
    return evolve(
        state,
        recent_events=recent[evicted:],
        counters=evolve(counters, evicted_recent=counters.evicted_recent + evicted),
    )


def model_state(state: RuntimeView, model_id: LogicalId) -> ModelState | None:
    view = state.models.get(model_id)
    return None if view is None else view.state
