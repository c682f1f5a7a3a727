"""The trampoline accepts or counts anything, never crashes, never reads past struct_size."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from skippyctl.native import EngineAdapter, IngressConfig, NativeLibrary, SharedIngress
from skippyctl.native.abi import (
    RUNTIME_EVENT_DETAIL_COPY_BYTES,
    RUNTIME_EVENT_MAX_DETAIL_LEN_BYTES,
    Kind,
    Lane,
    skippy_runtime_event_v1,
)
from tests.native.helpers import (
    GuardedBuffer,
    assert_decoders_agree,
    assert_lanes_conserved,
    attempts_accounted,
    drain_records,
    emit_guarded,
    make_event,
    records_of,
)

KNOWN_KINDS = {int(k) for k in Kind}
DETAIL_SOURCE = bytes(range(256)) * 2  # 512 readable bytes: more than any copy


@pytest.fixture(scope="module")
def guard() -> GuardedBuffer:
    return GuardedBuffer()


@pytest.fixture(scope="module")
def detail_source() -> Iterator[int]:
    import ctypes

    buffer = ctypes.create_string_buffer(DETAIL_SOURCE, len(DETAIL_SOURCE))
    yield ctypes.addressof(buffer)
    del buffer


def expected_outcome(
    abi_version: int, struct_size: int, category: int, detail_len: int, detail_ptr: int
) -> str:
    """Reference model of the trampoline's validation order."""
    if abi_version != 1:
        return "rejected_abi_version"
    if struct_size < 112:
        return "rejected_struct_size"
    if detail_len > RUNTIME_EVENT_MAX_DETAIL_LEN_BYTES or (detail_len and not detail_ptr):
        return "rejected_detail"
    if category == 0:
        return "rejected_discriminant"
    return "accepted"


def expected_lane(category: int, kind: int) -> Lane:
    if not (1 <= category <= 8) or kind not in KNOWN_KINDS:
        return Lane.DIAGNOSTIC
    if kind == Kind.MODEL_OPEN_PROGRESS:
        return Lane.PROGRESS
    if 400 <= kind <= 402:
        return Lane.DIAGNOSTIC
    return Lane.TERMINAL


u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    struct_size=st.one_of(
        st.integers(112, 400),
        st.integers(112, 400),
        st.integers(0, 111),
        st.sampled_from([0, 8, 111, 112, 113, 143, 144, 145, 200, 4096]),
    ),
    abi_version=st.integers(0, 3).flatmap(lambda i: u32 if i == 3 else st.just(1)),
    category=st.one_of(st.integers(1, 9), st.integers(0, 9), u32),
    kind=st.one_of(st.sampled_from(sorted(KNOWN_KINDS)), u32),
    detail_len=st.one_of(
        st.just(0),
        st.integers(0, 600),
        st.integers(RUNTIME_EVENT_MAX_DETAIL_LEN_BYTES - 1, RUNTIME_EVENT_MAX_DETAIL_LEN_BYTES + 1),
        u64,
    ),
    null_detail=st.booleans(),
    noise=st.binary(max_size=512),
)
def test_arbitrary_bytes_are_accepted_or_counted_never_crash(
    lib: NativeLibrary,
    guard: GuardedBuffer,
    detail_source: int,
    struct_size: int,
    abi_version: int,
    category: int,
    kind: int,
    detail_len: int,
    null_detail: bool,
    noise: bytes,
) -> None:
    # Random bytes, ending exactly at a PROT_NONE page: a read past struct_size kills the test.
    length = max(8, struct_size)
    data = bytearray(noise.ljust(length, b"\0")[:length])
    struct.pack_into("=II", data, 0, abi_version, struct_size)
    detail_ptr = 0 if null_detail else detail_source
    if length >= 16:
        struct.pack_into("=II", data, 8, category, kind)
    else:
        category = kind = 0  # not readable: the event is rejected before these are read
    if length >= 112:
        # never hand the trampoline a random pointer: NULL or 512 readable bytes
        struct.pack_into("=QQ", data, 96, detail_ptr, detail_len)
    else:
        detail_len = 0
    region = SharedIngress.create(
        IngressConfig(terminal_capacity=4, diagnostic_capacity=4, progress_slots=2, debug_bytes=64),
        library=lib,
    )
    try:
        with EngineAdapter(region) as engine:
            emit_guarded(engine, guard, bytes(data))
        outcome = expected_outcome(abi_version, struct_size, category, detail_len, detail_ptr)
        event(outcome)
        stats = region.stats()
        assert attempts_accounted(region) == 1
        batch = region.drain_batch()
        assert_decoders_agree(batch)
        facts = records_of(batch)
        assert region.drain_all() == []
        if outcome != "accepted":
            assert getattr(stats, outcome) == 1
            assert facts == []
            return
        [fact] = facts
        assert fact.lane == expected_lane(category, kind)
        assert fact.unknown_kind == (
            fact.lane == Lane.DIAGNOSTIC
            and not 400 <= kind <= 402
            or not 1 <= category <= 8
            or kind not in KNOWN_KINDS
        )
        assert (fact.category, fact.kind) == (category, kind)
        assert fact.source_struct_size == struct_size
        assert fact.has_summaries == (struct_size >= 144)
        assert fact.larger_struct == (struct_size > 144)
        if struct_size < 144:
            assert fact.numeric_summaries is None
        else:
            assert fact.numeric_summaries == struct.unpack_from("=QQQQ", data, 112)
        copied = min(detail_len, RUNTIME_EVENT_DETAIL_COPY_BYTES)
        assert fact.detail == DETAIL_SOURCE[:copied]
        assert fact.detail_len == detail_len
        assert fact.detail_truncated == (detail_len > RUNTIME_EVENT_DETAIL_COPY_BYTES)
        # every known field is the producer's byte-for-byte (detail_ptr is never exported)
        (sequence, timestamp, model, stage, session, current, total) = struct.unpack_from(
            "=7Q", data, 24
        )
        assert (fact.sequence, fact.timestamp_mono_ns, fact.model_id) == (
            sequence,
            timestamp,
            model,
        )
        assert (fact.stage_id, fact.session_id) == (stage, session)
        assert (fact.progress_current, fact.progress_total) == (current, total)
        assert_lanes_conserved(region)
    finally:
        region.close()


