"""Transition tables as data: each family's docstring states its rows, every row's event is
handled, and the reducer moves every entity exactly as its table says (from every state)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Progress, Scope, make_event
from skippyctl.events.reasons import ProgressUnit
from skippyctl.reducer import health, models, resources, serving, topology
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.moves import ABSENT, REMOVED, SAME, Move, MoveTable, Presence
from skippyctl.reducer.reduce import _HANDLERS, FAMILIES, reduce
from skippyctl.reducer.state import (
    DeviceView,
    EventSystemView,
    KvView,
    ModelState,
    ModelView,
    RequestView,
    RuntimeView,
    SessionView,
    StageView,
    TopologyView,
)

X = LogicalId("x")
TOPO = LogicalId("topo")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.__name__)
def test_each_family_docstring_states_its_tables_as_rendered(family: Any) -> None:
    """After changing rows, paste `table.render()` into the family's module docstring."""
    assert family.MOVE_TABLES
    for table in family.MOVE_TABLES:
        assert table.render() in family.__doc__, f"{family.__name__}: {table.entity} table"


def test_every_row_is_an_event_the_reducer_handles() -> None:
    for family in FAMILIES:
        for table in family.MOVE_TABLES:
            assert table.events <= set(_HANDLERS), (family.__name__, table.entity)


def test_a_table_refuses_two_moves_from_one_state() -> None:
    rows = (
        Move(frozenset({ABSENT}), EventId.STAGE_READY, SAME),
        Move(frozenset({ABSENT}), EventId.STAGE_READY, REMOVED),
    )
    with pytest.raises(ValueError, match="two moves for stage_ready from absent"):
        MoveTable("stage", ProgressUnit, rows)


class _Reserved(StrEnum):
    SAME = "same"


def test_a_table_refuses_reserved_state_names_and_foreign_states() -> None:
    with pytest.raises(ValueError, match="may not be named"):
        MoveTable("odd", _Reserved, ())
    foreign = (Move(frozenset({health.RuntimeState.RUNNING}), EventId.STAGE_READY, SAME),)
    with pytest.raises(ValueError, match="another table"):
        MoveTable("stage", topology.StageState, foreign)


def test_lookups_and_repeats() -> None:
    table = health.RUNTIME_MOVES
    row = table.find(EventId.RUNTIME_STOPPING, health.RuntimeState.RUNNING)
    assert row is not None and row.target is health.RuntimeState.STOPPING
    assert table.find(EventId.RUNTIME_STOPPING, health.RuntimeState.STOPPED) is None
    assert table.repeats(EventId.RUNTIME_STOPPING, health.RuntimeState.STOPPING)
    assert not table.repeats(EventId.RUNTIME_STOPPING, health.RuntimeState.STOPPED)
    ends = serving.SESSION_MOVES
    assert ends.repeats(EventId.SESSION_CLOSED, ABSENT)  # removed: gone already


# ---- conformance: every (event, current state) of a table, through the real reducer ----


@dataclass(frozen=True)
class Entity:
    """How to put one entity of a table in a given state, and read its state back."""

    table: MoveTable[Any]
    place: Callable[[StrEnum | Presence], RuntimeView]
    read: Callable[[RuntimeView], StrEnum | Presence]
    scope: Scope
    events: frozenset[EventId] | None = None  # None: all of the table's
    exact_counts: bool = True  # False: the handler classifies duplicates its own way
    misfits_counted: bool = True  # False: a projection leaves an entity no row fits alone


def _one(mapping: dict[LogicalId, Any]) -> Any:
    return MappingProxyType(mapping)


def _model(state: StrEnum | Presence, **fields: Any) -> RuntimeView:
    if state is ABSENT:
        return RuntimeView()
    assert isinstance(state, ModelState)
    return RuntimeView(models=_one({X: ModelView(model_id=X, state=state, **fields)}))


def _read_model(view: RuntimeView) -> StrEnum | Presence:
    model = view.models.get(X)
    return ABSENT if model is None else model.state


def _kv(state: StrEnum | Presence) -> RuntimeView:
    kv = KvView(pressure=state is resources.Pressure.ON)
    return RuntimeView(models=_one({X: ModelView(model_id=X, state=ModelState.AVAILABLE, kv=kv)}))


def _memory(state: StrEnum | Presence) -> RuntimeView:
    if state is ABSENT:
        return RuntimeView()
    view = DeviceView(device_id=X, state=resources.DeviceState.READY, memory_pressure=state == "on")
    return RuntimeView(devices=_one({X: view}))


def _read_memory(view: RuntimeView) -> StrEnum | Presence:
    device = view.devices.get(X)
    if device is None:
        return ABSENT
    return resources.Pressure.ON if device.memory_pressure else resources.Pressure.OFF


def _keyed(attribute: str, make: Callable[[StrEnum], Any]) -> Entity | Any:
    def place(state: StrEnum | Presence) -> RuntimeView:
        if state is ABSENT:
            return RuntimeView()
        assert not isinstance(state, Presence)
        return evolve(RuntimeView(), **{attribute: _one({X: make(state)})})

    def read(view: RuntimeView) -> StrEnum | Presence:
        entity = getattr(view, attribute).get(X)
        return ABSENT if entity is None else entity.state

    return place, read


