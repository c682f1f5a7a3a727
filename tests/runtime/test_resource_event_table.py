"""The engine's resource messages → events table (runtime/resource_events.py), the rendered
summaries of those events."""

from __future__ import annotations

import pytest

from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    BufferReport,
    ComputeFailed,
    CpuFallback,
    DeviceReport,
    LoadPhase,
    LoadPhaseName,
    MemoryAllocated,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, SummaryKey
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.summary import render_summary
from skippyctl.runtime.resource_events import resource_events

MODEL = LogicalId("tiny")
CPU = DeviceReport("CPU", "cpu", 8 << 30, 16 << 30, selected=True)


def test_no_device_is_a_backend_initialization_failure_with_a_reason() -> None:
    events = resource_events(Backends("load-1", ok=False, backends=1), MODEL)
    assert [e.id for e in events] == [
        EventId.BACKEND_INITIALIZATION_STARTED,
        EventId.BACKEND_INITIALIZATION_FAILED,
    ]
    assert events[-1].reason_code is ReasonCode.DEVICE_UNAVAILABLE


def test_only_selected_devices_with_safe_names_are_reported() -> None:
    other = DeviceReport("CUDA0", "gpu", 1, 2, selected=False)
    unsafe = DeviceReport("/dev/nvidia0", "gpu", 1, 2, selected=True)
    events = resource_events(Backends("load-1", True, 2, (CPU, other, unsafe)), MODEL)
    selected = [e for e in events if e.id is EventId.DEVICE_SELECTED]
    assert [e.scope.device_id for e in selected] == ["CPU"]
    assert selected[0].summary_value(SummaryKey.DEVICE_TYPE) == 0
    assert all("/" not in str(e.scope.device_id) for e in events)


def test_a_breakdown_per_device_is_a_summary_and_an_allocation_each() -> None:
    buffers = (BufferReport("CPU", 10, 20, 30), BufferReport("CUDA0", 1, 2, 3))
    events = resource_events(MemoryAllocated("load-1", True, buffers), MODEL)
    assert [(e.id, e.scope.device_id) for e in events] == [
        (EventId.MODEL_MEMORY_ALLOCATION_SUMMARY, "CPU"),
        (EventId.RESOURCE_ALLOCATION_COMPLETED, "CPU"),
        (EventId.MODEL_MEMORY_ALLOCATION_SUMMARY, "CUDA0"),
        (EventId.RESOURCE_ALLOCATION_COMPLETED, "CUDA0"),
    ]
    assert events[0].summary_value(SummaryKey.MEMORY_USED_BYTES) == 60
    assert render_summary(events[0]) == "CPU: weights 10 B, KV 20 B, compute 30 B"


def test_totals_without_llamas_breakdown_leave_compute_unknown() -> None:
    events = resource_events(
        MemoryAllocated("load-1", False, (BufferReport("CPU", 10, 20, 0),)), MODEL
    )
    assert events[0].summary_value(SummaryKey.COMPUTE_BYTES) is None
    assert render_summary(events[0]).endswith("compute unknown")


@pytest.mark.parametrize(
    ("reason", "ids"),
    [
        (
            ReasonCode.OUT_OF_MEMORY,
            [
                EventId.RESOURCE_ALLOCATION_FAILED,
                EventId.KV_CACHE_INITIALIZATION_FAILED,
                EventId.OUT_OF_MEMORY_CONDITION,
            ],
        ),
        (
            ReasonCode.RESOURCE_ALLOCATION_FAILURE,
            [EventId.RESOURCE_ALLOCATION_FAILED, EventId.KV_CACHE_INITIALIZATION_FAILED],
        ),
    ],
)
def test_a_refused_allocation_is_out_of_memory_only_when_memory_ran_out(
    reason: ReasonCode, ids: list[EventId]
) -> None:
    events = resource_events(AllocationRefused("load-1", "CPU", 2 << 30, 1 << 30, reason), MODEL)
    assert [e.id for e in events] == ids
    assert all(e.reason_code is reason for e in events)
    assert render_summary(events[0]) == f"CPU: 2.0 GiB requested, 1.0 GiB available ({reason})"


def test_fallback_and_compute_failure_carry_their_reasons_and_figures() -> None:
    fallback = resource_events(CpuFallback("load-1", 99, "CPU"), MODEL)
    assert [e.id for e in fallback] == [EventId.CPU_FALLBACK_ACTIVATED, EventId.FALLBACK_APPLIED]
    assert render_summary(fallback[0]) == "no GPU: running on the CPU (99 GPU layers asked for)"
    failed = resource_events(ComputeFailed(-3, ReasonCode.INTERNAL_RUNTIME_FAILURE, 2), MODEL)
    assert [e.id for e in failed] == [
        EventId.COMPUTE_FAILURE,
        EventId.RECOVERABLE_NATIVE_FAILURE,  # the engine serves on
    ]
    for failure in failed:
        assert failure.reason_code is ReasonCode.INTERNAL_RUNTIME_FAILURE
        assert failure.summary_value(SummaryKey.RETURN_CODE) == -3
        assert failure.summary_value(SummaryKey.BATCH_SIZE) == 2
        assert failure.scope.model_id == MODEL


def test_a_decode_whose_buffers_failed_to_allocate_is_out_of_memory() -> None:
    failed = resource_events(ComputeFailed(-2, ReasonCode.OUT_OF_MEMORY, 1), MODEL, device="CPU")
    oom = next(e for e in failed if e.id is EventId.OUT_OF_MEMORY_CONDITION)
    assert oom.scope.device_id == "CPU"
    assert [e.id for e in failed] == [
        EventId.COMPUTE_FAILURE,
        EventId.OUT_OF_MEMORY_CONDITION,
        EventId.RECOVERABLE_NATIVE_FAILURE,
    ]
    assert all(e.reason_code is ReasonCode.OUT_OF_MEMORY for e in failed)


def test_an_aborted_decode_is_recoverable_and_no_compute_failure() -> None:
    (aborted,) = resource_events(ComputeFailed(2, ReasonCode.CANCELLATION, 1), MODEL)
    assert aborted.id is EventId.RECOVERABLE_NATIVE_FAILURE
    assert aborted.reason_code is ReasonCode.CANCELLATION


@pytest.mark.parametrize("phase", list(LoadPhaseName))
def test_an_engine_phase_is_the_events_state(
    phase: LoadPhaseName,
) -> None:
    event, *more = resource_events(LoadPhase("load-1", phase), MODEL)
    assert event.id is EventId.MODEL_LOAD_PHASE_CHANGED
    kv_started = [EventId.KV_CACHE_INITIALIZATION_STARTED]
    assert [e.id for e in more] == (kv_started if phase is LoadPhaseName.ALLOCATING else [])
    assert event.state is not None and event.state.current == phase.value
    assert render_summary(event) == f"load phase: {phase.value}"


def test_with_serving_events_off_the_kv_events_are_left_out() -> None:
    allocating = LoadPhase("load-1", LoadPhaseName.ALLOCATING)
    assert [e.id for e in resource_events(allocating, MODEL, kv_events=False)] == [
        EventId.MODEL_LOAD_PHASE_CHANGED
    ]
    refused = AllocationRefused("load-1", "CPU", 2 << 30, 1 << 30, ReasonCode.OUT_OF_MEMORY)
    ids = [e.id for e in resource_events(refused, MODEL, kv_events=False)]
    assert EventId.KV_CACHE_INITIALIZATION_FAILED not in ids
    assert EventId.RESOURCE_ALLOCATION_FAILED in ids  # the load's own story stays whole
