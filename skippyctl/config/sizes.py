"""Sizes as operators write them: bytes, or a number with K, M, G or T (powers of 1024, with or
without ``i``/``B``: ``8G``, ``512MiB``, ``1.5GB``)."""

from __future__ import annotations

import re
from typing import Final

_SIZE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_POWERS: Final = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


class SizeError(ValueError):
    """Not a size; the message says which forms are."""


def parse_size_bytes(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise SizeError("a size is bytes, or a number with K, M, G or T (e.g. 8G, 512MiB)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** _POWERS[unit.upper()])