_MEMORY_EVENTS = resources.MEMORY_MOVES.events
_TOPOLOGY_EVENTS = frozenset(
    {EventId.TOPOLOGY_READY, EventId.TOPOLOGY_DEGRADED, EventId.TOPOLOGY_UNAVAILABLE}
)
ENTITIES: dict[str, Entity] = {
    "runtime": Entity(
        health.RUNTIME_MOVES,
        lambda state: RuntimeView(runtime=state),  # type: ignore[arg-type]
        lambda view: view.runtime,
        Scope(),
    ),
    "native mode": Entity(
        health.NATIVE_MODE_MOVES,
        lambda state: RuntimeView(native_mode=state),  # type: ignore[arg-type]
        lambda view: view.native_mode,
        Scope(),
    ),
    "telemetry exporter": Entity(
        health.EXPORTER_MOVES,
        lambda state: RuntimeView(
            event_system=EventSystemView(exporter_degraded=state == "degraded")
        ),
        lambda view: (
            health.ExporterHealth.DEGRADED
            if view.event_system.exporter_degraded
            else health.ExporterHealth.OK
        ),
        Scope(),
    ),
    "stage": Entity(
        topology.STAGE_MOVES,
        *_keyed("stages", lambda s: StageView(stage_id=X, state=s)),
        Scope(stage_id=X),
    ),
    "topology": Entity(
        topology.TOPOLOGY_MOVES,
        *_keyed("topologies", lambda s: TopologyView(topology_id=X, state=s)),
        Scope(topology_id=X),
    ),
    "session": Entity(
        serving.SESSION_MOVES,
        *_keyed("sessions", lambda s: SessionView(session_id=X, state=s)),
        Scope(session_id=X),
    ),
    "request": Entity(
        serving.REQUEST_MOVES,
        *_keyed("requests", lambda s: RequestView(request_id=X, state=s)),
        Scope(request_id=X),
        exact_counts=False,  # a known request received again is a duplicate whatever its state
    ),
    "device": Entity(
        resources.DEVICE_MOVES,
        *_keyed("devices", lambda s: DeviceView(device_id=X, state=s)),
        Scope(device_id=X),
        # backend_device_selected is also a loading fact of a model (rejected without one)
        events=resources.DEVICE_MOVES.events - _MEMORY_EVENTS - {EventId.BACKEND_DEVICE_SELECTED},
    ),
    "device memory": Entity(resources.MEMORY_MOVES, _memory, _read_memory, Scope(device_id=X)),
    "model KV": Entity(
        resources.KV_MOVES,
        _kv,
        lambda view: (
            resources.Pressure.ON if view.models[X].kv.pressure else resources.Pressure.OFF
        ),
        Scope(model_id=X),
    ),
    "model": Entity(
        models.MOVES,
        _model,
        _read_model,
        Scope(model_id=X),
        events=models.MOVES.events - _TOPOLOGY_EVENTS - {EventId.BACKEND_DEVICE_SELECTED},
        exact_counts=False,  # a repeated load request is a duplicate only for its own operation
    ),
    "model, device selected": Entity(
        models.MOVES,
        _model,
        _read_model,
        Scope(model_id=X, device_id=X),  # the device part records the device
        events=frozenset({EventId.BACKEND_DEVICE_SELECTED}),
    ),
    "model under a topology": Entity(
        models.MOVES,
        lambda state: evolve(
            _model(state, topology_id=TOPO, backend_ready=True),
            topologies=_one(
                {TOPO: TopologyView(topology_id=TOPO, state=topology.TopologyState.ASSEMBLING)}
            ),
        ),
        _read_model,
        Scope(topology_id=TOPO, model_id=X),
        events=_TOPOLOGY_EVENTS,
        misfits_counted=False,  # the topology moved; its models are projected, never rejected
    ),
}


def _cases() -> list[tuple[str, EventId, StrEnum | Presence]]:
    cases = []
    for name, entity in ENTITIES.items():
        events = entity.table.events if entity.events is None else entity.events
        sources: list[StrEnum | Presence] = [ABSENT, *entity.table.states]
        if name in ("runtime", "native mode", "telemetry exporter", "model KV"):
            sources.remove(ABSENT)  # always present
        for event in sorted(events, key=lambda e: e.value):
            cases += [(name, event, source) for source in sources]
    return cases


def _event(event_id: EventId, scope: Scope) -> Event:
    return make_event(event_id, scope=scope, progress=Progress(1, None, ProgressUnit.TOKENS))


@pytest.mark.parametrize(("name", "event_id", "current"), _cases())
def test_the_reducer_moves_each_entity_exactly_as_its_table_says(
    name: str, event_id: EventId, current: StrEnum | Presence
) -> None:
    entity = ENTITIES[name]
    before = entity.place(current)
    after, _ = reduce(before, _event(event_id, entity.scope))
    row = entity.table.find(event_id, current)
    counted = (
        after.counters.rejected_transitions - before.counters.rejected_transitions,
        after.counters.duplicate_transitions - before.counters.duplicate_transitions,
    )
    if row is not None:
        expected = {SAME: current, REMOVED: ABSENT}.get(row.target, row.target)  # type: ignore[call-overload]
        assert entity.read(after) == expected
        assert counted == (0, 0)
        return
    assert entity.read(after) == current
    if event_id is EventId.ENGINE_PROCESS_CRASHED or not entity.misfits_counted:
        assert counted == (0, 0)  # "otherwise ignored" (the crash row), or a projection
    elif entity.exact_counts:
        duplicate = entity.table.repeats(event_id, current)
        assert counted == ((0, 1) if duplicate else (1, 0))
    else:
        assert sum(counted) == 1
