"""A GGUF file's key/values, read from its header alone.

``gguf.GGUFReader`` also parses every tensor's description and makes a numpy view of every
array element, the tokenizer's tens of thousands of strings included: about 2 s for the real
135M model here, paid before every load that asks how much memory it will take. This reads the
key/values as one pass over a memory map and keeps what a caller can use without holding the
file: numbers, flags and strings as values; an array as its length, with its elements only when
they are numbers and few (per-layer counts such as ``head_count_kv``).

Format (GGUF v2 and v3, little-endian): magic ``GGUF``, version u32, tensor count u64, key/value
count u64, then each key/value as a string key (u64 length, UTF-8), a u32 type and its value; an
array is its element type u32, its length u64 and its elements. Anything that points past the
end of the file, an unknown type or an older version is a :class:`GgufMetadataError`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

MAGIC: Final = b"GGUF"
MAX_KEPT_ARRAY: Final = 4096
"""Arrays of numbers up to this length keep their elements; longer ones only their length."""

_STRING: Final = 8
_ARRAY: Final = 9
_BOOL: Final = 7
_SCALARS: Final[dict[int, str]] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    _BOOL: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}

Scalar = int | float | bool | str


@dataclass(frozen=True, slots=True)
class GgufArray:
    length: int
    values: tuple[int | float | bool, ...] | None = None
    """The elements when they are numbers and at most :data:`MAX_KEPT_ARRAY`; else None."""


class GgufMetadataError(ValueError):
    """Not a GGUF header this reader understands (truncated, tampered, or an old version)."""


def read_metadata(path: Path) -> dict[str, Scalar | GgufArray]:
    """Every key/value of the header of ``path`` (see the module docstring). OSError when the
    file cannot be opened; GgufMetadataError when it is not a readable GGUF header."""
    with path.open("rb") as handle:
        try:
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GgufMetadataError("empty file") from None
    with view:
        return _Header(view).key_values()


class _Header:
    def __init__(self, view: mmap.mmap) -> None:
        self._view = view
        self._at = 0

    def key_values(self) -> dict[str, Scalar | GgufArray]:
        if self._take(4) != MAGIC:
            raise GgufMetadataError("no GGUF magic")
        (version,) = self._unpack("<I")
        if version < 2:
            raise GgufMetadataError(f"GGUF version {version} is not read")
        _tensors, count = self._unpack("<QQ")
        found: dict[str, Scalar | GgufArray] = {}
        for _ in range(count):
            key = self._string()
            (kind,) = self._unpack("<I")
            found[key] = self._array() if kind == _ARRAY else self._value(kind)
        return found

    def _array(self) -> GgufArray:
        kind, length = self._unpack("<IQ")
        if kind == _STRING:
            for _ in range(length):
                (size,) = self._unpack("<Q")
                self._skip(size)
            return GgufArray(length)
        if kind == _ARRAY:
            raise GgufMetadataError("arrays of arrays are not read")
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GgufMetadataError(f"unknown array element type {kind}")
        size = struct.calcsize(fmt)
        if length > MAX_KEPT_ARRAY:
            self._skip(length * size)
            return GgufArray(length)
        raw = self._take(length * size)
        return GgufArray(length, struct.unpack(f"<{length}{fmt[1]}", raw))

    def _value(self, kind: int) -> Scalar:
        if kind == _STRING:
            return self._string()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GgufMetadataError(f"unknown value type {kind}")
        (value,) = self._unpack(fmt)
        return bool(value) if kind == _BOOL else value

    def _string(self) -> str:
        (size,) = self._unpack("<Q")
        return self._take(size).decode("utf-8", errors="replace")

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        self._check(size)
        values = struct.unpack_from(fmt, self._view, self._at)
        self._at += size
        return values

    def _take(self, size: int) -> bytes:
        self._check(size)
        data = self._view[self._at : self._at + size]
        self._at += size
        return data

    def _skip(self, size: int) -> None:
        self._check(size)
        self._at += size

    def _check(self, size: int) -> None:
        if size < 0 or self._at + size > len(self._view):
            raise GgufMetadataError("the header runs past the end of the file")
