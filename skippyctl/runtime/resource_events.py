"""Engine resource messages → events: load phases, ggml backends and devices, memory
allocations, CPU fallback, compute failures (``engine/protocol_messages.py``
:data:`ResourceMessage`).

:func:`resource_events` is the whole table: each message stands for a fixed sequence of events,
stamped with the engine's model (and the load's operation). The supervisor queues them as
``Observed`` authoritative items, so they are reduced in order with the load's return values.

    load_phase           model_load_phase_changed (state: the phase); kv_cache_initialization_
                           started with `allocating ctx`
    backends             backend_initialization_started, then _completed (ok) or _failed
                           (device_unavailable); per selected device device_selected and
                           device_ready (ok)
    memory_allocated     per device model_memory_allocation_summary, resource_allocation_completed
    allocation_refused   resource_allocation_failed, kv_cache_initialization_failed (the KV
                           bytes asked for); out_of_memory_condition when the reason is
                           out_of_memory
    cpu_fallback         cpu_fallback_activated, fallback_applied (device_unavailable)
    device_memory        device_degraded (low) or device_recovered, the device's free and total
                           bytes (scope: the device)
    compute_failed       compute_failure (the mapped reason, the return code; not for an abort
                           the engine asked for), out_of_memory_condition when a buffer failed
                           to allocate (-2), then recoverable_native_failure (the same
                           figures: the engine goes on)

All are runtime-produced (the engine's Python reads llama.cpp's return values and getters; no
native stamp). A non-exact ``memory_allocated`` (llama.cpp's breakdown unreadable) carries no
``compute_bytes``: compute buffers are then unknown, not zero.

Privacy: device ids are the registry's short names (``CPU``); no path, handle or description.
"""

from __future__ import annotations

from typing import Final, assert_never

from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    ComputeFailed,
    CpuFallback,
    DeviceMemory,
    LoadPhase,
    LoadPhaseName,
    MemoryAllocated,
    ResourceMessage,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, StateChange, make_event, summaries
from skippyctl.events.reasons import Category, Outcome, ReasonCode

_KIND_CODES: Final = {"cpu": 0, "gpu": 1, "igpu": 2, "accel": 3, "meta": 4}
"""``enum ggml_backend_dev_type`` (the ``device_type`` summary of backend_device_selected)."""


def _device_id(name: str) -> LogicalId | None:
    try:
        return LogicalId(name)
    except ValueError:
        return None  # a name that is not a safe logical id is left out rather than reported


def resource_events(
    message: ResourceMessage,
    model_id: LogicalId,
    kv_events: bool = True,
    device: str | None = None,
) -> list[Event]:
    """The events one resource message stands for (see the module docstring); without
    ``kv_events`` (serving events off) the ``kv_cache_*`` ones are left out. ``device``: the
    one the model's load selected (where a failed decode's buffers were to be)."""
    events = _events_of(message, model_id, device)
    if kv_events:
        return events
    return [e for e in events if e.category is not Category.KV_RUNTIME_STATE]


def _events_of(message: ResourceMessage, model_id: LogicalId, device: str | None) -> list[Event]:
    match message:
        case LoadPhase():
            operation = LogicalId(message.operation_id)
            phase = [
                make_event(
                    EventId.MODEL_LOAD_PHASE_CHANGED,
                    operation_id=operation,
                    scope=Scope(model_id=model_id),
                    state=StateChange(None, message.phase.value),
                )
            ]
            if message.phase is LoadPhaseName.ALLOCATING:
                phase.append(
                    make_event(
                        EventId.KV_CACHE_INITIALIZATION_STARTED,
                        operation_id=operation,
                        scope=Scope(model_id=model_id),
                    )
                )
            return phase
        case Backends():
            return _backends(message, model_id)
        case MemoryAllocated():
            return _allocated(message, model_id)
        case AllocationRefused():
            return _refused(message, model_id)
        case CpuFallback():
            return _fallback(message, model_id)
        case DeviceMemory():
            return [
                make_event(
                    EventId.DEVICE_DEGRADED if message.low else EventId.DEVICE_RECOVERED,
                    scope=Scope(model_id=model_id, device_id=LogicalId(message.device)),
                    summaries=summaries(
                        memory_free_bytes=message.memory_free_bytes,
                        memory_total_bytes=message.memory_total_bytes,
                    ),
                )
            ]
        case ComputeFailed():
            return _compute_failed(message, model_id, device)
        case _:
            assert_never(message)


def _compute_failed(message: ComputeFailed, model_id: LogicalId, device: str | None) -> list[Event]:
    """A non-zero ``llama_decode`` the engine served on: a compute failure (not an abort it
    asked for), an out-of-memory condition on the model's device (a buffer failed to
    allocate), and always a recoverable native failure; each with the return code."""
    scope = Scope(model_id=model_id)
    found: list[tuple[EventId, Scope]] = []
    if message.reason is not ReasonCode.CANCELLATION:  # an abort asked for computed fine
        found.append((EventId.COMPUTE_FAILURE, scope))
    if message.reason is ReasonCode.OUT_OF_MEMORY and device is not None:
        found.append(
            (EventId.OUT_OF_MEMORY_CONDITION, Scope(model_id=model_id, device_id=LogicalId(device)))
        )
    found.append((EventId.RECOVERABLE_NATIVE_FAILURE, scope))
    figures = summaries(return_code=message.return_code, batch_size=message.requests)
    return [
        make_event(
            event_id,
            scope=event_scope,
            outcome=Outcome.FAILURE,
            reason_code=message.reason,
            summaries=figures,
        )
        for event_id, event_scope in found
    ]


