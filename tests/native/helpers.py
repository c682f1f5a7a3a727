"""Builders for raw events, a guard-page buffer that faults on any read past its end, and the
full view of drained records (every field, read through the numpy dtype)."""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass, field
from typing import NamedTuple

from skippyctl.native import EngineAdapter, SharedIngress
from skippyctl.native.abi import (
    RUNTIME_EVENT_DETAIL_COPY_BYTES,
    RUNTIME_EVENT_V1_FULL_SIZE,
    Category,
    FactFlag,
    Kind,
    skippy_runtime_event_v1,
)
from skippyctl.native.ingress import DEFAULT_DRAIN_BATCH_RECORDS, FactBatch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int
_PROT_NONE = 0  # <sys/mman.h>; the mmap module does not export it


@dataclass
class RawEvent:
    """Event bytes plus whatever the detail pointer points into (kept alive while emitting)."""

    data: bytes
    keepalive: list[object] = field(default_factory=list)


def make_event(
    *,
    abi_version: int = 1,
    struct_size: int = RUNTIME_EVENT_V1_FULL_SIZE,
    category: int = Category.MODEL_OPEN,
    kind: int = Kind.MODEL_OPEN_STARTED,
    detail: bytes | None = None,
    detail_len: int | None = None,
    null_detail_ptr: bool = False,
    tail_fill: int = 0xAB,
    **fields: int,
) -> RawEvent:
    """A producer's event of any struct_size: truncated below 144 bytes, padded with
    ``tail_fill`` (fields this reader does not know) above it."""
    event = skippy_runtime_event_v1()
    event.abi_version = abi_version
    event.struct_size = struct_size
    event.category = category
    event.kind = kind
    for name, value in fields.items():
        setattr(event, name, value)
    keep: list[object] = []
    if detail is not None:
        buffer = ctypes.create_string_buffer(detail, max(len(detail), 1))
        keep.append(buffer)
        event.detail_ptr = None if null_detail_ptr else ctypes.addressof(buffer)
        event.detail_len = len(detail) if detail_len is None else detail_len
    elif detail_len is not None:
        event.detail_len = detail_len
    raw = bytes(event)
    if struct_size <= RUNTIME_EVENT_V1_FULL_SIZE:
        data = raw[: max(struct_size, 8)]
    else:
        data = raw + bytes([tail_fill]) * (struct_size - RUNTIME_EVENT_V1_FULL_SIZE)
    return RawEvent(data, keep)


def emit(adapter: EngineAdapter, event: RawEvent) -> None:
    adapter.emit_raw(event.data)


