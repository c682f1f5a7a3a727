"""The runtime host in-process with a real engine process and the real native layer."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import Producer, ReasonCode
from skippyctl.pipeline.dispatch import Subscription
from skippyctl.reducer.state import ModelState, ModelView, NativeMode
from skippyctl.runtime.host import RuntimeHost

TERMINALS = {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}


@pytest.fixture
def host() -> Iterator[RuntimeHost]:
    runtime = RuntimeHost().start()
    yield runtime
    runtime.shutdown()


def _until(subscription: Subscription, operation: LogicalId, ids: set[EventId]) -> list[Event]:
    seen: list[Event] = []
    for _ in range(600):
        item = subscription.get(0.1)
        if item is None:
            continue
        seen.append(item.event)
        if item.event.operation_id == operation and item.event.id in ids:
            return seen
    raise AssertionError(f"{ids} not seen: {[e.id.value for e in seen]}")


def test_load_facts_arrive_through_the_ring(host: RuntimeHost, fixture_dir: Path) -> None:
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    handle = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf")))
    events = _until(watch, handle.operation_id, TERMINALS)
    assert events[-1].id is EventId.MODEL_AVAILABLE
    native = [e for e in events if e.producer is Producer.NATIVE]
    native_ids = [e.id for e in native]
    assert native_ids[:2] == [EventId.MODEL_LOAD_STARTED, EventId.BACKEND_DEVICE_SELECTED]
    assert EventId.MODEL_LOAD_PROGRESS in native_ids
    assert native_ids[-1] is EventId.NATIVE_MODEL_LOAD_COMPLETED
    assert all(e.native is not None for e in native)
    sequences = [e.native.sequence for e in native if e.native is not None]
    assert sequences == sorted(sequences) and sequences[0] == 1
    device = next(e for e in native if e.id is EventId.BACKEND_DEVICE_SELECTED)
    assert device.scope.device_id == "CPU"
    assert host.pipeline.state.native_mode is NativeMode.NATIVE
    assert host.pipeline.state.models[LogicalId("tiny")].state is ModelState.AVAILABLE


def test_killed_engine_mid_load_is_a_process_crash_and_the_host_keeps_running(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    # A load that takes seconds: what SKIPPY_TEST_PROGRESS_DELAY_US=200000 makes a runtime
    # tell its engines (the settings are read once, by a process's entry: here, the test).
    host.options = dataclasses.replace(host.options, test_progress_delay_us=200_000)
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    handle = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf")))
    _until(watch, handle.operation_id, {EventId.MODEL_LOAD_PROGRESS})
    engine = host.engine_for(LogicalId("tiny"))
    assert engine is not None
    os.kill(engine.pid, signal.SIGKILL)
    events = _until(watch, handle.operation_id, TERMINALS)
    failed = events[-1]
    assert failed.id is EventId.MODEL_LOAD_FAILED
    assert failed.reason_code is ReasonCode.PROCESS_CRASH
    assert failed.producer is Producer.RECONCILED
    host.options = dataclasses.replace(host.options, test_progress_delay_us=0)
    retry = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf")))
    assert _until(watch, retry.operation_id, TERMINALS)[-1].id is EventId.MODEL_AVAILABLE


def _settled_view(fixture_dir: Path, capture: bool) -> ModelView:
    runtime = RuntimeHost(settings=RuntimeSettings(capture_native_log=capture)).start()
    try:
        watch = runtime.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
        handle = runtime.load_model(LoadOptions(str(fixture_dir / "tiny.gguf")))
        _until(watch, handle.operation_id, TERMINALS)
        engine = runtime.engine_for(LogicalId("tiny"))
        assert engine is not None and engine.ring is not None
        captured = engine.ring.read_debug_log()
        assert bool(captured) is capture  # the raw text exists only when opted in
        view = runtime.pipeline.state.models[LogicalId("tiny")]
    finally:
        runtime.shutdown()
    # timestamps and durations differ run to run; everything else must be identical
    return dataclasses.replace(
        view,
        requested_mono_ns=None,
        updated_mono_ns=0,
        load_duration_ms=None,
        device_memory_free_bytes=None,
    )


def test_native_log_capture_never_changes_reduced_state(fixture_dir: Path) -> None:
    with_logs = _settled_view(fixture_dir, True)
    without_logs = _settled_view(fixture_dir, False)
    assert with_logs == without_logs
    assert with_logs.state is ModelState.AVAILABLE
