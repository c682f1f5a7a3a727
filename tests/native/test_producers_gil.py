"""C producer threads: exact conservation, the scope-end guarantee, and no GIL on the push path."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from skippyctl.native import (
    EngineAdapter,
    IngressConfig,
    NativeLibrary,
    ProducerReport,
    ProducerThreads,
    SharedIngress,
)
from skippyctl.native.abi import Category, Kind, Lane, TestProducerMode, skippy_runtime_event_v1
from tests.native.helpers import (
    FactRecord,
    assert_lanes_conserved,
    attempts_accounted,
    drain_all_records,
    drain_records,
)

THREADS = 4
RECORDS_PER_THREAD = 50_000


def drain_while_running(ingress: SharedIngress, producers: ProducerThreads) -> list[FactRecord]:
    """The pipeline thread's loop: wait (GIL released), drain a batch, repeat."""
    facts: list[FactRecord] = []
    while not producers.done():
        if ingress.wait(0.05):
            facts.extend(drain_records(ingress))
    return facts


def finish(
    ingress: SharedIngress, producers: ProducerThreads, facts: list[FactRecord]
) -> ProducerReport:
    report = producers.join()
    facts.extend(drain_all_records(ingress))
    return report


@pytest.mark.parametrize("terminal_capacity", [1024, 16])
def test_exact_conservation_with_4_c_producer_threads(
    lib: NativeLibrary, terminal_capacity: int
) -> None:
    with SharedIngress.create(
        IngressConfig(terminal_capacity=terminal_capacity), library=lib
    ) as ingress:
        with EngineAdapter(ingress) as adapter:
            producers = ProducerThreads(
                adapter,
                threads=THREADS,
                records_per_thread=RECORDS_PER_THREAD,
                kind=Kind.MODEL_OPEN_STARTED,
            )
            facts = drain_while_running(ingress, producers)
            report = finish(ingress, producers, facts)
        attempts = THREADS * RECORDS_PER_THREAD
        assert report.records_attempted == attempts
        stats = ingress.stats()
        assert attempts_accounted(ingress) == attempts
        assert stats.terminal.accepted == attempts
        assert stats.terminal.drained == len(facts)
        assert stats.terminal.drained + stats.terminal.dropped_full == attempts
        assert_lanes_conserved(ingress)
        # per producer, what arrived arrived in order and exactly once
        by_thread: dict[int, list[int]] = {}
        for fact in facts:
            by_thread.setdefault(fact.stage_id, []).append(fact.sequence)
        for sequences in by_thread.values():
            assert sequences == sorted(set(sequences))


def test_exact_conservation_with_4_progress_producers_on_their_own_keys(lib: NativeLibrary) -> None:
    with SharedIngress.create(library=lib) as ingress, EngineAdapter(ingress) as adapter:
        producers = ProducerThreads(
            adapter,
            threads=THREADS,
            records_per_thread=RECORDS_PER_THREAD,
            mode=TestProducerMode.PROGRESS_PER_THREAD,
        )
        facts = drain_while_running(ingress, producers)
        finish(ingress, producers, facts)
        stats = ingress.stats()
        attempts = THREADS * RECORDS_PER_THREAD
        assert attempts_accounted(ingress) == attempts
        # one producer per key and draining never locks: only inserting the 4 new keys at the
        # same moment can contend (that first value is dropped and counted)
        assert stats.progress_contended <= THREADS
        assert stats.suppressed_regression == 0
        # a contended value is counted there and not accepted (exact either way)
        assert stats.progress.accepted == attempts - stats.progress_contended
        assert stats.progress.drained == len(facts)
        assert stats.progress.coalesced == sum(f.coalesced_count for f in facts)
        assert_lanes_conserved(ingress)
        last: dict[int, int] = {}
        for fact in facts:
            assert fact.lane == Lane.PROGRESS
            assert fact.progress_current > last.get(fact.operation_id, 0)
            last[fact.operation_id] = fact.progress_current
        assert sorted(last.values()) == [RECORDS_PER_THREAD] * THREADS  # the last value arrives


def test_exact_conservation_with_4_producers_sharing_one_progress_key(lib: NativeLibrary) -> None:
    with SharedIngress.create(library=lib) as ingress, EngineAdapter(ingress) as adapter:
        producers = ProducerThreads(
            adapter,
            threads=THREADS,
            records_per_thread=RECORDS_PER_THREAD,
            kind=Kind.MODEL_OPEN_PROGRESS,
        )
        facts = drain_while_running(ingress, producers)
        finish(ingress, producers, facts)
        stats = ingress.stats()
        assert attempts_accounted(ingress) == THREADS * RECORDS_PER_THREAD
        assert stats.progress.drained == len(facts)
        assert_lanes_conserved(ingress)
        values = [f.progress_current for f in facts]
        assert values == sorted(set(values))  # one key: strictly increasing, never a regression


def test_no_push_after_operation_end(lib: NativeLibrary) -> None:
    """llama.cpp keeps calling the progress callback; once operation_end returns nothing of
    that operation (or, for the llama hooks, anything at all) reaches the ring."""
    with SharedIngress.create(library=lib) as ingress, EngineAdapter(ingress) as adapter:
        producers = ProducerThreads(
            adapter, threads=2, records_per_thread=0, mode=TestProducerMode.LLAMA_PROGRESS
        )
        try:
            for op in range(1, 31):
                adapter.operation_begin(op)
                seen = False
                deadline = time.monotonic() + 10
                while not seen and time.monotonic() < deadline:
                    if ingress.wait(1.0):
                        batch = ingress.drain()
                        assert {f.operation_id for f in batch} <= {op}
                        seen = any(f.operation_id == op for f in batch)
                assert seen
                adapter.operation_end()
                ingress.drain_all()  # whatever was pushed before end returned
                before = producers.attempts()
                while producers.attempts() < before + 20_000:  # callbacks keep coming
                    time.sleep(0.001)
                assert ingress.drain() == []
        finally:
            producers.stop()
            producers.join()
        assert_lanes_conserved(ingress)


