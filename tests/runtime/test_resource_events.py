"""Load phases, ggml devices, per-device memory, allocation failures and CPU fallback from a
real engine process on real llama.cpp (the fixture models), through the host's pipeline and
reducer (issue 15, native resource facts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import ReasonCode
from skippyctl.pipeline.dispatch import Subscription
from skippyctl.reducer.state import DeviceState, ModelState
from skippyctl.runtime.host import RuntimeHost
from tests.native.buffer_types import weights_fit_the_model

TERMINALS = {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}
ABSURD_CONTEXT_TOKENS = 2_000_000_000


@pytest.fixture
def host() -> Iterator[RuntimeHost]:
    runtime = RuntimeHost().start()
    yield runtime
    runtime.shutdown()


def _load(host: RuntimeHost, request: LoadOptions) -> list[Event]:
    """Every event of the load (and the runtime's before it) up to its terminal."""
    watch: Subscription = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    handle = host.load_model(request)
    seen: list[Event] = []
    for _ in range(600):
        item = watch.get(0.1)
        if item is None:
            continue
        seen.append(item.event)
        if item.event.operation_id == handle.operation_id and item.event.id in TERMINALS:
            return seen
    raise AssertionError(f"no terminal: {[e.id.value for e in seen]}")


def _ids(events: list[Event]) -> list[EventId]:
    return [e.id for e in events]


def _value(event: Event, key: SummaryKey) -> int:
    value = event.summary_value(key)
    assert value is not None, key
    return int(value)


@pytest.mark.parametrize("fixture", ["tiny.gguf", "tiny-successor.gguf"])
def test_a_load_reports_its_devices_phases_and_memory_per_device(
    host: RuntimeHost, fixture_dir: Path, fixture: str
) -> None:
    events = _load(host, LoadOptions(str(fixture_dir / fixture), ctx=2048, lanes=2))
    ids = _ids(events)
    assert ids[-1] is EventId.MODEL_AVAILABLE
    # ggml's registry, in order: backends initialised, the CPU device selected and ready.
    backend = [
        i
        for i in ids
        if i
        in (
            EventId.BACKEND_INITIALIZATION_STARTED,
            EventId.BACKEND_INITIALIZATION_COMPLETED,
            EventId.DEVICE_SELECTED,
            EventId.DEVICE_READY,
        )
    ]
    assert backend == [
        EventId.BACKEND_INITIALIZATION_STARTED,
        EventId.BACKEND_INITIALIZATION_COMPLETED,
        EventId.DEVICE_SELECTED,
        EventId.DEVICE_READY,
    ]
    ready = next(e for e in events if e.id is EventId.DEVICE_READY)
    assert ready.scope.device_id == "CPU"
    assert _value(ready, SummaryKey.MEMORY_TOTAL_BYTES) > 0
    # The phases the engine observed, each while the model was loading or initialising.
    phases = [e for e in events if e.id is EventId.MODEL_LOAD_PHASE_CHANGED]
    assert [p.state.current for p in phases if p.state is not None] == [
        "weights loaded",
        "allocating ctx",
        "context ready",
    ]
    assert ids.index(EventId.MODEL_LOAD_PHASE_CHANGED) < ids.index(
        EventId.NATIVE_MODEL_LOAD_COMPLETED
    )
    # llama.cpp's own per-device figures: the weights are the whole model (more where the
    # device's extra buffer types hold repacked weights), KV and compute > 0.
    completed = next(e for e in events if e.id is EventId.NATIVE_MODEL_LOAD_COMPLETED)
    (summary,) = [e for e in events if e.id is EventId.MODEL_MEMORY_ALLOCATION_SUMMARY]
    assert summary.scope.device_id == "CPU"
    assert weights_fit_the_model(
        _value(summary, SummaryKey.WEIGHTS_BYTES),
        _value(completed, SummaryKey.MODEL_SIZE_BYTES),
        summary.scope.device_id,
    )
    assert _value(summary, SummaryKey.KV_BYTES) > 0
    assert _value(summary, SummaryKey.COMPUTE_BYTES) > 0
    (allocation,) = [e for e in events if e.id is EventId.RESOURCE_ALLOCATION_COMPLETED]
    assert allocation.summaries == summary.summaries
    assert ids.index(EventId.RESOURCE_ALLOCATION_COMPLETED) < ids.index(
        EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED
    )
    # Nothing was emitted that the reducer had to refuse, and the device is ready.
    state = host.pipeline.state
    assert state.counters.rejected_transitions == 0
    assert state.devices[LogicalId("CPU")].state is DeviceState.READY
    assert EventId.CPU_FALLBACK_ACTIVATED not in ids
    assert ids.index(EventId.KV_CACHE_INITIALIZATION_STARTED) < ids.index(
        EventId.MODEL_MEMORY_ALLOCATION_SUMMARY
    )


def test_the_kv_figure_is_the_context_geometry(host: RuntimeHost, fixture_dir: Path) -> None:
    small = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1024, lanes=1))
    (first,) = [e for e in small if e.id is EventId.MODEL_MEMORY_ALLOCATION_SUMMARY]
    host.stop_engine(LogicalId("tiny"))
    large = _load(
        host,
        LoadOptions(str(fixture_dir / "tiny.gguf"), alias="tiny4k", ctx=4096, lanes=1),
    )
    (second,) = [
        e
        for e in large
        if e.id is EventId.MODEL_MEMORY_ALLOCATION_SUMMARY and e.scope.model_id == "tiny4k"
    ]
    assert _value(second, SummaryKey.KV_BYTES) == 4 * _value(first, SummaryKey.KV_BYTES)


