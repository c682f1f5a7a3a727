"""The evidence of the log-coverage tests (package docstring): one model's run (its engine's raw
log lines and its events), what one fact's check finds in it, the evidence over every run, the
fact table's row type, and the readers the checks use on events (numeric summaries, states,
devices, structured strings)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.native.backends import HOST_DEVICE, BufferType, GgmlBackends

MIB: Final = 1 << 20
LOG_ROUNDING_MIB: Final = 0.005
"""llama.cpp prints buffer sizes in MiB with two decimals: each printed figure is off by at most
half a hundredth of a MiB."""

Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Run:
    """One model's evidence: its engine's raw log lines and its events."""

    model_id: str
    lines: tuple[str, ...]
    events: tuple[Event, ...]

    def matches(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        return [m for m in map(pattern.search, self.lines) if m is not None]

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e["kind"] in kinds]

    @property
    def load_events(self) -> list[Event]:
        """The events of the model's load (not of a request, not the log counter)."""
        return [
            e
            for e in self.events
            if "request_id" not in e["scope"] and e["kind"] != "native_log_summary"
        ]


@dataclass(frozen=True, slots=True)
class Finding:
    """What one fact's check found in one run: whether the log stated it, whether an event
    carried it (and which ids), and the comparison in words."""

    lines: int
    carried_by: tuple[str, ...]
    compared: str
    detail: str = ""
    """The figures behind `compared` that depend on the machine (its buffer types): shown when
    a check fails, never rendered in the document."""

    @property
    def carried(self) -> bool:
        return bool(self.carried_by)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One fact over every run."""

    lines_seen: int
    carried_by: tuple[str, ...]
    compared: str
    uncarried: tuple[str, ...]
    """Runs whose log stated the fact without an event carrying it, or whose events stated it
    without a log line (a fallback the log does not show)."""
    detail: str = ""
    """Each run's :attr:`Finding.detail`."""

    @property
    def covered(self) -> bool:
        return self.lines_seen > 0 and not self.uncarried


Check = Callable[[Run], Finding | None]
"""A fact's check for one run: None when the run's log does not state the fact."""


@dataclass(frozen=True, slots=True)
class Fact:
    """One row: a fact of `area` that lines matching `pattern` state. Carried facts name the
    `event_ids` that must carry it; a `gap` says why no event does; an `absent` fact is one
    llama.cpp logs no line for on this path."""

    area: str
    name: str
    pattern: re.Pattern[str]
    check: Check
    event_ids: tuple[str, ...] = ()
    gap: str | None = None
    absent: bool = False
    needs_extra_buffer_type: bool = False
    """Logged only where a device offers an extra buffer type (:func:`has_extra_buffer_types`);
    on a machine without one the fact is absent."""

    @property
    def key(self) -> str:
        return f"{self.area}: {self.name}"


def summary_value(event: Event, key: str) -> Any:
    return next((s["value"] for s in event.get("numeric_summaries", []) if s["key"] == key), None)


def state_of(event: Event) -> Any:
    return event.get("state", {}).get("current")


def device_of(event: Event) -> Any:
    return event["scope"].get("device_id")


_NOT_FACTS: Final = frozenset({"summary", "ts", "kind", "category", "producer", "severity"})


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in _NOT_FACTS:
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def carrying_string(run: Run, text: str) -> tuple[str, ...]:
    """Load events with a structured string field equal to `text` (case-insensitive)."""
    wanted = text.casefold()
    return kinds_of(e for e in run.load_events if any(s.casefold() == wanted for s in _strings(e)))


def carrying_number(run: Run, value: float, keys: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Load events with a numeric summary equal to `value` (under one of `keys` if given)."""
    return kinds_of(
        e
        for e in run.load_events
        if any(
            (keys is None or s["key"] in keys) and s["value"] == value
            for s in e.get("numeric_summaries", [])
        )
    )


def kinds_of(events: Iterable[Event]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e["kind"] for e in events))


def near_mib(mib: float, value: Any, terms: int = 1) -> bool:
    """`value` bytes are the printed `mib` (a sum of `terms` printed figures)."""
    return isinstance(value, int) and abs(value / MIB - mib) <= terms * LOG_ROUNDING_MIB + 1e-9


@functools.cache
def _buffer_types() -> dict[str, BufferType]:
    return {b.name: b for b in GgmlBackends().buffer_types()}


def device_of_buffer_type(name: str) -> str:
    """The device whose memory a logged buffer type's bytes count on, as ggml says
    (native/backends.py's buffer types, the mapping its memory breakdown uses). A name no
    device lists (``CPU_Mapped``: llama.cpp's mmapped weights) has no ggml device: the host's."""
    known = _buffer_types().get(name)
    return HOST_DEVICE if known is None else known.device


def is_extra_buffer_type(name: str) -> bool:
    """A device's extra buffer type (``CPU_REPACK``, ``AMX``): which ones a CPU has, and which
    weights land there, depend on the machine."""
    known = _buffer_types().get(name)
    return known is not None and known.extra


def has_extra_buffer_types() -> bool:
    """This machine's devices offer an extra buffer type (nearly every CPU build has
    ``CPU_REPACK``); without one, llama.cpp logs no buffer type fallback."""
    return any(b.extra for b in _buffer_types().values())


def evidence_of(fact: Fact, runs: dict[str, Run]) -> Evidence:
    """One fact's :class:`Evidence` over every run."""
    findings = {model_id: fact.check(run) for model_id, run in runs.items()}
    stated = {m: f for m, f in findings.items() if f is not None and f.lines > 0}
    by_text: dict[str, list[str]] = {}
    for model_id, finding in stated.items():
        by_text.setdefault(finding.compared, []).append(model_id)
    compared = "; ".join(f"{text} ({', '.join(ids)})" for text, ids in by_text.items())
    carried = tuple(dict.fromkeys(i for f in stated.values() for i in f.carried_by))
    uncarried = tuple(m for m, f in stated.items() if not f.carried)
    unexpected = tuple(m for m, f in findings.items() if f is not None and f.lines == 0)
    detail = "; ".join(f"{f.detail} ({m})" for m, f in stated.items() if f.detail)
    return Evidence(
        sum(f.lines for f in stated.values()), carried, compared, uncarried + unexpected, detail
    )
