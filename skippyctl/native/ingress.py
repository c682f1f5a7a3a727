"""Host-side wrapper around the shared-memory native ingress (the engine side is ``region``).

Contract:

- ``SharedIngress.create()`` (host) makes a sealed-size memfd, maps it and initialises the region;
  the engine maps the same fd with ``IngressRegion.attach(fd)`` (``region``, which keeps the
  engine's imports small). Facts an engine pushed survive the engine's death and are drained by
  the host.
- The host pulls: ``wait()`` sleeps in C on a cross-process futex with the GIL released, and
  ``drain()`` copies records into a preallocated ctypes array and turns each into an owned,
  immutable ``NativeFact`` (raw integers: enum values are interpreted by the adapter layer, so an
  unknown kind is never an exception here). ``drain_batch()`` is the pipeline's path: one owned
  byte copy of the drained records with numpy columns over it, so batch decisions (sorting,
  folding diagnostics) cost no per-record Python object; a ``NativeFact`` is built only for a
  record that becomes an event. Draining is single-consumer (serialised by a lock).
- One record layout: the ctypes mirror ``abi.skippy_native_fact_v1`` (layout-checked against the
  library at load time). ``FACT_DTYPE`` (every field, ``FactBatch.records``) and the struct
  format ``NativeFact`` is unpacked with (only the fields the host reads) are derived from it.
- ``close()`` is idempotent; it destroys the adapters created on this mapping and unmaps only
  when no wrapper call is in progress. llama.cpp hooks pointing at an adapter must be unhooked
  (``llama_log_set(None, None)``, model/context freed) before the adapter or mapping is closed.
- Nothing here runs on a producer path: producers are C functions called by llama.cpp.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from skippyctl.native import abi
from skippyctl.native.library import NativeLibrary, native_library
from skippyctl.native.region import EngineAdapter, IngressClosed, IngressRegion

__all__ = [
    "DEBUG_READ_CHUNK_BYTES",
    "DEFAULT_DRAIN_BATCH_RECORDS",
    "FACT_DTYPE",
    "EngineAdapter",
    "FactBatch",
    "IngressClosed",
    "IngressConfig",
    "IngressRegion",
    "IngressStats",
    "LaneStats",
    "NativeFact",
    "ProducerReport",
    "ProducerThreads",
    "SharedIngress",
    "WaitResult",
]

DEFAULT_DRAIN_BATCH_RECORDS: Final = 512
DEBUG_READ_CHUNK_BYTES: Final = 64 * 1024
_UINT32_MAX: Final = 0xFFFFFFFF
_FACT_SIZE_BYTES: Final = ctypes.sizeof(abi.skippy_native_fact_v1)
# A plain int: IntFlag arithmetic is slow on the drain path.
_HAS_SUMMARIES: Final = int(abi.FactFlag.HAS_SUMMARIES)


class WaitResult(IntEnum):
    """What ``skippy_ingress_wait`` returned."""

    CLOSED = -1
    TIMEOUT = 0
    PENDING = 1


@dataclass(frozen=True, slots=True)
class IngressConfig:
    """Region sizing (powers of two; 0 = the C default: 1024 / 1024 / 64 / 65536)."""

    terminal_capacity: int = 0
    diagnostic_capacity: int = 0
    progress_slots: int = 0
    debug_bytes: int = 0

    def to_c(self) -> abi.skippy_ingress_config_v1:
        return abi.skippy_ingress_config_v1(
            ctypes.sizeof(abi.skippy_ingress_config_v1),
            self.terminal_capacity,
            self.diagnostic_capacity,
            self.progress_slots,
            self.debug_bytes,
            0,
        )


# The record layout has one definition, the ctypes mirror ``abi.skippy_native_fact_v1`` (checked
# field by field against the library at load time). The numpy dtype and the struct format below
# are derived from it, never written out a second time.
FACT_DTYPE: Final = np.dtype(abi.skippy_native_fact_v1)
U64Column = npt.NDArray[np.uint64]
U32Column = npt.NDArray[np.uint32]

# struct codes for the ctypes scalar types the fact record uses ("=": standard sizes, no
# implicit alignment; the derived format spells every gap out as pad bytes).
_STRUCT_CODES: Final[dict[type[Any], str]] = {
    ctypes.c_uint32: "I",
    ctypes.c_int32: "i",
    ctypes.c_uint64: "Q",
}


def _flat_fields(
    struct_type: type[ctypes.Structure], base: int = 0, prefix: str = ""
) -> dict[str, tuple[int, type[Any]]]:
    """Every scalar or array field of a (nested) ctypes struct: dotted path → (offset, type)."""
    out: dict[str, tuple[int, type[Any]]] = {}
    for name, ctype, *_ in struct_type._fields_:
        offset = base + int(getattr(struct_type, name).offset)
        if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
            out.update(_flat_fields(ctype, offset, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = (offset, ctype)
    return out


def record_format(paths: Sequence[str]) -> struct.Struct:
    """A ``struct`` unpacking exactly ``paths`` (dotted, in offset order) of one fact record.

    Derived from the ctypes mirror: offsets and sizes come from it, the gaps between the picked
    fields become pad bytes, and the format's size is the record's size.
    """
    fields = _flat_fields(abi.skippy_native_fact_v1)
    parts = ["="]
    position = 0
    for path in paths:
        offset, ctype = fields[path]
        if offset < position:
            raise ValueError(f"{path} is not in offset order")
        if offset > position:
            parts.append(f"{offset - position}x")
        if issubclass(ctype, ctypes.Array):
            length = len(ctype())
            if ctypes.sizeof(ctype) != length:
                raise TypeError(f"{path}: only byte arrays are decoded")
            parts.append(f"{length}s")
        else:
            parts.append(_STRUCT_CODES[ctype])
        position = offset + ctypes.sizeof(ctype)
    parts.append(f"{_FACT_SIZE_BYTES - position}x")
    return struct.Struct("".join(parts))


# What NativeFact is built from, in offset order (the unpacking in ``from_buffer`` follows it).
_DECODED_PATHS: Final = (
    "flags",
    "operation_id",
    "coalesced_count",
    "event.category",
    "event.kind",
    "event.sequence",
    "event.timestamp_mono_ns",
    "event.progress_current",
    "event.progress_total",
    "event.progress_unit",
    "event.failure_code",
    "event.numeric_summary_0",
    "event.numeric_summary_1",
    "event.numeric_summary_2",
    "event.numeric_summary_3",
    "detail_copied_len",
    "detail",
)
_DECODE: Final = record_format(_DECODED_PATHS)
_DETAIL_COPY_BYTES: Final = abi.RUNTIME_EVENT_DETAIL_COPY_BYTES


class NativeFact(NamedTuple):
    """An owned copy of the fields of one drained ``skippy_native_fact_v1`` the host reads.

    Raw integers (the adapter interprets them). A ``NamedTuple`` rather than a frozen dataclass:
    one is built for every record that becomes an event, on the pipeline thread, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs about twice as much.
    Fields only tests read (lane, flags, ids, status, …) are in ``FactBatch.records``.
    """

    operation_id: int
    coalesced_count: int
    category: int
    kind: int
    sequence: int
    timestamp_mono_ns: int
    progress_current: int
    progress_total: int
    progress_unit: int
    failure_code: int
    detail: bytes
    numeric_summaries: tuple[int, int, int, int] | None

    @classmethod
    def from_buffer(
        cls, buffer: ctypes.Array[abi.skippy_native_fact_v1] | bytes, index: int
    ) -> NativeFact:
        (
            flags,
            operation_id,
            coalesced_count,
            category,
            kind,
            sequence,
            timestamp_mono_ns,
            progress_current,
            progress_total,
            progress_unit,
            failure_code,
            summary_0,
            summary_1,
            summary_2,
            summary_3,
            detail_copied_len,
            detail,
        ) = _DECODE.unpack_from(buffer, index * _FACT_SIZE_BYTES)
        return cls(
            operation_id,
            coalesced_count,
            category,
            kind,
            sequence,
            timestamp_mono_ns,
            progress_current,
            progress_total,
            progress_unit,
            failure_code,
            detail[: min(detail_copied_len, _DETAIL_COPY_BYTES)],
            (summary_0, summary_1, summary_2, summary_3) if flags & _HAS_SUMMARIES else None,
        )


class FactBatch(Sequence[NativeFact]):
    """Drained records as one owned byte copy, with read-only numpy columns over it.

    ``records`` is the whole structured view (``FACT_DTYPE``: every field, for tests and
    diagnostics); indexing builds the ``NativeFact`` of one record on demand (the same decoding
    as ``drain``).
    """

    __slots__ = (
        "_raw",
        "_count",
        "records",
        "operation_ids",
        "sequences",
        "kinds",
        "categories",
        "lanes",
        "coalesced_counts",
        "timestamps_mono_ns",
        "progress_units",
    )

    def __init__(self, raw: bytes, count: int) -> None:
        self._raw = raw
        self._count = count
        records = np.frombuffer(raw, dtype=FACT_DTYPE, count=count)
        self.records: npt.NDArray[np.void] = records
        event = records["event"]
        self.operation_ids: U64Column = records["operation_id"]
        self.sequences: U64Column = event["sequence"]
        self.kinds: U32Column = event["kind"]
        self.categories: U32Column = event["category"]
        self.lanes: U32Column = records["lane"]
        self.coalesced_counts: U64Column = records["coalesced_count"]
        self.timestamps_mono_ns: U64Column = event["timestamp_mono_ns"]
        self.progress_units: U32Column = event["progress_unit"]

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> NativeFact: ...
    @overload
    def __getitem__(self, index: slice) -> list[NativeFact]: ...
    def __getitem__(self, index: int | slice) -> NativeFact | list[NativeFact]:
        if type(index) is int and 0 <= index < self._count:  # the adapter's path
            return NativeFact.from_buffer(self._raw, index)
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return NativeFact.from_buffer(self._raw, index)


@dataclass(frozen=True, slots=True)
class LaneStats:
    accepted: int
    drained: int
    dropped_full: int
    coalesced: int


@dataclass(frozen=True, slots=True)
class IngressStats:
    """A snapshot of ``skippy_ingress_stats_v1`` (counters are read one by one, not atomically).

    Exact once producers stopped and a final drain returned nothing:
    ``accepted == drained + dropped_full + coalesced`` per lane, and
    ``attempts == total_accepted + total_rejected + suppressed_regression + progress_contended``.
    """

    terminal: LaneStats
    progress: LaneStats
    diagnostic: LaneStats
    suppressed_regression: int
    progress_contended: int
    rejected_abi_version: int
    rejected_struct_size: int
    rejected_detail: int
    rejected_discriminant: int
    rejected_closed: int
    unknown_kind: int
    detail_truncated: int
    log_messages_by_level: tuple[int, ...]
    debug_lines_captured: int
    debug_bytes_dropped: int

    def lane(self, lane: abi.Lane) -> LaneStats:
        return (self.terminal, self.progress, self.diagnostic)[lane]

    @property
    def total_accepted(self) -> int:
        return self.terminal.accepted + self.progress.accepted + self.diagnostic.accepted

    @property
    def total_drained(self) -> int:
        return self.terminal.drained + self.progress.drained + self.diagnostic.drained

    @property
    def total_rejected(self) -> int:
        return (
            self.rejected_abi_version
            + self.rejected_struct_size
            + self.rejected_detail
            + self.rejected_discriminant
            + self.rejected_closed
        )

    @classmethod
    def from_c(cls, raw: abi.skippy_ingress_stats_v1) -> IngressStats:
        lanes = [
            LaneStats(
                accepted=int(raw.lanes[i].accepted),
                drained=int(raw.lanes[i].drained),
                dropped_full=int(raw.lanes[i].dropped_full),
                coalesced=int(raw.lanes[i].coalesced),
            )
            for i in range(abi.LANE_COUNT)
        ]
        return cls(
            terminal=lanes[abi.Lane.TERMINAL],
            progress=lanes[abi.Lane.PROGRESS],
            diagnostic=lanes[abi.Lane.DIAGNOSTIC],
            suppressed_regression=int(raw.suppressed_regression),
            progress_contended=int(raw.progress_contended),
            rejected_abi_version=int(raw.rejected_abi_version),
            rejected_struct_size=int(raw.rejected_struct_size),
            rejected_detail=int(raw.rejected_detail),
            rejected_discriminant=int(raw.rejected_discriminant),
            rejected_closed=int(raw.rejected_closed),
            unknown_kind=int(raw.unknown_kind),
            detail_truncated=int(raw.detail_truncated),
            log_messages_by_level=tuple(int(v) for v in raw.log_messages_by_level),
            debug_lines_captured=int(raw.debug_lines_captured),
            debug_bytes_dropped=int(raw.debug_bytes_dropped),
        )


def _timeout_ms(timeout_s: float) -> int:
    if timeout_s <= 0:
        return 0
    return min(_UINT32_MAX, int(timeout_s * 1000.0 + 0.999))


class SharedIngress(IngressRegion):
    """A mapping of a shared ingress region with the host's reading API (wait, drain, stats).

    The host creates the region (``create``); an engine attaches with ``IngressRegion.attach``
    (``SharedIngress.attach`` works too, for tests that play both sides in one process).
    """

    def __init__(
        self,
        *,
        library: NativeLibrary,
        fd: int,
        owns_fd: bool,
        mapping: mmap.mmap,
        view: ctypes.Array[ctypes.c_char],
        handle: int,
        host: bool,
    ) -> None:
        super().__init__(
            library=library,
            fd=fd,
            owns_fd=owns_fd,
            mapping=mapping,
            view=view,
            handle=handle,
            host=host,
        )
        self._drain_lock = threading.Lock()
        self._drain_buffer = (abi.skippy_native_fact_v1 * DEFAULT_DRAIN_BATCH_RECORDS)()

    # ---- construction ----

    @classmethod
    def create(
        cls, config: IngressConfig | None = None, *, library: NativeLibrary | None = None
    ) -> SharedIngress:
        """Host side: a new zeroed memfd region sized per ``config``, sealed against resizing."""
        lib = library if library is not None else native_library()
        c_config = (config if config is not None else IngressConfig()).to_c()
        size = int(lib.cdll.skippy_ingress_required_size(ctypes.byref(c_config)))
        if size == 0:
            raise ValueError(f"invalid ingress config (capacities must be powers of two): {config}")
        fd = os.memfd_create("skippy-ingress", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            # An engine must never shrink the region under the host (that would SIGBUS it).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        view = (ctypes.c_char * size).from_buffer(mapping)
        handle = lib.cdll.skippy_ingress_init(ctypes.addressof(view), size, ctypes.byref(c_config))
        if not handle:
            del view
            mapping.close()
            os.close(fd)
            raise ValueError("skippy_ingress_init rejected the region")
        return cls(
            library=lib,
            fd=fd,
            owns_fd=True,
            mapping=mapping,
            view=view,
            handle=int(handle),
            host=True,
        )

    # ---- host side ----

    def wait_status(self, timeout_s: float) -> WaitResult:
        """Sleeps (GIL released) until facts are pending, the timeout passes, or close."""
        with self._use() as handle:
            return WaitResult(
                int(self._library.cdll.skippy_ingress_wait(handle, _timeout_ms(timeout_s)))
            )

    def wait(self, timeout_s: float) -> bool:
        """True when facts are pending; False on timeout or when closed and empty."""
        return self.wait_status(timeout_s) is WaitResult.PENDING

    def drain(self, max_records: int = DEFAULT_DRAIN_BATCH_RECORDS) -> list[NativeFact]:
        """Up to ``max_records`` facts: terminal lane first, then progress, then diagnostic."""
        if max_records <= 0:
            return []
        with self._use() as handle, self._drain_lock:
            if len(self._drain_buffer) < max_records:
                self._drain_buffer = (abi.skippy_native_fact_v1 * max_records)()
            buffer = self._drain_buffer
            count = int(self._library.cdll.skippy_ingress_drain(handle, buffer, max_records))
            return [NativeFact.from_buffer(buffer, i) for i in range(count)]

    def drain_batch(self, max_records: int = DEFAULT_DRAIN_BATCH_RECORDS) -> FactBatch:
        """Like ``drain``, as a ``FactBatch`` (columns first, records on demand)."""
        with self._use() as handle, self._drain_lock:
            if len(self._drain_buffer) < max_records:
                self._drain_buffer = (abi.skippy_native_fact_v1 * max_records)()
            buffer = self._drain_buffer
            count = 0
            if max_records > 0:
                count = int(self._library.cdll.skippy_ingress_drain(handle, buffer, max_records))
            return FactBatch(ctypes.string_at(buffer, count * _FACT_SIZE_BYTES), count)

    def drain_all(self, batch_records: int = DEFAULT_DRAIN_BATCH_RECORDS) -> list[NativeFact]:
        """Drains until a drain returns nothing."""
        out: list[NativeFact] = []
        while True:
            batch = self.drain(batch_records)
            if not batch:
                return out
            out.extend(batch)

    def stats(self) -> IngressStats:
        raw = abi.skippy_ingress_stats_v1()
        with self._use() as handle:
            self._library.cdll.skippy_ingress_stats(handle, ctypes.byref(raw))
        return IngressStats.from_c(raw)

    def read_debug_log(self) -> list[str]:
        """Drains the opt-in debug-log ring into lines (raw native text; debug artifacts only)."""
        chunks: list[bytes] = []
        buffer = ctypes.create_string_buffer(DEBUG_READ_CHUNK_BYTES)
        with self._use() as handle:
            while True:
                n = int(
                    self._library.cdll.skippy_ingress_debug_read(
                        handle, buffer, DEBUG_READ_CHUNK_BYTES
                    )
                )
                if n == 0:
                    break
                chunks.append(buffer.raw[:n])
        text = b"".join(chunks).decode("utf-8", errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return lines


@dataclass(frozen=True, slots=True)
class ProducerReport:
    """``skippy_test_producer_report_v1``: per-emit latency from a fixed histogram."""

    threads: int
    records_attempted: int
    elapsed_ns: int
    latency_p50_ns: int
    latency_p99_ns: int
    latency_max_ns: int


class ProducerThreads:
    """C producer threads emitting through an adapter (tests and benchmarks)."""

    def __init__(
        self,
        adapter: EngineAdapter,
        *,
        threads: int,
        records_per_thread: int,
        kind: int = abi.Kind.MODEL_OPEN_STARTED,
        mode: abi.TestProducerMode = abi.TestProducerMode.TRAMPOLINE,
    ) -> None:
        self._lib = adapter._lib
        handle = self._lib.cdll.skippy_test_producers_start(
            adapter.handle, threads, records_per_thread, int(kind), int(mode)
        )
        if not handle:
            raise RuntimeError("skippy_test_producers_start failed")
        self._handle: int | None = int(handle)

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise RuntimeError("producers already joined")
        return self._handle

    def done(self) -> bool:
        return bool(self._lib.cdll.skippy_test_producers_done(self.handle))

    def attempts(self) -> int:
        return int(self._lib.cdll.skippy_test_producers_attempts(self.handle))

    def stop(self) -> None:
        self._lib.cdll.skippy_test_producers_stop(self.handle)

    def hold_gil_until_done(self, timeout_s: float) -> bool:
        """Waits in C WITH the GIL held (PyDLL); True if the producers finished meanwhile."""
        return self._lib.hold_gil_until_producers_done(self.handle, _timeout_ms(timeout_s))

    def join(self) -> ProducerReport:
        raw = abi.skippy_test_producer_report_v1()
        handle, self._handle = self.handle, None
        self._lib.cdll.skippy_test_producers_join(handle, ctypes.byref(raw))
        return ProducerReport(
            threads=int(raw.threads),
            records_attempted=int(raw.records_attempted),
            elapsed_ns=int(raw.elapsed_ns),
            latency_p50_ns=int(raw.latency_p50_ns),
            latency_p99_ns=int(raw.latency_p99_ns),
            latency_max_ns=int(raw.latency_max_ns),
        )