def test_a_112_byte_event_flush_against_a_guard_page_is_read_safely(
    adapter: EngineAdapter, ingress: SharedIngress, guard: GuardedBuffer
) -> None:
    event = make_event(struct_size=112, kind=Kind.KV_INITIALIZED, category=4, model_id=3)
    emit_guarded(adapter, guard, event.data)
    eight_bytes = make_event(struct_size=111).data[:8]
    emit_guarded(adapter, guard, eight_bytes)  # only the header is readable: rejected
    [fact] = drain_records(ingress)
    assert fact.model_id == 3
    assert ingress.stats().rejected_struct_size == 1


def test_reporter_callback_stamps_the_active_operation(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    event = skippy_runtime_event_v1(abi_version=1, struct_size=144, category=1, kind=1)
    adapter.emit(event)  # no scope
    adapter.operation_begin(31, model_id=4)
    adapter.emit(event)
    adapter.operation_end()
    adapter.emit(event)
    assert [f.operation_id for f in ingress.drain()] == [0, 31, 0]


def test_operation_begin_refuses_id_zero_and_nested_scopes(adapter: EngineAdapter) -> None:
    with pytest.raises(ValueError, match="operation_begin"):
        adapter.operation_begin(0)
    adapter.operation_begin(1)
    with pytest.raises(ValueError, match="operation_begin"):
        adapter.operation_begin(2)
    adapter.operation_end()
    adapter.operation_begin(2)
    adapter.operation_end()


def test_null_user_data_or_event_never_crashes(
    lib: NativeLibrary, adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    event = skippy_runtime_event_v1(abi_version=1, struct_size=144, category=1, kind=1)
    lib.cdll.skippy_trampoline_v1(event, None)  # no adapter: nothing to count into
    lib.cdll.skippy_trampoline_v1(None, adapter.handle)
    assert ingress.stats().rejected_struct_size == 1
    assert lib.cdll.skippy_llama_progress_callback(0.5, None) is True
    assert lib.cdll.skippy_llama_abort_callback(None) is False
    lib.cdll.skippy_llama_log_callback(2, None, adapter.handle)  # counted, nothing captured
    assert ingress.stats().log_messages_by_level[2] == 1
