"""Builders for raw events and a guard-page buffer that faults on any read past its end."""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass, field

from skippyctl.native import EngineAdapter, SharedIngress
from skippyctl.native.abi import (
    RUNTIME_EVENT_V1_FULL_SIZE,
    Category,
    Kind,
    skippy_runtime_event_v1,
)

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
