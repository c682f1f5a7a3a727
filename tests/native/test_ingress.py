"""Validation, lanes, coalescing, drops, close, debug capture and cross-process delivery."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from skippyctl.native import (
    EngineAdapter,
    IngressClosed,
    IngressConfig,
    NativeLibrary,
    SharedIngress,
    WaitResult,
)
from skippyctl.native.abi import Category, FactFlag, Kind, Lane
from tests.native.helpers import (
    assert_lanes_conserved,
    attempts_accounted,
    drain_all_records,
    drain_records,
    emit,
    make_event,
)

ROOT = Path(__file__).resolve().parents[2]


# ---- struct_size / abi_version / detail / discriminant validation ----


def test_struct_size_111_is_rejected(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    emit(adapter, make_event(struct_size=111))
    assert ingress.drain() == []
    stats = ingress.stats()
    assert stats.rejected_struct_size == 1
    assert stats.total_accepted == 0


def test_struct_size_112_is_accepted_with_summaries_absent(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(struct_size=112, kind=Kind.MODEL_OPEN_FINISHED, model_id=5))
    [fact] = drain_records(ingress)
    assert fact.source_struct_size == 112
    assert fact.model_id == 5
    assert not fact.has_summaries
    assert fact.numeric_summaries is None
    assert not fact.larger_struct


def test_struct_size_144_carries_numeric_summaries(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(
        adapter,
        make_event(
            numeric_summary_0=1, numeric_summary_1=2, numeric_summary_2=3, numeric_summary_3=4
        ),
    )
    [fact] = drain_records(ingress)
    assert fact.has_summaries
    assert fact.flags == FactFlag.HAS_SUMMARIES
    assert fact.numeric_summaries == (1, 2, 3, 4)


def test_larger_struct_is_accepted_reading_only_known_fields(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(
        adapter,
        make_event(
            struct_size=200,
            kind=Kind.KV_INITIALIZED,
            category=Category.KV,
            stage_id=3,
            numeric_summary_3=99,
            tail_fill=0xEE,
        ),
    )
    [fact] = drain_records(ingress)
    assert fact.source_struct_size == 200
    assert fact.larger_struct
    assert fact.has_summaries
    assert fact.numeric_summaries == (0, 0, 0, 99)
    assert (fact.category, fact.kind, fact.stage_id) == (Category.KV, Kind.KV_INITIALIZED, 3)


def test_abi_version_2_is_rejected(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    emit(adapter, make_event(abi_version=2))
    assert ingress.drain() == []
    assert ingress.stats().rejected_abi_version == 1


def test_detail_longer_than_1_mib_is_rejected(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(detail=b"x" * 16, detail_len=1024 * 1024 + 1))
    emit(adapter, make_event(detail=b"x" * 16, detail_len=1024 * 1024 * 1024))
    assert ingress.drain() == []
    assert ingress.stats().rejected_detail == 2


def test_detail_length_without_pointer_is_rejected(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(detail=b"abc", null_detail_ptr=True))
    assert ingress.drain() == []
    assert ingress.stats().rejected_detail == 1


def test_detail_of_exactly_1_mib_is_accepted_and_truncated(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    big = bytes(range(256)) * 4096
    emit(adapter, make_event(detail=big))
    [fact] = drain_records(ingress)
    assert fact.detail_len == 1024 * 1024
    assert fact.detail == big[:256]
    assert fact.detail_truncated


def test_1000_byte_detail_is_truncated_to_256_with_flag(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    detail = bytes((i * 7) % 251 for i in range(1000))
    emit(adapter, make_event(detail=detail))
    [fact] = drain_records(ingress)
    assert fact.detail == detail[:256]
    assert fact.detail_len == 1000
    assert fact.detail_truncated
    assert ingress.stats().detail_truncated == 1


def test_short_detail_is_copied_whole(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    emit(adapter, make_event(detail=b"CPU"))
    [fact] = drain_records(ingress)
    assert fact.detail == b"CPU"
    assert not fact.detail_truncated


def test_unknown_kind_is_accepted_into_the_diagnostic_lane_and_counted(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(kind=9999))
    [fact] = drain_records(ingress)
    assert fact.kind == 9999
    assert fact.lane == Lane.DIAGNOSTIC
    assert fact.unknown_kind
    stats = ingress.stats()
    assert stats.unknown_kind == 1
    assert stats.diagnostic.accepted == 1


def test_unknown_category_is_flagged_unknown(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(category=42, kind=Kind.MODEL_OPEN_STARTED))
    [fact] = drain_records(ingress)
    assert fact.unknown_kind
    assert fact.lane == Lane.DIAGNOSTIC


def test_category_zero_is_rejected(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    emit(adapter, make_event(category=0))
    assert ingress.drain() == []
    assert ingress.stats().rejected_discriminant == 1


@pytest.mark.parametrize(
    ("kind", "lane"),
    [
        (Kind.MODEL_OPEN_STARTED, Lane.TERMINAL),
        (Kind.MODEL_OPEN_PROGRESS, Lane.PROGRESS),
        (Kind.MODEL_OPEN_BACKEND_DEVICE_SELECTED, Lane.TERMINAL),
        (Kind.MODEL_OPEN_FINISHED, Lane.TERMINAL),
        (Kind.MODEL_OPEN_FAILED_HANDLED, Lane.TERMINAL),
        (Kind.MODEL_LOAD_PHASE_CHANGED, Lane.TERMINAL),
        (Kind.MODEL_LOAD_AUX_COMPONENT_READY, Lane.TERMINAL),
        (Kind.KV_INITIALIZED, Lane.TERMINAL),
        (Kind.KV_CAPACITY_EXHAUSTED, Lane.TERMINAL),
        (Kind.DEVICE_BACKEND_INITIALIZED, Lane.TERMINAL),
        (Kind.DEVICE_FALLBACK_ACTIVATED, Lane.TERMINAL),
        (Kind.DIAGNOSTIC_WARNING_RAISED, Lane.DIAGNOSTIC),
        (Kind.DIAGNOSTIC_WARNING_CLEARED, Lane.DIAGNOSTIC),
        (Kind.DIAGNOSTIC_RECOVERABLE_FAILURE, Lane.DIAGNOSTIC),
        (Kind.DIAGNOSTIC_FATAL_FAILURE, Lane.TERMINAL),
        (Kind.DIAGNOSTIC_INVARIANT_VIOLATION, Lane.TERMINAL),
        (Kind.UNLOAD_STARTED, Lane.TERMINAL),
        (Kind.UNLOAD_SESSION_DRAINING, Lane.TERMINAL),
    ],
)
def test_each_kind_travels_in_its_service_class(
    adapter: EngineAdapter, ingress: SharedIngress, kind: Kind, lane: Lane
) -> None:
    emit(adapter, make_event(kind=kind, progress_current=1))
    [fact] = drain_records(ingress)
    assert fact.lane == lane
    assert not fact.unknown_kind


def test_drain_returns_terminal_then_progress_then_diagnostic(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event(kind=Kind.DIAGNOSTIC_WARNING_RAISED))
    emit(adapter, make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=1))
    emit(adapter, make_event(kind=Kind.MODEL_OPEN_STARTED))
    facts = drain_records(ingress)
    assert [fact.lane for fact in facts] == [Lane.TERMINAL, Lane.PROGRESS, Lane.DIAGNOSTIC]
    # ingress_sequence keeps the acceptance order across lanes
    assert [fact.ingress_sequence for fact in facts] == [3, 2, 1]


def test_drain_respects_max_records(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    for _ in range(10):
        emit(adapter, make_event())
    assert len(ingress.drain(3)) == 3
    assert len(ingress.drain(100)) == 7


# ---- progress coalescing ----


def test_1000_progress_values_without_draining_coalesce_into_one_record(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    adapter.operation_begin(11)
    for value in range(1, 1001):
        emit(
            adapter,
            make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=value, sequence=value),
        )
    adapter.operation_end()
    [fact] = ingress.drain()
    assert fact.progress_current == 1000
    assert fact.sequence == 1000
    assert fact.coalesced_count == 999
    assert fact.operation_id == 11
    stats = ingress.stats()
    assert stats.progress.accepted == 1000
    assert stats.progress.coalesced == 999
    assert stats.progress.drained == 1
    assert_lanes_conserved(ingress)


def test_progress_regression_and_duplicates_are_suppressed(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    adapter.operation_begin(12)
    for value in (10, 20, 15, 20, 30):
        emit(adapter, make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=value))
    [fact] = ingress.drain()
    assert fact.progress_current == 30
    assert fact.coalesced_count == 2  # 10 and 20 were replaced
    # a value below the last one is still a regression after the drain
    emit(adapter, make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=29))
    adapter.operation_end()
    assert ingress.drain() == []
    stats = ingress.stats()
    assert stats.suppressed_regression == 3
    assert attempts_accounted(ingress) == 6
    assert_lanes_conserved(ingress)


def test_progress_keys_are_per_operation(adapter: EngineAdapter, ingress: SharedIngress) -> None:
    for op in (1, 2, 3):
        adapter.operation_begin(op)
        emit(adapter, make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=op * 10))
        adapter.operation_end()
    facts = ingress.drain()
    assert sorted((f.operation_id, f.progress_current) for f in facts) == [
        (1, 10),
        (2, 20),
        (3, 30),
    ]


def test_full_progress_table_drops_new_keys_and_counts_them(
    small_adapter: EngineAdapter, small_ingress: SharedIngress
) -> None:
    for op in range(1, 7):  # 4 slots
        small_adapter.operation_begin(op)
        emit(small_adapter, make_event(kind=Kind.MODEL_OPEN_PROGRESS, progress_current=1))
        small_adapter.operation_end()
    assert small_ingress.stats().progress.dropped_full == 2
    assert len(small_ingress.drain()) == 4
    assert_lanes_conserved(small_ingress)


# ---- bounded lanes ----


def test_full_diagnostic_lane_drops_with_a_counter_and_terminal_lane_is_unaffected(
    small_adapter: EngineAdapter, small_ingress: SharedIngress
) -> None:
    for _ in range(20):  # capacity 8
        emit(
            small_adapter,
            make_event(category=Category.DIAGNOSTIC, kind=Kind.DIAGNOSTIC_WARNING_RAISED),
        )
    for _ in range(5):
        emit(small_adapter, make_event(category=Category.UNLOAD, kind=Kind.UNLOAD_COMPLETED))
    stats = small_ingress.stats()
    assert stats.diagnostic.accepted == 20
    assert stats.diagnostic.dropped_full == 12
    assert stats.terminal.dropped_full == 0
    facts = drain_all_records(small_ingress)
    assert sum(f.lane == Lane.TERMINAL for f in facts) == 5
    assert sum(f.lane == Lane.DIAGNOSTIC for f in facts) == 8
    assert_lanes_conserved(small_ingress)


def test_full_terminal_lane_never_blocks_and_counts_drops(
    small_adapter: EngineAdapter, small_ingress: SharedIngress
) -> None:
    for _ in range(40):  # capacity 16
        emit(small_adapter, make_event())
    stats = small_ingress.stats()
    assert stats.terminal.dropped_full == 24
    assert len(small_ingress.drain_all()) == 16
    # drained slots are reusable
    emit(small_adapter, make_event())
    assert len(small_ingress.drain()) == 1
    assert_lanes_conserved(small_ingress)


# ---- wait / close ----


def test_wait_times_out_when_nothing_is_pending(ingress: SharedIngress) -> None:
    start = time.monotonic()
    assert ingress.wait_status(0.05) is WaitResult.TIMEOUT
    assert time.monotonic() - start >= 0.04


def test_wait_returns_at_once_when_facts_are_pending(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event())
    assert ingress.wait(10.0)


def test_a_producer_thread_wakes_a_sleeping_wait(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    results: list[bool] = []
    started = threading.Event()

    def host() -> None:
        started.set()
        results.append(ingress.wait(30.0))

    thread = threading.Thread(target=host, name="test-host-wait")
    thread.start()
    started.wait()
    emit(adapter, make_event())
    thread.join(10.0)
    assert results == [True]


def test_closed_ingress_rejects_and_wait_reports_closed_once_empty(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    emit(adapter, make_event())
    ingress.mark_closed()
    emit(adapter, make_event())
    assert ingress.stats().rejected_closed == 1
    assert ingress.wait_status(1.0) is WaitResult.PENDING  # what was accepted can be drained
    assert len(ingress.drain()) == 1
    assert ingress.wait_status(1.0) is WaitResult.CLOSED


def test_close_wakes_a_sleeping_wait(ingress: SharedIngress) -> None:
    results: list[WaitResult] = []
    started = threading.Event()

    def host() -> None:
        started.set()
        results.append(ingress.wait_status(30.0))

    thread = threading.Thread(target=host, name="test-host-wait")
    thread.start()
    started.wait()
    time.sleep(0.05)  # let it reach the futex; correctness does not depend on it
    ingress.mark_closed()
    thread.join(10.0)
    assert results == [WaitResult.CLOSED]


def test_close_is_idempotent_and_later_calls_raise(lib: NativeLibrary) -> None:
    region = SharedIngress.create(library=lib)
    engine = EngineAdapter(region)
    region.close()
    region.close()
    with pytest.raises(IngressClosed):
        region.drain()
    with pytest.raises(IngressClosed):
        _ = engine.handle  # adapters die with their mapping


# ---- regions ----


def test_config_capacities_must_be_powers_of_two(lib: NativeLibrary) -> None:
    with pytest.raises(ValueError, match="powers of two"):
        SharedIngress.create(IngressConfig(terminal_capacity=1000), library=lib)


def test_attach_refuses_memory_that_is_not_a_region(lib: NativeLibrary) -> None:
    fd = os.memfd_create("not-a-region")
    try:
        os.ftruncate(fd, 1 << 20)
        with pytest.raises(ValueError, match="not a skippy ingress region"):
            SharedIngress.attach(fd, library=lib)
    finally:
        os.close(fd)


def test_region_cannot_be_resized_by_an_engine(ingress: SharedIngress) -> None:
    with pytest.raises(PermissionError):
        os.ftruncate(ingress.fd, 4096)


def test_cancel_word_is_seen_by_the_abort_callback(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    abort = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)(adapter.abort_callback_address)
    assert not abort(adapter.user_data)  # no scope
    adapter.operation_begin(21)
    assert not abort(adapter.user_data)
    ingress.request_cancel(20)
    assert not abort(adapter.user_data)  # another operation
    ingress.request_cancel(21)
    assert abort(adapter.user_data)
    adapter.operation_end()
    assert not abort(adapter.user_data)


# ---- debug log capture ----


def _log(adapter: EngineAdapter, level: int, text: bytes) -> None:
    adapter._lib.cdll.skippy_llama_log_callback(level, text, adapter.handle)


def test_log_lines_are_counted_by_level_and_captured_only_when_opted_in(
    ingress: SharedIngress,
) -> None:
    with EngineAdapter(ingress) as quiet:
        _log(quiet, 2, b"load: not captured\n")
    assert ingress.read_debug_log() == []
    with EngineAdapter(ingress, capture_debug_log=True) as verbose:
        _log(verbose, 2, b"llama_model_loader: loaded meta data\n")
        _log(verbose, 3, b"warn: something\n")
        _log(verbose, 5, b"... continued\n")
        _log(verbose, 17, b"odd level\n")
    stats = ingress.stats()
    assert stats.log_messages_by_level == (1, 0, 2, 1, 0, 1)
    assert stats.debug_lines_captured == 4
    assert ingress.read_debug_log() == [
        "llama_model_loader: loaded meta data",
        "warn: something",
        "... continued",
        "odd level",
    ]
    assert ingress.read_debug_log() == []


def test_debug_ring_bounds_messages_and_counts_dropped_bytes(
    small_ingress: SharedIngress,
) -> None:
    with EngineAdapter(small_ingress, capture_debug_log=True) as verbose:
        _log(verbose, 1, b"y" * 300 + b"\n")  # 256-byte ring: 124-byte message bound
        for _ in range(10):  # then overflow the ring
            _log(verbose, 1, b"z" * 100 + b"\n")
    stats = small_ingress.stats()
    lines = small_ingress.read_debug_log()
    assert lines[0] == "y" * 123  # bounded, and the line is still terminated
    assert lines[1] == "z" * 100
    assert stats.debug_bytes_dropped >= 301 - 123
    assert stats.debug_lines_captured == len(lines)


# ---- cross-process ----

CHILD = textwrap.dedent(
    """
    import sys
    from skippyctl.native import EngineAdapter, SharedIngress
    from skippyctl.native.abi import skippy_runtime_event_v1

    ingress = SharedIngress.attach(int(sys.argv[1]))
    adapter = EngineAdapter(ingress)
    sys.stdin.readline()  # go
    adapter.model_load_begin(77, 5)
    for kind in (100, 102, 103):
        adapter.emit(skippy_runtime_event_v1(abi_version=1, struct_size=144, category=1, kind=kind))
    print("emitted", flush=True)
    sys.stdin.readline()  # parked until killed
    """
)


def _spawn_child(fd: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(fd)],
        pass_fds=(fd,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def test_child_process_facts_wake_the_host_and_survive_sigkill(ingress: SharedIngress) -> None:
    child = _spawn_child(ingress.fd)
    assert child.stdin is not None and child.stdout is not None
    try:
        woke: list[WaitResult] = []
        waiting = threading.Event()

        def host() -> None:
            waiting.set()
            woke.append(ingress.wait_status(60.0))

        thread = threading.Thread(target=host, name="test-host-wait")
        thread.start()
        waiting.wait()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "emitted"
        thread.join(30.0)
        assert woke == [WaitResult.PENDING]  # a futex wake from another process
        child.send_signal(signal.SIGKILL)
        assert child.wait(30.0) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    facts = ingress.drain_all()
    assert [(f.operation_id, f.kind) for f in facts] == [(77, 1), (77, 100), (77, 102), (77, 103)]
    assert [f.sequence for f in facts][:1] == [1]
    assert_lanes_conserved(ingress)