def _backends(message: Backends, model_id: LogicalId) -> list[Event]:
    operation = LogicalId(message.operation_id)
    events = [
        make_event(
            EventId.BACKEND_INITIALIZATION_STARTED,
            operation_id=operation,
            scope=Scope(model_id=model_id),
            summaries=summaries(count=message.backends),
        )
    ]
    if not message.ok:
        events.append(
            make_event(
                EventId.BACKEND_INITIALIZATION_FAILED,
                operation_id=operation,
                scope=Scope(model_id=model_id),
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.DEVICE_UNAVAILABLE,
                summaries=summaries(count=message.backends),
            )
        )
        return events
    events.append(
        make_event(
            EventId.BACKEND_INITIALIZATION_COMPLETED,
            operation_id=operation,
            scope=Scope(model_id=model_id),
            outcome=Outcome.SUCCESS,
            summaries=summaries(count=len(message.devices)),
        )
    )
    for device in message.devices:
        device_id = _device_id(device.name)
        if not device.selected or device_id is None:
            continue
        figures = summaries(
            memory_free_bytes=device.memory_free_bytes,
            memory_total_bytes=device.memory_total_bytes,
            device_type=_KIND_CODES.get(device.kind),
        )
        scope = Scope(model_id=model_id, device_id=device_id)
        events.append(
            make_event(
                EventId.DEVICE_SELECTED, operation_id=operation, scope=scope, summaries=figures
            )
        )
        events.append(
            make_event(
                EventId.DEVICE_READY,
                operation_id=operation,
                scope=scope,
                state=StateChange(None, "ready"),
                summaries=figures,
            )
        )
    return events


def _allocated(message: MemoryAllocated, model_id: LogicalId) -> list[Event]:
    operation = LogicalId(message.operation_id)
    events: list[Event] = []
    for buffer in message.buffers:
        device_id = _device_id(buffer.device)
        total = buffer.weights_bytes + buffer.kv_bytes + buffer.compute_bytes
        figures = summaries(
            weights_bytes=buffer.weights_bytes,
            kv_bytes=buffer.kv_bytes,
            compute_bytes=buffer.compute_bytes if message.exact else None,
            memory_used_bytes=total,
        )
        scope = Scope(model_id=model_id, device_id=device_id)
        events.append(
            make_event(
                EventId.MODEL_MEMORY_ALLOCATION_SUMMARY,
                operation_id=operation,
                scope=scope,
                summaries=figures,
            )
        )
        events.append(
            make_event(
                EventId.RESOURCE_ALLOCATION_COMPLETED,
                operation_id=operation,
                scope=scope,
                outcome=Outcome.SUCCESS,
                summaries=figures,
            )
        )
    return events


def _refused(message: AllocationRefused, model_id: LogicalId) -> list[Event]:
    operation = LogicalId(message.operation_id)
    scope = Scope(model_id=model_id, device_id=_device_id(message.device))
    figures = summaries(
        requested_bytes=message.requested_bytes, memory_free_bytes=message.available_bytes
    )
    events = [
        make_event(
            EventId.RESOURCE_ALLOCATION_FAILED,
            operation_id=operation,
            scope=scope,
            outcome=Outcome.FAILURE,
            reason_code=message.reason,
            summaries=figures,
        )
    ]
    events.append(
        make_event(
            EventId.KV_CACHE_INITIALIZATION_FAILED,
            operation_id=operation,
            scope=Scope(model_id=model_id),
            outcome=Outcome.FAILURE,
            reason_code=message.reason,
            summaries=summaries(kv_bytes=message.requested_bytes),
        )
    )
    if message.reason is ReasonCode.OUT_OF_MEMORY:
        events.append(
            make_event(
                EventId.OUT_OF_MEMORY_CONDITION,
                operation_id=operation,
                scope=scope,
                outcome=Outcome.FAILURE,
                reason_code=message.reason,
                summaries=figures,
            )
        )
    return events


def _fallback(message: CpuFallback, model_id: LogicalId) -> list[Event]:
    operation = LogicalId(message.operation_id)
    scope = Scope(model_id=model_id, device_id=_device_id(message.device))
    figures = summaries(gpu_layers=message.gpu_layers)
    return [
        make_event(
            EventId.CPU_FALLBACK_ACTIVATED,
            operation_id=operation,
            scope=scope,
            reason_code=ReasonCode.DEVICE_UNAVAILABLE,
            summaries=figures,
        ),
        make_event(
            EventId.FALLBACK_APPLIED,
            operation_id=operation,
            scope=scope,
            reason_code=ReasonCode.DEVICE_UNAVAILABLE,
            summaries=figures,
        ),
    ]
