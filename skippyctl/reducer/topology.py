"""Stages and topologies, projected onto backend-neutral model availability.

stage_starting | _loading | _ready | _degraded | _unavailable | _stopping | _stopped | _failed
    → the stage's state (any → any; a repeat is a counted duplicate)
upstream_/downstream_connection_established | _recovered | _lost
    → the stage's link flags; a lost link degrades a ready stage, its recovery restores it
topology_assembling | _ready | _degraded | _unavailable
    → the topology's state, then models.on_topology_changed projects it onto its models
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, bounded_put, count, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.models import on_topology_changed
from skippyctl.reducer.state import (
    MAX_STAGES,
    MAX_TOPOLOGIES,
    RuntimeView,
    StageState,
    StageView,
    TopologyState,
    TopologyView,
)

_STAGE_TARGETS: Final[dict[EventId, StageState]] = {
    EventId.STAGE_STARTING: StageState.STARTING,
    EventId.STAGE_LOADING: StageState.LOADING,
    EventId.STAGE_READY: StageState.READY,
    EventId.STAGE_DEGRADED: StageState.DEGRADED,
    EventId.STAGE_UNAVAILABLE: StageState.UNAVAILABLE,
    EventId.STAGE_STOPPING: StageState.STOPPING,
    EventId.STAGE_STOPPED: StageState.STOPPED,
    EventId.STAGE_FAILED: StageState.FAILED,
}
_GONE: Final = frozenset({StageState.STOPPED, StageState.FAILED})

_LINKS: Final[dict[EventId, tuple[str, bool]]] = {
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: ("upstream_connected", True),
    EventId.UPSTREAM_CONNECTION_RECOVERED: ("upstream_connected", True),
    EventId.UPSTREAM_CONNECTION_LOST: ("upstream_connected", False),
    EventId.DOWNSTREAM_CONNECTION_ESTABLISHED: ("downstream_connected", True),
    EventId.DOWNSTREAM_CONNECTION_RECOVERED: ("downstream_connected", True),
    EventId.DOWNSTREAM_CONNECTION_LOST: ("downstream_connected", False),
}

_TOPOLOGY_TARGETS: Final[dict[EventId, TopologyState]] = {
    EventId.TOPOLOGY_ASSEMBLING: TopologyState.ASSEMBLING,
    EventId.TOPOLOGY_READY: TopologyState.READY,
    EventId.TOPOLOGY_DEGRADED: TopologyState.DEGRADED,
    EventId.TOPOLOGY_UNAVAILABLE: TopologyState.UNAVAILABLE,
}


def _store_stage(state: RuntimeView, view: StageView) -> RuntimeView | None:
    placed = bounded_put(
        state.stages,
        view.stage_id,
        view,
        MAX_STAGES,
        lambda s: s.state in _GONE,
        lambda s: s.updated_mono_ns,
    )
    if placed is None:
        return None
    stages, evicted = placed
    return count(evolve(state, stages=stages), evicted_stages=evicted)


def on_stage(state: RuntimeView, event: Event) -> Step:
    stage_id = event.scope.stage_id
    if stage_id is None:
        return reject(state)
    target = _STAGE_TARGETS[event.id]
    current = state.stages.get(stage_id)
    if current is not None and current.state is target:
        return reject(state, duplicate=True)
    view = current or StageView(stage_id=stage_id, state=target)
    view = evolve(
        view,
        state=target,
        topology_id=event.scope.topology_id or view.topology_id,
        stage_index=event.scope.stage_index
        if event.scope.stage_index is not None
        else view.stage_index,
        reason_code=event.reason_code,
        updated_mono_ns=event.mono_ns,
    )
    stored = _store_stage(state, view)
    return reject(state) if stored is None else (stored, NO_TRANSITIONS)


def on_link(state: RuntimeView, event: Event) -> Step:
    stage_id = event.scope.stage_id
    view = None if stage_id is None else state.stages.get(stage_id)
    if view is None:
        return reject(state)
    flag, connected = _LINKS[event.id]
    if getattr(view, flag) is connected:
        return reject(state, duplicate=True)
    if flag == "upstream_connected":
        updated = evolve(view, upstream_connected=connected)
    else:
        updated = evolve(view, downstream_connected=connected)
    updated = evolve(updated, updated_mono_ns=event.mono_ns)
    if not connected and view.state is StageState.READY:
        updated = evolve(updated, state=StageState.DEGRADED)
    elif (
        connected
        and view.state is StageState.DEGRADED
        and False
        not in (
            updated.upstream_connected,
            updated.downstream_connected,
        )
    ):
        updated = evolve(updated, state=StageState.READY)
    stored = _store_stage(state, updated)
    return reject(state) if stored is None else (stored, NO_TRANSITIONS)


def on_topology(state: RuntimeView, event: Event) -> Step:
    topology_id = event.scope.topology_id
    if topology_id is None:
        return reject(state)
    target = _TOPOLOGY_TARGETS[event.id]
    current = state.topologies.get(topology_id)
    if current is not None and current.state is target:
        return reject(state, duplicate=True)
    view = TopologyView(
        topology_id=topology_id,
        state=target,
        model_id=event.scope.model_id or (current.model_id if current else None),
        updated_mono_ns=event.mono_ns,
    )
    placed = bounded_put(
        state.topologies,
        topology_id,
        view,
        MAX_TOPOLOGIES,
        lambda t: t.state is TopologyState.UNAVAILABLE,
        lambda t: t.updated_mono_ns,
    )
    if placed is None:
        return reject(state)
    topologies, _ = placed
    return on_topology_changed(evolve(state, topologies=topologies), event, topology_id, target)


HANDLERS: Final[dict[EventId, Handler]] = {
    **{event_id: on_stage for event_id in _STAGE_TARGETS},
    **{event_id: on_link for event_id in _LINKS},
    **{event_id: on_topology for event_id in _TOPOLOGY_TARGETS},
}
