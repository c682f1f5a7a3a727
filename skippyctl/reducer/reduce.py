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

`BatchReducer` reduces a batch of events (one drained native batch, one pipeline cycle) with the
same result, state and transitions, as `reduce` event by event, into a working copy that the
batch's later events update in place (reducer.immutable.Draft), and publishes one immutable
snapshot at the end of the batch. Only `revise`/`revise_item`/`remove_item` call sites update
in place: the root view, the counters (`common.count`), the bounded maps (`common.bounded_put`),
the node derivation, the KV path (`resources.on_kv`) and the serving family's sessions and
requests (`serving`: a request event is the commonest event a real runtime emits, so it must
not copy the request map and the root view once per event).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from skippyctl.events.catalog import CATALOG, EventId
from skippyctl.events.envelope import NO_SCOPE, Event, LogicalId, summaries
from skippyctl.events.reasons import DeliveryClass, Severity
from skippyctl.reducer import health, models, plugins, resources, serving, topology
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, transition
from skippyctl.reducer.immutable import Draft, activate, deactivate, evolve, revise
from skippyctl.reducer.node import derive_node
from skippyctl.reducer.state import (
    MAX_RECENT_EVENTS,
    SERVING_MODEL_STATES,
    ModelState,
    ModelView,
    NodeState,
    RuntimeView,
    available_models,
)

Transitions = tuple[Event, ...]

FAMILIES: Final = (health, models, topology, serving, resources, plugins)


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
_TERMINAL_IDS: Final = frozenset(
    spec.id for spec in CATALOG.values() if spec.delivery is DeliveryClass.TERMINAL
)
"""`event.delivery is TERMINAL` without the catalog lookup (`_is_remembered` runs per event)."""


def reduce(state: RuntimeView, event: Event) -> tuple[RuntimeView, Transitions]:
    """Apply one event. Never raises for any event; see the family modules for the tables."""
    handler = _HANDLERS.get(event.id)
    if handler is None:
        return _remember(state, (event,)), NO_TRANSITIONS
    before = state
    state, transitions = handler(state, event)
    if _inputs_of_derivation_changed(before, state):
        state, derived, _ = _derive(state, event, available_models(before))
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


class BatchReducer:
    """`reduce` over a batch of events into a working copy; `publish` ends the batch.

    Between two `publish` calls the events update a working copy: what the batch copied it
    updates in place (reducer.immutable.Draft), so a batch of N distinct KV transitions copies
    the root view, the models map, the model's view and its KV view once, not N times. The
    capped recent-events list is collected in a list and trimmed once, at `publish`.

    Exactly `reduce` event by event: the published state equals the state `reduce` would
    return after the same events, and each call returns the transitions `reduce` would. The
    working state each call returns equals `reduce`'s too, except `recent_events` and
    `counters.evicted_recent`, which catch up at `publish`; it is valid until the next call
    and must not be kept (it changes in place). A snapshot `publish` returned is never written
    again. One thread at a time.

    Total like `reduce`: should a handler raise anyway (a defect), the working copy may be
    half-updated, so the batch's earlier events are reduced again from its start, one at a time
    with plain `reduce`, and the exception is re-raised for the caller to count; the event that
    raised is left out, as `reduce`'s callers leave it out. (The transitions those events kept
    in the recent list are then made again: equal to the dispatched ones but for their clocks.)
    """

    __slots__ = (
        "_base",
        "_state",
        "_draft",
        "_remembered",
        "_reduced",
        "_available",
        "_unpublished",
    )

    def __init__(self, state: RuntimeView) -> None:
        self._begin(state)
        self._unpublished = False

    def _begin(self, state: RuntimeView) -> None:
        self._base = state
        """The immutable state the batch started from (the last published snapshot)."""
        self._state = state
        self._draft = Draft()
        self._remembered: list[Event] = []
        self._reduced: list[Event] = []
        """The batch's events so far, to reduce again should a handler raise."""
        self._available: frozenset[LogicalId] | None = None
        """The available models after the batch's last derivation (None: the base's)."""

    @property
    def state(self) -> RuntimeView:
        """The working state (see the class docstring: do not keep it)."""
        return self._state

    @property
    def pending(self) -> bool:
        """Whether events were reduced since the last `publish`."""
        return self._unpublished

    def reduce(self, event: Event) -> tuple[RuntimeView, Transitions]:
        """Apply one event to the working copy; returns it and the event's transitions."""
        handler = _HANDLERS.get(event.id)
        if handler is None:
            # No family reads it (a per-token debug event, most of a real runtime's stream):
            # only the recent list may keep it, so the draft need not be entered.
            if _is_remembered(event):
                self._remembered.append(event)
            self._reduced.append(event)
            self._unpublished = True
            return self._state, NO_TRANSITIONS
        draft = self._draft
        draft.begin_event()
        activate(draft)
        try:
            state, transitions = self._apply(draft, self._state, event, handler)
        except Exception:
            deactivate()
            self._reduce_again()
            raise
        deactivate()
        self._state = state
        self._reduced.append(event)
        self._unpublished = True
        return state, transitions

    def _apply(
        self, draft: Draft, state: RuntimeView, event: Event, handler: Handler
    ) -> tuple[RuntimeView, Transitions]:
        # The handler may update `state` in place: keep what the derivation compares.
        models, runtime, stages = state.models, state.runtime, state.stages
        devices, topologies = state.devices, state.topologies
        state, transitions = handler(state, event)
        if (
            state.models is not models
            or state.runtime is not runtime
            or state.stages is not stages
            or state.devices is not devices
            or state.topologies is not topologies
            or draft.updated_any((models, stages, devices, topologies))
        ):
            # Models change only with a derivation, so the set of the last one (or the
            # base's) is the set before this event.
            before = self._available
            if before is None:
                before = available_models(self._base)
            state, derived, self._available = _derive(state, event, before)
            transitions = transitions + derived
        self._remember(event, transitions)
        return state, transitions

    def _remember(self, event: Event, transitions: Transitions) -> None:
        remembered = self._remembered
        if _is_remembered(event):
            remembered.append(event)
        if transitions:
            remembered.extend(t for t in transitions if _is_remembered(t))

    def publish(self) -> RuntimeView:
        """End the batch: the immutable snapshot of everything reduced so far. The next event
        starts a new batch from it."""
        state = self._state
        if self._remembered:
            state = _remember(state, tuple(self._remembered))
        self._begin(state)
        self._unpublished = False
        return state

    def _reduce_again(self) -> None:
        """The batch's events so far (not the one that raised), from its start, one at a time."""
        events, state = self._reduced, self._base
        self._begin(state)  # should this fail too, the batch goes on from its start
        for event in events:
            state, _ = reduce(state, event)
        self._begin(state)
        self._unpublished = True


