"""One record layout: the struct format NativeFact is unpacked with and the numpy dtype are both
derived from the ctypes mirror, and they read every field identically."""

from __future__ import annotations

import ctypes
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.native import abi
from skippyctl.native.ingress import FACT_DTYPE, FactBatch, NativeFact, record_format
from skippyctl.pipeline.native_adapter import NativeFactLike
from tests.native.helpers import assert_decoders_agree, records_of

FACT_SIZE = ctypes.sizeof(abi.skippy_native_fact_v1)
EVENT_OFFSET = abi.skippy_native_fact_v1.event.offset


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=FACT_SIZE, max_size=FACT_SIZE), min_size=1, max_size=8))
def test_native_fact_reads_any_record_as_the_dtype_view_does(raw_records: list[bytes]) -> None:
    batch = FactBatch(b"".join(raw_records), len(raw_records))
    assert_decoders_agree(batch)


def test_a_record_written_through_ctypes_decodes_field_by_field() -> None:
    record = abi.skippy_native_fact_v1()
    record.flags = abi.FactFlag.HAS_SUMMARIES | abi.FactFlag.DETAIL_TRUNCATED
    record.operation_id = 7
    record.coalesced_count = 3
    record.event.category = abi.Category.KV
    record.event.kind = abi.Kind.KV_PRESSURE_CROSSED
    record.event.sequence = 11
    record.event.timestamp_mono_ns = 12
    record.event.progress_current = 13
    record.event.progress_total = 14
    record.event.progress_unit = abi.ProgressUnit.ITEMS
    record.event.failure_code = abi.FailureCode.IO_ERROR
    record.event.numeric_summary_0 = 1
    record.event.numeric_summary_3 = 4
    record.detail_copied_len = 3
    record.detail[:3] = b"CPU"
    batch = FactBatch(bytes(record), 1)
    assert batch[0] == NativeFact(
        operation_id=7,
        coalesced_count=3,
        category=abi.Category.KV,
        kind=abi.Kind.KV_PRESSURE_CROSSED,
        sequence=11,
        timestamp_mono_ns=12,
        progress_current=13,
        progress_total=14,
        progress_unit=abi.ProgressUnit.ITEMS,
        failure_code=abi.FailureCode.IO_ERROR,
        detail=b"CPU",
        numeric_summaries=(1, 0, 0, 4),
    )
    [full] = records_of(batch)
    assert (full.detail_truncated, full.has_summaries, full.unknown_kind) == (True, True, False)


def test_summaries_are_absent_without_the_flag_and_detail_is_bounded() -> None:
    record = abi.skippy_native_fact_v1()
    record.event.numeric_summary_0 = 99
    record.detail_copied_len = 10_000  # never trusted beyond the copy buffer
    fact = FactBatch(bytes(record), 1)[0]
    assert fact.numeric_summaries is None
    assert len(fact.detail) == abi.RUNTIME_EVENT_DETAIL_COPY_BYTES


def test_the_derived_format_follows_the_ctypes_offsets() -> None:
    kind_offset = EVENT_OFFSET + abi.skippy_runtime_event_v1.kind.offset
    assert kind_offset == 52
    unpack = record_format(("operation_id", "event.kind", "detail"))
    assert unpack.size == FACT_SIZE == FACT_DTYPE.itemsize
    data = bytearray(FACT_SIZE)
    struct.pack_into("=Q", data, abi.skippy_native_fact_v1.operation_id.offset, 5)
    struct.pack_into("=I", data, kind_offset, 301)
    operation, kind, detail = unpack.unpack(bytes(data))
    assert (operation, kind, len(detail)) == (5, 301, abi.RUNTIME_EVENT_DETAIL_COPY_BYTES)
    with pytest.raises(ValueError, match="offset order"):
        record_format(("event.kind", "operation_id"))
    with pytest.raises(KeyError):
        record_format(("event.no_such_field",))


def test_native_fact_carries_exactly_what_the_adapter_reads() -> None:
    """Every other field is read from FactBatch.records (tests, diagnostics)."""
    read = {name for name in vars(NativeFactLike) if not name.startswith("_")}
    assert set(NativeFact._fields) == read
