"""Host memory pressure: hysteresis over the available share, and the scheduler's crossed and
cleared events through the real pipeline and reducer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, SummaryKey
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.memory_pressure import (
    HostMemory,
    MemoryPressure,
    host_memory,
)
from skippyctl.runtime.scheduler import Scheduler

GIB = 1 << 30
HOST = LogicalId("host")


@pytest.mark.parametrize(
    ("available_gib", "expected"),
    [
        # (available of 100 GiB after each reading, the change it reports)
        (
            [50, 12, 9, 12, 14, 15, 9.9, 20],
            [None, None, "crossed", None, None, "cleared", "crossed", "cleared"],
        ),
        ([5, 5, 14.9, 15], ["crossed", None, None, "cleared"]),
        ([15, 10, 10], [None, None, None]),  # exactly at the entry threshold is not pressure
    ],
)
def test_pressure_crosses_below_ten_percent_and_clears_at_fifteen(
    available_gib: list[float], expected: list[str | None]
) -> None:
    tracker = MemoryPressure()
    changes = [tracker.observe(int(a * GIB), 100 * GIB) for a in available_gib]
    assert [None if c is None else c.value for c in changes] == expected


def test_a_reading_without_a_total_changes_nothing() -> None:
    tracker = MemoryPressure()
    assert tracker.observe(0, 0) is None
    assert not tracker.under_pressure


def test_host_memory_reads_mem_available_not_free_pages(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       16384 kB\nMemFree:          512 kB\nMemAvailable:    8192 kB\n"
    )
    assert host_memory(meminfo) == HostMemory(8192 * 1024, 16384 * 1024)


def test_host_memory_falls_back_to_sysconf_without_proc(tmp_path: Path) -> None:
    reading = host_memory(tmp_path / "missing")
    assert reading is not None and reading.total_bytes > 0


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    host = RuntimeHost(Pipeline()).start()
    scheduler = Scheduler(host)  # housekeeping not started: the test drives the observations
    yield scheduler
    scheduler.shutdown()
    host.shutdown()


def test_the_scheduler_reports_host_pressure_crossed_then_cleared(scheduler: Scheduler) -> None:
    readings = iter(
        [
            HostMemory(50 * GIB, 100 * GIB),
            HostMemory(5 * GIB, 100 * GIB),
            HostMemory(8 * GIB, 100 * GIB),
            HostMemory(30 * GIB, 100 * GIB),
        ]
    )
    scheduler.read_host_memory = lambda: next(readings)
    pipeline = scheduler.host.pipeline
    watch = pipeline.subscribe("test", max_queue_size=1000)
    for _ in range(4):
        scheduler._observe_host_memory()
    seen = []
    while (item := watch.get(2.0)) is not None:
        if item.event.id in (EventId.MEMORY_PRESSURE_CROSSED, EventId.MEMORY_PRESSURE_CLEARED):
            seen.append(item.event)
        if len(seen) == 2:
            break
    assert [e.id for e in seen] == [
        EventId.MEMORY_PRESSURE_CROSSED,
        EventId.MEMORY_PRESSURE_CLEARED,
    ]
    assert all(e.scope.device_id == HOST for e in seen)
    assert seen[0].summary_value(SummaryKey.MEMORY_FREE_BYTES) == 5 * GIB
    state = pipeline.wait_state(lambda s: HOST in s.devices, 5.0)
    assert state is not None
    assert state.devices[HOST].memory_pressure is False
    assert state.counters.rejected_transitions == 0
    assert scheduler.memory_pressure.under_pressure is False


def test_pressure_that_crosses_while_a_model_loads_is_that_model_s_memory_pressure(
    fixture_dir: Path,
) -> None:
    # Slow loads (every native progress step waits 2 ms) so the crossing lands mid-load. The
    # low reading stands in for the kernel's (low host memory is not produced on demand).
    slow = RuntimeSettings(test_progress_delay_us=2000)
    host = RuntimeHost(Pipeline(), settings=slow).start()
    scheduler = Scheduler(host)
    watch = host.pipeline.subscribe("test", max_queue_size=10_000)
    try:
        handle = scheduler.load(LoadOptions(str(fixture_dir / "tiny.gguf")))
        assert handle.problem is None
        scheduler.read_host_memory = lambda: HostMemory(5 * GIB, 100 * GIB)
        scheduler.start()  # its housekeeping watches pressure closely while the load runs
        seen = []
        while (item := watch.get(10.0)) is not None:
            seen.append(item.event)
            if item.event.id is EventId.MODEL_AVAILABLE:
                break
    finally:
        scheduler.shutdown()
        host.shutdown()
    ids = [e.id for e in seen]
    (pressure,) = [e for e in seen if e.id is EventId.MODEL_MEMORY_PRESSURE]
    assert pressure.scope.model_id == LogicalId("tiny")
    assert pressure.summary_value(SummaryKey.MEMORY_FREE_BYTES) == 5 * GIB
    assert ids.index(EventId.MODEL_MEMORY_PRESSURE) < ids.index(EventId.MODEL_AVAILABLE)
    assert EventId.MEMORY_PRESSURE_CROSSED in ids
    observed = next(e for e in seen if e.id is EventId.MEMORY_OBSERVED)  # the OS's own reading
    free = observed.summary_value(SummaryKey.MEMORY_FREE_BYTES)
    total = observed.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
    assert free is not None and total is not None and 0 < free <= total
