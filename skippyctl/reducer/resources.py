"""KV/cache pressure and context capacity (per model) and device/resource health.

kv_cache_initialization_completed   model kv capacity (cells)
cache_pressure_crossed / _cleared   model kv pressure on / off (a repeat is a duplicate)
context_capacity_approaching_limit  counted per model
context_exhausted                   counted per model
backend_device_selected,
  device_ready | _degraded | _unavailable | _recovered | _lost | _reset
                                    the device's state
memory_pressure_crossed / _cleared  the device's memory pressure flag
out_of_memory_condition             counted per device
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, bounded_put, count, put, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.models import on_loading_fact
from skippyctl.reducer.state import (
    MAX_DEVICES,
    DeviceState,
    DeviceView,
    KvView,
    ModelView,
    RuntimeView,
)

_DEVICE_TARGETS: Final[dict[EventId, DeviceState]] = {
    EventId.BACKEND_DEVICE_SELECTED: DeviceState.SELECTED,
    EventId.DEVICE_SELECTED: DeviceState.SELECTED,
    EventId.DEVICE_READY: DeviceState.READY,
    EventId.DEVICE_DEGRADED: DeviceState.DEGRADED,
    EventId.DEVICE_UNAVAILABLE: DeviceState.UNAVAILABLE,
    EventId.DEVICE_RECOVERED: DeviceState.READY,
    EventId.DEVICE_LOST: DeviceState.LOST,
    EventId.DEVICE_RESET: DeviceState.READY,
}
_DEVICE_FACTS: Final = frozenset(
    {
        EventId.MEMORY_PRESSURE_CROSSED,
        EventId.MEMORY_PRESSURE_CLEARED,
        EventId.OUT_OF_MEMORY_CONDITION,
    }
)


def _with_kv(state: RuntimeView, event: Event) -> tuple[ModelView, KvView] | None:
    model_id = event.scope.model_id
    model = None if model_id is None else state.models.get(model_id)
    return None if model is None else (model, model.kv)


def _store_kv(state: RuntimeView, model: ModelView, kv: KvView) -> RuntimeView:
    return evolve(state, models=put(state.models, model.model_id, evolve(model, kv=kv)))


def on_kv(state: RuntimeView, event: Event) -> Step:
    found = _with_kv(state, event)
    if found is None:
        return reject(state)
    model, kv = found
    if event.id is EventId.KV_CACHE_INITIALIZATION_COMPLETED:
        total = event.summary_value(SummaryKey.KV_CELLS_TOTAL)
        kv = evolve(kv, cells_total=None if total is None else int(total))
    elif event.id in (EventId.CACHE_PRESSURE_CROSSED, EventId.CACHE_PRESSURE_CLEARED):
        pressure = event.id is EventId.CACHE_PRESSURE_CROSSED
        if kv.pressure is pressure:
            return reject(state, duplicate=True)
        used = event.summary_value(SummaryKey.KV_CELLS_USED)
        kv = evolve(kv, pressure=pressure, cells_used=kv.cells_used if used is None else int(used))
    elif event.id is EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT:
        kv = evolve(kv, approaching_limit=kv.approaching_limit + 1)
    else:
        kv = evolve(kv, exhausted=kv.exhausted + 1)
    return _store_kv(state, model, kv), NO_TRANSITIONS


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
    target = _DEVICE_TARGETS[event.id]
    if device_id in state.devices and view.state is target and target is not DeviceState.SELECTED:
        return reject(state, duplicate=True)
    if target is DeviceState.SELECTED and view.state is not DeviceState.SELECTED:
        target = view.state  # selecting an already known device keeps its health
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
    if event.id is EventId.OUT_OF_MEMORY_CONDITION:
        view = evolve(view, out_of_memory=view.out_of_memory + 1)
    else:
        pressure = event.id is EventId.MEMORY_PRESSURE_CROSSED
        if view.memory_pressure is pressure and device_id in state.devices:
            return reject(state, duplicate=True)
        view = evolve(view, memory_pressure=pressure)
    return _store_device(state, evolve(view, updated_mono_ns=event.mono_ns))


HANDLERS: Final[dict[EventId, Handler]] = {
    **{
        event_id: on_kv
        for event_id in (
            EventId.KV_CACHE_INITIALIZATION_COMPLETED,
            EventId.CACHE_PRESSURE_CROSSED,
            EventId.CACHE_PRESSURE_CLEARED,
            EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT,
            EventId.CONTEXT_EXHAUSTED,
        )
    },
    **{event_id: on_device for event_id in _DEVICE_TARGETS},
    EventId.BACKEND_DEVICE_SELECTED: on_backend_device_selected,
    **{event_id: on_device_fact for event_id in _DEVICE_FACTS},
}