class GuardedBuffer:
    """Two pages, the second PROT_NONE: bytes placed flush against the guard make any read past
    their end a SIGSEGV (the test process dies instead of passing)."""

    def __init__(self) -> None:
        self.page = mmap.PAGESIZE
        self._map = mmap.mmap(-1, 2 * self.page)
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self.base = ctypes.addressof(self._anchor)
        if _libc.mprotect(self.base + self.page, self.page, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")

    def place(self, data: bytes) -> int:
        if len(data) > self.page:
            raise ValueError("event larger than a page")
        address = self.base + self.page - len(data)
        ctypes.memmove(address, data, len(data))
        return address


def emit_guarded(adapter: EngineAdapter, guard: GuardedBuffer, data: bytes) -> None:
    """Calls skippy_test_emit_raw with ``data`` ending exactly at the guard page."""
    address = guard.place(data)
    adapter._lib.cdll.skippy_test_emit_raw(adapter.handle, address)


def attempts_accounted(ingress: SharedIngress) -> int:
    """accepted + rejected + suppressed + contended: must equal the attempts made."""
    stats = ingress.stats()
    return (
        stats.total_accepted
        + stats.total_rejected
        + stats.suppressed_regression
        + stats.progress_contended
    )


def assert_lanes_conserved(ingress: SharedIngress) -> None:
    """accepted == drained + dropped_full + coalesced per lane (after a final drain)."""
    stats = ingress.stats()
    for lane in (stats.terminal, stats.progress, stats.diagnostic):
        assert lane.accepted == lane.drained + lane.dropped_full + lane.coalesced, stats


class FactRecord(NamedTuple):
    """Every field of one drained ``skippy_native_fact_v1`` (reserved fields omitted), read from
    ``FactBatch.records`` — the numpy view, not the production decoder ``NativeFact`` (which
    carries only what the host reads). A NamedTuple built from whole columns: producer tests
    read hundreds of thousands of records."""

    lane: int
    flags: int
    has_summaries: bool
    detail_truncated: bool
    unknown_kind: bool
    larger_struct: bool
    source_struct_size: int
    operation_id: int
    ingress_sequence: int
    coalesced_count: int
    abi_version: int
    category: int
    kind: int
    emitter: int
    sequence: int
    timestamp_mono_ns: int
    model_id: int
    stage_id: int
    session_id: int
    progress_current: int
    progress_total: int
    progress_unit: int
    failure_code: int
    status: int
    detail_len: int
    detail: bytes
    numeric_summaries: tuple[int, int, int, int] | None


_TOP_FIELDS = ("lane", "source_struct_size", "operation_id", "ingress_sequence", "coalesced_count")
_EVENT_FIELDS = (
    "abi_version",
    "category",
    "kind",
    "emitter",
    "sequence",
    "timestamp_mono_ns",
    "model_id",
    "stage_id",
    "session_id",
    "progress_current",
    "progress_total",
    "progress_unit",
    "failure_code",
    "status",
    "detail_len",
)


def records_of(batch: FactBatch) -> list[FactRecord]:
    """Every record of a batch, column by column through its numpy view."""
    records = batch.records
    event = records["event"]
    flags = records["flags"].tolist()
    columns = {name: records[name].tolist() for name in _TOP_FIELDS}
    columns |= {name: event[name].tolist() for name in _EVENT_FIELDS}
    columns["flags"] = flags
    columns["has_summaries"] = [bool(f & FactFlag.HAS_SUMMARIES.value) for f in flags]
    columns["detail_truncated"] = [bool(f & FactFlag.DETAIL_TRUNCATED.value) for f in flags]
    columns["unknown_kind"] = [bool(f & FactFlag.UNKNOWN_KIND.value) for f in flags]
    columns["larger_struct"] = [bool(f & FactFlag.LARGER_STRUCT.value) for f in flags]
    width = RUNTIME_EVENT_DETAIL_COPY_BYTES
    details = records["detail"].tobytes()
    copied = records["detail_copied_len"].tolist()
    columns["detail"] = [
        details[i * width : i * width + min(n, width)] for i, n in enumerate(copied)
    ]
    summaries = zip(*(event[f"numeric_summary_{i}"].tolist() for i in range(4)), strict=True)
    columns["numeric_summaries"] = [
        tuple(values) if present else None
        for values, present in zip(summaries, columns["has_summaries"], strict=True)
    ]
    rows = zip(*(columns[name] for name in FactRecord._fields), strict=True)
    return [FactRecord(*row) for row in rows]


def drain_records(
    ingress: SharedIngress, max_records: int = DEFAULT_DRAIN_BATCH_RECORDS
) -> list[FactRecord]:
    """Like ``SharedIngress.drain``, with every field of each record."""
    return records_of(ingress.drain_batch(max_records))


def drain_all_records(ingress: SharedIngress) -> list[FactRecord]:
    """Like ``SharedIngress.drain_all``, with every field of each record."""
    out: list[FactRecord] = []
    while batch := drain_records(ingress):
        out.extend(batch)
    return out


def assert_decoders_agree(batch: FactBatch) -> None:
    """The production decoder (``NativeFact``, a struct format derived from the ctypes mirror)
    reads every field it carries exactly as the numpy dtype view does."""
    for index, record in enumerate(records_of(batch)):
        fact = batch[index]
        assert fact._asdict() == {name: getattr(record, name) for name in fact._fields}
