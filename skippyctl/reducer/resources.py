"""KV/cache pressure and context capacity (per model) and device/resource health.

The allowed moves are the rows of `KV_MOVES`, `DEVICE_MOVES` and `MEMORY_MOVES`
(reducer.moves); the handlers look each event up there and make the field updates. KV facts of a
model the view does not know are rejected; a device fact about an unknown device records it.
`backend_device_selected` is also a loading fact of its model (models.MOVES).

    model KV                            from → to
    kv_cache_initialization_completed   off | on → same — capacity
    cache_pressure_crossed              off → on — cells used
    cache_pressure_cleared              on → off — cells used
    context_capacity_approaching_limit  off | on → same — counted
      context_exhausted

    device                   from → to
    backend_device_selected  absent → selected — memory figures recorded
      device_selected
      memory_pressure_crossed
      memory_pressure_cleared
      out_of_memory_condition
    backend_device_selected  any → same — keeps its health
      device_selected
      memory_pressure_crossed
      memory_pressure_cleared
      out_of_memory_condition
    device_ready             absent | any other → ready
    device_degraded          absent | any other → degraded
    device_unavailable       absent | any other → unavailable
    device_recovered         absent | any other → ready
    device_lost              absent | any other → lost
    device_reset             absent | any other → ready

    device memory            from → to
    memory_pressure_crossed  absent | off → on
    memory_pressure_cleared  absent | on → off
    out_of_memory_condition  absent → off — counted
    out_of_memory_condition  off | on → same — counted
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, bounded_put, count, reject
from skippyctl.reducer.immutable import evolve, revise, revise_item
from skippyctl.reducer.models import on_loading_fact
from skippyctl.reducer.moves import ABSENT, SAME, Effect, Move, MoveTable, entering, moves
from skippyctl.reducer.state import (
    MAX_DEVICES,
    DeviceState,
    DeviceView,
    KvView,
    ModelView,
    RuntimeView,
)


class Pressure(StrEnum):
    """A pressure flag (the views keep it as a bool) as a state of the tables below."""

    OFF = "off"
    ON = "on"


def pressure_state(flag: bool) -> Pressure:
    return Pressure.ON if flag else Pressure.OFF


_E = EventId
_D = DeviceState
_ANY_DEVICE: Final[frozenset[_D]] = frozenset(_D)
_COUNTED: Final = "counted"

# The KV state of a known model (an unknown model's KV facts are rejected).
KV_MOVES: Final[MoveTable[Pressure]] = MoveTable(
    "model KV",
    Pressure,
    (
        Move(frozenset(Pressure), _E.KV_CACHE_INITIALIZATION_COMPLETED, SAME, note="capacity"),
        Move(frozenset({Pressure.OFF}), _E.CACHE_PRESSURE_CROSSED, Pressure.ON, note="cells used"),
        Move(frozenset({Pressure.ON}), _E.CACHE_PRESSURE_CLEARED, Pressure.OFF, note="cells used"),
        *moves(
            Pressure,
            (_E.CONTEXT_CAPACITY_APPROACHING_LIMIT, _E.CONTEXT_EXHAUSTED),
            SAME,
            note=_COUNTED,
        ),
    ),
)


# An unknown device is recorded (as selected) by any device fact.
_OBSERVED: Final = (
    _E.BACKEND_DEVICE_SELECTED,
    _E.DEVICE_SELECTED,
    _E.MEMORY_PRESSURE_CROSSED,
    _E.MEMORY_PRESSURE_CLEARED,
    _E.OUT_OF_MEMORY_CONDITION,
)
DEVICE_MOVES: Final[MoveTable[DeviceState]] = MoveTable(
    "device",
    DeviceState,
    (
        *moves({ABSENT}, _OBSERVED, _D.SELECTED, note="memory figures recorded"),
        *moves(_ANY_DEVICE, _OBSERVED, SAME, note="keeps its health"),
        Move(entering(_D.READY), _E.DEVICE_READY, _D.READY),
        Move(entering(_D.DEGRADED), _E.DEVICE_DEGRADED, _D.DEGRADED),
        Move(entering(_D.UNAVAILABLE), _E.DEVICE_UNAVAILABLE, _D.UNAVAILABLE),
        Move(entering(_D.READY), _E.DEVICE_RECOVERED, _D.READY),
        Move(entering(_D.LOST), _E.DEVICE_LOST, _D.LOST),
        Move(entering(_D.READY), _E.DEVICE_RESET, _D.READY),
    ),
)

MEMORY_MOVES: Final[MoveTable[Pressure]] = MoveTable(
    "device memory",
    Pressure,
    (
        Move(frozenset({ABSENT, Pressure.OFF}), _E.MEMORY_PRESSURE_CROSSED, Pressure.ON),
        Move(frozenset({ABSENT, Pressure.ON}), _E.MEMORY_PRESSURE_CLEARED, Pressure.OFF),
        Move(frozenset({ABSENT}), _E.OUT_OF_MEMORY_CONDITION, Pressure.OFF, note=_COUNTED),
        Move(frozenset(Pressure), _E.OUT_OF_MEMORY_CONDITION, SAME, note=_COUNTED),
    ),
)
MOVE_TABLES: Final = (KV_MOVES, DEVICE_MOVES, MEMORY_MOVES)


def _with_kv(state: RuntimeView, event: Event) -> tuple[ModelView, KvView] | None:
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    return None if model is None else (model, model.kv)


def store_kv(state: RuntimeView, model: ModelView, kv: KvView) -> RuntimeView:
    """`model` with `kv` stored in `state` (in place within a batch: reducer.immutable.revise)."""
    return revise(state, models=revise_item(state.models, model.model_id, revise(model, kv=kv)))


def on_kv(state: RuntimeView, event: Event) -> Step:
    """A model's KV fact. Updates in place within a batch (reducer.immutable.revise): a stream
    of distinct pressure transitions comes this way. Nothing here reads a view after revising
    it, and every revised view is stored."""
    found = _with_kv(state, event)
    if found is None:
        return reject(state)
    model, kv = found
    now = pressure_state(kv.pressure)
    row = KV_MOVES.find(event.id, now)
    if row is None:
        return reject(state, duplicate=KV_MOVES.repeats(event.id, now))
    if event.id is EventId.KV_CACHE_INITIALIZATION_COMPLETED:
        total = event.summary_value(SummaryKey.KV_CELLS_TOTAL)
        kv = revise(kv, cells_total=None if total is None else int(total))
    elif isinstance(row.target, Pressure):
        used = event.summary_value(SummaryKey.KV_CELLS_USED)
        kv = revise(
            kv,
            pressure=row.target is Pressure.ON,
            cells_used=kv.cells_used if used is None else int(used),
        )
    elif event.id is EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT:
        kv = revise(kv, approaching_limit=kv.approaching_limit + 1)
    else:
        kv = revise(kv, exhausted=kv.exhausted + 1)
    return store_kv(state, model, kv), NO_TRANSITIONS


def _device_view(state: RuntimeView, device_id: LogicalId, event: Event) -> DeviceView:
    return state.devices.get(device_id) or DeviceView(
        device_id=device_id, state=DeviceState.SELECTED, updated_mono_ns=event.mono_ns
    )


def _store_device(state: RuntimeView, view: DeviceView) -> Step:
    placed = bounded_put(
        state.devices,
        view.device_id,
        view,
        MAX_DEVICES,
        lambda d: d.state in (DeviceState.LOST, DeviceState.UNAVAILABLE),
        lambda d: d.updated_mono_ns,
    )
    if placed is None:
        return reject(state)
    devices, evicted = placed
    return count(evolve(state, devices=devices), evicted_devices=evicted), NO_TRANSITIONS


def on_device(state: RuntimeView, event: Event) -> Step:
    device_id = event.scope.device_id
    if device_id is None:
        return reject(state)
    view = _device_view(state, device_id, event)
    now = view.state if device_id in state.devices else ABSENT
    row = DEVICE_MOVES.find(event.id, now)
    if row is None:
        return reject(state, duplicate=DEVICE_MOVES.repeats(event.id, now))
    target = view.state if isinstance(row.target, Effect) else row.target
    free = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
    total = event.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
    updated = evolve(
        view,
        state=target,
        memory_free_bytes=view.memory_free_bytes if free is None else int(free),
        memory_total_bytes=view.memory_total_bytes if total is None else int(total),
        updated_mono_ns=event.mono_ns,
    )
    return _store_device(state, updated)


def on_backend_device_selected(state: RuntimeView, event: Event) -> Step:
    """Both a loading fact of the model and a device observation."""
    state, transitions = on_loading_fact(state, event)
    state, more = on_device(state, event)
    return state, transitions + more


def on_device_fact(state: RuntimeView, event: Event) -> Step:
    device_id = event.scope.device_id
    if device_id is None:
        return reject(state)
    view = _device_view(state, device_id, event)
    known = device_id in state.devices
    now = pressure_state(view.memory_pressure) if known else ABSENT
    row = MEMORY_MOVES.find(event.id, now)
    if row is None or DEVICE_MOVES.find(event.id, view.state if known else ABSENT) is None:
        return reject(state, duplicate=MEMORY_MOVES.repeats(event.id, now))
    if event.id is EventId.OUT_OF_MEMORY_CONDITION:
        view = evolve(view, out_of_memory=view.out_of_memory + 1)
    elif isinstance(row.target, Pressure):
        view = evolve(view, memory_pressure=row.target is Pressure.ON)
    return _store_device(state, evolve(view, updated_mono_ns=event.mono_ns))


_DEVICE_STATE_EVENTS: Final = DEVICE_MOVES.events - MEMORY_MOVES.events

HANDLERS: Final[dict[EventId, Handler]] = {
    **{event_id: on_kv for event_id in KV_MOVES.events},
    **{
        event_id: on_device for event_id in _DEVICE_STATE_EVENTS - {EventId.BACKEND_DEVICE_SELECTED}
    },
    EventId.BACKEND_DEVICE_SELECTED: on_backend_device_selected,
    **{event_id: on_device_fact for event_id in MEMORY_MOVES.events},
}