def test_no_fact_is_stamped_with_an_ended_operation(lib: NativeLibrary) -> None:
    """Reporter callbacks keep flooding the terminal lane; every fact stamped with an operation
    was accepted before its operation_end returned (ordered against a marker pushed right after
    it), and later facts are unscoped."""
    marker = skippy_runtime_event_v1(
        abi_version=1,
        struct_size=144,
        category=Category.DIAGNOSTIC,
        kind=Kind.DIAGNOSTIC_WARNING_RAISED,
    )
    batch = 4096  # more than the terminal ring, so the diagnostic lane is reached every drain
    with SharedIngress.create(library=lib) as ingress, EngineAdapter(ingress) as adapter:
        producers = ProducerThreads(adapter, threads=2, records_per_thread=0)
        try:
            for op in range(1, 21):
                adapter.operation_begin(op)
                deadline = time.monotonic() + 10
                while not any(f.operation_id == op for f in ingress.drain(batch)):
                    assert time.monotonic() < deadline
                    ingress.wait(1.0)
                adapter.operation_end()
                adapter.emit(marker)
                collected: list[FactRecord] = []
                markers: list[FactRecord] = []
                while not markers:
                    assert time.monotonic() < deadline
                    drained = drain_records(ingress, batch)
                    collected.extend(drained)
                    markers = [f for f in drained if f.kind == Kind.DIAGNOSTIC_WARNING_RAISED]
                before = producers.attempts()
                while producers.attempts() < before + 20_000:  # the flood goes on
                    collected.extend(drain_records(ingress, batch))
                late: list[FactRecord] = []
                while not late:  # the reporter keeps pushing, unscoped
                    assert time.monotonic() < deadline
                    late = drain_records(ingress, batch)
                collected.extend(late)
                [mark] = markers
                stamped = [f for f in collected if f.operation_id == op]
                assert all(f.ingress_sequence < mark.ingress_sequence for f in stamped)
                assert {f.operation_id for f in late} == {0}
        finally:
            producers.stop()
            producers.join()


def test_producers_finish_while_python_holds_the_gil(lib: NativeLibrary) -> None:
    """The wait runs through ctypes.PyDLL (GIL held): a Python thread is frozen for the whole
    wait, yet the C producers complete - they never need the GIL."""
    stop = threading.Event()
    longest_gap = [0, 0]  # (start, end) of the longest stretch the Python thread could not run
    ticks = [0]

    def python_thread() -> None:
        last = time.monotonic_ns()
        while not stop.is_set():
            now = time.monotonic_ns()
            if now - last > longest_gap[1] - longest_gap[0]:
                longest_gap[:] = [last, now]
            last = now
            ticks[0] += 1

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # GIL hand-offs around the held call stay within ~1 ms
    try:
        with SharedIngress.create(library=lib) as ingress, EngineAdapter(ingress) as adapter:
            ticker = threading.Thread(target=python_thread, name="test-gil-ticker")
            ticker.start()
            try:
                while ticks[0] < 1000:
                    time.sleep(0.001)
                producers = ProducerThreads(
                    adapter,
                    threads=THREADS,
                    records_per_thread=250_000,
                    kind=Kind.MODEL_OPEN_STARTED,
                )
                held_from = time.monotonic_ns()
                finished = producers.hold_gil_until_done(timeout_s=60)
                held_until = time.monotonic_ns()
                report = producers.join()
            finally:
                stop.set()
                ticker.join()
    finally:
        sys.setswitchinterval(switch_interval)
    assert finished
    assert report.records_attempted == THREADS * 250_000
    assert held_until - held_from > 20_000_000, "producers finished too fast to prove anything"
    # The Python thread was frozen for (most of) the hold. Its exact edges are left unchecked:
    # on a loaded machine the main thread may be scheduled late after the call returns, so
    # held_until can trail the real release by several milliseconds.
    gap_start, gap_end = longest_gap
    assert gap_end - gap_start >= (held_until - held_from) // 2


@pytest.mark.parametrize("threads", [1, 4])
def test_emit_latency_is_reported(lib: NativeLibrary, threads: int) -> None:
    config = IngressConfig(terminal_capacity=1 << 16)
    with SharedIngress.create(config, library=lib) as ingress, EngineAdapter(ingress) as adapter:
        producers = ProducerThreads(
            adapter, threads=threads, records_per_thread=50_000, kind=Kind.MODEL_OPEN_STARTED
        )
        facts = drain_while_running(ingress, producers)
        report = finish(ingress, producers, facts)
    print(
        f"\nemit latency, {threads} thread(s), {report.records_attempted} emits: "
        f"p50 {report.latency_p50_ns} ns, p99 {report.latency_p99_ns} ns, "
        f"max {report.latency_max_ns} ns, {report.elapsed_ns / 1e6:.1f} ms"
    )
    assert report.records_attempted == threads * 50_000
    assert 0 < report.latency_p50_ns <= report.latency_p99_ns <= report.latency_max_ns
    # The reference budget is p99 <= 100 us; p50 is far below it even on a loaded 2-core box.
    assert report.latency_p50_ns < 100_000