def test_an_absurd_context_fails_for_memory_and_the_host_serves_on(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    events = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=ABSURD_CONTEXT_TOKENS))
    failed = events[-1]
    assert failed.id is EventId.MODEL_LOAD_FAILED
    assert failed.reason_code is ReasonCode.OUT_OF_MEMORY
    refused = next(e for e in events if e.id is EventId.RESOURCE_ALLOCATION_FAILED)
    oom = next(e for e in events if e.id is EventId.OUT_OF_MEMORY_CONDITION)
    for event in (refused, oom):
        assert event.reason_code is ReasonCode.OUT_OF_MEMORY
        assert event.scope.device_id == "CPU"
        assert _value(event, SummaryKey.REQUESTED_BYTES) > _value(
            event, SummaryKey.MEMORY_FREE_BYTES
        )
    backend = next(e for e in events if e.id is EventId.SERVING_BACKEND_INITIALIZATION_FAILED)
    assert backend.reason_code is ReasonCode.OUT_OF_MEMORY
    kv = next(e for e in events if e.id is EventId.KV_CACHE_INITIALIZATION_FAILED)
    assert kv.reason_code is ReasonCode.OUT_OF_MEMORY
    assert _value(kv, SummaryKey.KV_BYTES) == _value(refused, SummaryKey.REQUESTED_BYTES)
    assert EventId.MODEL_MEMORY_ALLOCATION_SUMMARY not in _ids(events)
    assert host.pipeline.state.devices[LogicalId("CPU")].out_of_memory == 1
    # The host is alive and the same model loads with a sane context.
    again = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1024))
    assert again[-1].id is EventId.MODEL_AVAILABLE


def test_a_context_beyond_the_engines_address_space_limit_fails_for_memory(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    # 1 Mi tokens of tiny.gguf's KV is 256 MiB: fits the machine, not a 64 MiB headroom
    # (what SKIPPY_TEST_ENGINE_AS_LIMIT_MB=64 makes a runtime tell its engines).
    host.options = dataclasses.replace(host.options, test_address_space_limit_mib=64)
    events = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1 << 20, lanes=1))
    assert events[-1].id is EventId.MODEL_LOAD_FAILED
    assert events[-1].reason_code is ReasonCode.OUT_OF_MEMORY
    refused = next(e for e in events if e.id is EventId.RESOURCE_ALLOCATION_FAILED)
    assert _value(refused, SummaryKey.MEMORY_FREE_BYTES) <= 64 * 1024 * 1024
    assert _value(refused, SummaryKey.REQUESTED_BYTES) == 256 * 1024 * 1024


def test_gpu_layers_without_a_gpu_fall_back_to_the_cpu_with_a_reason(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    events = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), gpu_layers=-1))
    assert events[-1].id is EventId.MODEL_AVAILABLE
    fallback = next(e for e in events if e.id is EventId.CPU_FALLBACK_ACTIVATED)
    applied = next(e for e in events if e.id is EventId.FALLBACK_APPLIED)
    for event in (fallback, applied):
        assert event.reason_code is ReasonCode.DEVICE_UNAVAILABLE
        assert event.scope.device_id == "CPU"
        assert _value(event, SummaryKey.GPU_LAYERS) == -1
    assert host.pipeline.state.models[LogicalId("tiny")].state is ModelState.AVAILABLE


def test_a_context_llama_cpp_cannot_allocate_is_out_of_memory_from_its_own_failure(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    # The 256 MiB KV cache passes the engine's pre-check (300 MiB headroom), so llama.cpp is
    # asked; its buffers do not fit under the limit and it returns NULL. ggml's own allocator,
    # asked right after, cannot give the KV cache's size either: out of memory.
    host.options = dataclasses.replace(host.options, test_address_space_limit_mib=300)
    events = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1 << 20, lanes=1))
    assert events[-1].id is EventId.MODEL_LOAD_FAILED
    assert events[-1].reason_code is ReasonCode.OUT_OF_MEMORY
    ids = _ids(events)
    allocating = next(
        i
        for i, e in enumerate(events)
        if e.id is EventId.MODEL_LOAD_PHASE_CHANGED
        and e.state is not None
        and e.state.current == "allocating ctx"
    )
    # After llama.cpp was asked (the pre-check refuses before this phase): its answer.
    assert allocating < ids.index(EventId.RESOURCE_ALLOCATION_FAILED)
    assert allocating < ids.index(EventId.OUT_OF_MEMORY_CONDITION)
    refused = next(e for e in events if e.id is EventId.RESOURCE_ALLOCATION_FAILED)
    assert refused.reason_code is ReasonCode.OUT_OF_MEMORY
    host.options = dataclasses.replace(host.options, test_address_space_limit_mib=None)
    again = _load(host, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1024))
    assert again[-1].id is EventId.MODEL_AVAILABLE
