"""What llama.cpp and ggml report about a failure reaches the event stream from the native layer,
not from log text. In-process host, real engines.

A GGUF whose vocabulary holds a token twice trips a GGML_ASSERT in llama.cpp's vocabulary load:
ggml aborts the engine. Its abort hook (native/src/llama_adapter.c) writes the fatal failure into
the shared ring first, so the host reports why before it reports the crash.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import Producer, ReasonCode, Severity
from skippyctl.reducer.state import DeviceState
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.requests import GenerationParams
from skippyctl.runtime.scheduler import Scheduler

WAIT_S = 60.0


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    host = RuntimeHost().start()
    made = Scheduler(host).start()
    try:
        yield made
    finally:
        made.shutdown()
        host.shutdown()


def events_until(scheduler: Scheduler, last: EventId) -> list[Event]:
    """Every event from the start up to the first ``last`` (replayed, so none is missed)."""
    watch = scheduler.host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
    seen: list[Event] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        item = watch.get(0.1)
        if item is None:
            continue
        seen.append(item.event)
        if item.event.id is last:
            return seen
    raise AssertionError(f"{last} did not come")


def test_a_ggml_assert_in_a_load_is_a_fatal_native_failure_before_the_crash(
    scheduler: Scheduler, fixture_dir: Path
) -> None:
    handle = scheduler.load(LoadOptions(str(fixture_dir / "duplicate-token.gguf")))
    assert handle.problem is None
    seen = events_until(scheduler, EventId.ENGINE_PROCESS_CRASHED)
    ids = [e.id for e in seen]
    assert ids.count(EventId.FATAL_NATIVE_FAILURE) == 1
    fatal = seen[ids.index(EventId.FATAL_NATIVE_FAILURE)]
    assert fatal.producer is Producer.NATIVE
    assert fatal.severity is Severity.FATAL
    assert fatal.reason_code is ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE  # inside the load
    assert fatal.scope.model_id == LogicalId("duplicate-token")
    assert fatal.operation_id == handle.operation_id
    assert ids.index(EventId.FATAL_NATIVE_FAILURE) < ids.index(EventId.MODEL_LOAD_FAILED)
    assert ids.index(EventId.MODEL_LOAD_FAILED) < ids.index(EventId.ENGINE_PROCESS_CRASHED)
    # ggml's message names source files by absolute path: none of it is in the event.
    assert "/" not in repr(fatal.summaries) and "GGML" not in repr(fatal)


def test_a_decode_a_forced_unload_aborts_is_a_recoverable_native_failure(
    fixture_dir: Path,
) -> None:
    # Every llama_decode waits 300 ms first: the forced unload's abort flag is up when the
    # next decode starts, and ggml's abort callback stops it (llama_decode returns 2).
    host = RuntimeHost(settings=RuntimeSettings(test_decode_delay_ms=300)).start()
    scheduler = Scheduler(host).start()
    try:
        handle = scheduler.load(LoadOptions(str(fixture_dir / "tiny.gguf"), lanes=1))
        assert handle.problem is None
        events_until(scheduler, EventId.MODEL_AVAILABLE)
        request, rejection = scheduler.generate(
            "tiny", GenerationParams(prompt="Once upon a time", max_tokens=200)
        )
        assert rejection is None and scheduler.enqueue(request) is None
        events_until(scheduler, EventId.FIRST_TOKEN_PRODUCED)
        assert scheduler.unload("tiny", force=True) is not None
        events_until(scheduler, EventId.UNLOAD_COMPLETED)
        # The failure comes from the native layer's ring, the unload's end from the host: two
        # producers, whose order in the stream is not promised (a full run once had no failure
        # before the end). So wait for the failure itself, from the start again.
        seen = events_until(scheduler, EventId.RECOVERABLE_NATIVE_FAILURE)
    finally:
        scheduler.shutdown()
        host.shutdown()
    (aborted,) = [e for e in seen if e.id is EventId.RECOVERABLE_NATIVE_FAILURE]
    assert aborted.reason_code is ReasonCode.CANCELLATION
    assert aborted.summary_value(SummaryKey.RETURN_CODE) == 2  # llama_decode: aborted
    assert aborted.scope.model_id == LogicalId("tiny")
    assert EventId.COMPUTE_FAILURE not in [e.id for e in seen]  # nothing failed to compute
    # The aborted batch may have left part of itself in its lane: the lane's KV was emptied.
    (reset,) = [e for e in seen if e.id is EventId.CACHE_RESET]
    assert reset.scope.model_id == LogicalId("tiny")


def test_a_serving_device_below_its_low_memory_mark_is_degraded(fixture_dir: Path) -> None:
    # Any machine has less than 99.99 % of its memory free: ggml's own reading of the CPU
    # device crosses this mark at the watch's first sample.
    host = RuntimeHost(settings=RuntimeSettings(device_low_free_pct=99.99)).start()
    scheduler = Scheduler(host).start()
    try:
        assert scheduler.load(LoadOptions(str(fixture_dir / "tiny.gguf"))).problem is None
        seen = events_until(scheduler, EventId.DEVICE_DEGRADED)
        degraded = seen[-1]
        assert degraded.scope.device_id == LogicalId("CPU")
        assert degraded.scope.model_id == LogicalId("tiny")
        free = degraded.summary_value(SummaryKey.MEMORY_FREE_BYTES)
        total = degraded.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
        assert free is not None and total is not None and 0 < free < total * 0.9999
        device = scheduler.host.pipeline.wait_state(
            lambda state: LogicalId("CPU") in state.devices, 5.0
        )
        assert device is not None
        assert device.devices[LogicalId("CPU")].state is DeviceState.DEGRADED
    finally:
        scheduler.shutdown()
        host.shutdown()