def _derive(
    state: RuntimeView, cause: Event, before: frozenset[LogicalId]
) -> tuple[RuntimeView, Transitions, frozenset[LogicalId]]:
    """Announce what changed in the derived node quantities; returns the state, the
    transitions and the set of available models."""
    out: list[Event] = []
    # One pass over the models for all three derived quantities (available_models' filter);
    # the node's transitions share the one empty scope (scopes are immutable).
    serving = [m for m in state.models.values() if m.state in SERVING_MODEL_STATES]
    after = frozenset(m.model_id for m in serving)
    if after != before:
        out.append(
            transition(
                EventId.AVAILABLE_MODEL_SET_CHANGED,
                cause,
                None,
                f"{len(after)} available",
                scope=NO_SCOPE,
                extra=summaries(count=len(after)),
            )
        )
    node = derive_node(state, serving)
    if node is not state.node:
        out.append(
            transition(NODE_EVENTS[node], cause, state.node.value, node.value, scope=NO_SCOPE)
        )
        state = revise(state, node=node)
    lanes = sum(m.lanes or 0 for m in serving)
    if lanes != state.node_lanes:
        out.append(
            transition(
                EventId.NODE_CAPACITY_CHANGED,
                cause,
                f"{state.node_lanes} lanes",
                f"{lanes} lanes",
                scope=NO_SCOPE,
                extra=summaries(lanes=lanes, count=len(serving)),
            )
        )
        state = revise(state, node_lanes=lanes)
    pressure = _resource_pressure(state, serving)
    if pressure is not state.node_pressure:
        out.append(_pressure_transition(cause, state.node_pressure, pressure))
        state = revise(state, node_pressure=pressure)
    return state, tuple(out), after


_PRESSURE: Final = {False: "normal", True: "pressure"}


def _resource_pressure(state: RuntimeView, serving: Iterable[ModelView]) -> bool:
    """The node's resource pressure: a serving model's KV or any device's memory."""
    return any(m.kv.pressure for m in serving) or any(
        d.memory_pressure for d in state.devices.values()
    )


def _pressure_transition(cause: Event, before: bool, after: bool) -> Event:
    return transition(
        EventId.NODE_RESOURCE_PRESSURE_CHANGED,
        cause,
        _PRESSURE[before],
        _PRESSURE[after],
        scope=NO_SCOPE,
    )


def _remember(state: RuntimeView, events: tuple[Event, ...]) -> RuntimeView:
    """Keep lifecycle and warning events in the capped recent list (evictions counted)."""
    keep = tuple(e for e in events if _is_remembered(e))
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


def _is_remembered(event: Event) -> bool:
    """Lifecycle and warning events (the state test first: the cheapest, and every transition
    passes it)."""
    return (
        event.state is not None or event.id in _TERMINAL_IDS or event.severity in _RECENT_SEVERITIES
    )


def model_state(state: RuntimeView, model_id: LogicalId) -> ModelState | None:
    view = state.models.get(model_id)
    return None if view is None else view.state
