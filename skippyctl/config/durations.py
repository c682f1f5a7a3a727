"""Durations as operators write them: seconds as a number, or Go's form ("5m", "1h30m", "250ms")
as Ollama's ``keep_alive`` takes it, with ``d`` for days besides ("7d"). A negative duration
means "forever" (-1)."""

from __future__ import annotations

import math
import re
from typing import Final

_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
MAX_TEXT: Final = 32


class DurationError(ValueError):
    """Not a duration; the message says which forms are."""


def parse_duration_s(value: float | int | str) -> float:
    """Seconds of ``value``: a number of seconds, a numeric string, or Go's duration form; any
    negative value is -1 (forever)."""
    if isinstance(value, bool):
        raise DurationError("a duration is a number of seconds or text such as '5m' or '1h30m'")
    seconds = float(value) if isinstance(value, int | float) else _parse_text(value)
    if not math.isfinite(seconds):
        raise DurationError("a duration must be finite")
    return -1.0 if seconds < 0 else seconds


def _parse_text(text: str) -> float:
    body = text.strip()
    if not body or len(body) > MAX_TEXT:
        raise DurationError("a duration is a number of seconds or text such as '5m' or '1h30m'")
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    try:
        return sign * float(body)  # a bare number: seconds
    except ValueError:
        pass
    position, total = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        position = match.end()
    if position != len(body) or position == 0:
        raise DurationError(
            "a duration is a number of seconds or text such as '5m', '1h30m' or '250ms'"
        )
    return sign * total


def format_duration_s(seconds: float) -> str:
    """A duration in whole seconds for people, in the form this module reads: `45s`, `5m`,
    `2m30s`, `1h05m`."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"
