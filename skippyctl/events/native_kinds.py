"""The native kind table: every ``skippy_kind`` of the event ABI and what the host makes of it.

One row per kind, in the C header's order (``enum skippy_kind`` in
native/include/skippy/skippy_event.h; ``skippyctl.native.abi.Kind`` is this module's
``NativeKind``, checked against the header by tests/native/test_abi_layout.py). A row says:

- the event id a fact of that kind becomes (reference: skippy-facts.md "Native kind → event id");
- its delivery class — the catalog's for that id, never restated here; it is also the ring the C
  trampoline delivers the kind through (progress, diagnostic, or the terminal/state ring);
- how the pipeline treats its facts (``Handling``): held by the reconciler until the engine's
  return value decides, duplicate-coalesced as a level state, or adapted as an occurrence;
- where its reason code comes from: a fixed reason, or the fact's ``failure_code``;
- for the model-load phase kinds, the load phase it announces (a short operator-facing label,
  at most 15 characters: the dashboard's phase column).

Everything else derives from these rows: the pipeline adapter's lookups (including its numpy
lookup arrays), the dashboard's phase labels (``load_phase``), and docs/NATIVE_KINDS.md
(golden-tested against ``markdown_table()``). Kinds are part of the native ABI: append rows,
never renumber one. This module depends only on the rest of ``skippyctl.events``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Final

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.reasons import DeliveryClass, ReasonCode

__all__ = [
    "KINDS_SHARING_AN_EVENT",
    "NATIVE_KINDS",
    "Handling",
    "NativeKind",
    "NativeKindSpec",
    "load_phase",
    "markdown_table",
    "spec_of_kind",
]

MAX_LOAD_PHASE_CHARS: Final = 15


class NativeKind(IntEnum):
    """``enum skippy_kind`` (the C values without the ``SKIPPY_KIND_`` prefix)."""

    MODEL_OPEN_STARTED = 1
    MODEL_OPEN_PROGRESS = 2
    MODEL_OPEN_BACKEND_DEVICE_SELECTED = 3
    MODEL_OPEN_FINISHED = 4
    MODEL_OPEN_FAILED_HANDLED = 5
    MODEL_LOAD_PHASE_CHANGED = 100
    MODEL_LOAD_MEMORY_ALLOCATED = 101
    MODEL_LOAD_TENSORS_OFFLOADED = 102
    MODEL_LOAD_TOKENIZER_READY = 103
    MODEL_LOAD_AUX_COMPONENT_READY = 104
    KV_INITIALIZED = 200
    KV_PRESSURE_CROSSED = 201
    KV_PRESSURE_CLEARED = 202
    KV_APPROACHING_CAPACITY = 203
    KV_CAPACITY_EXHAUSTED = 204
    DEVICE_BACKEND_INITIALIZED = 300
    DEVICE_READY = 301
    DEVICE_DEGRADED = 302
    DEVICE_UNAVAILABLE = 303
    DEVICE_RECOVERED = 304
    DEVICE_LOST = 305
    DEVICE_RESOURCE_ALLOCATED = 306
    DEVICE_OUT_OF_MEMORY = 307
    DEVICE_FALLBACK_ACTIVATED = 308
    DIAGNOSTIC_WARNING_RAISED = 400
    DIAGNOSTIC_WARNING_CLEARED = 401
    DIAGNOSTIC_RECOVERABLE_FAILURE = 402
    DIAGNOSTIC_FATAL_FAILURE = 403
    DIAGNOSTIC_INVARIANT_VIOLATION = 404
    UNLOAD_STARTED = 500
    UNLOAD_COMPLETED = 501
    UNLOAD_FAILED = 502
    UNLOAD_FORCED = 503
    UNLOAD_SESSION_DRAINING = 504


class Handling(StrEnum):
    """What the pipeline does with a kind's facts besides adapting each one into an event."""

    OCCURRENCE = "occurrence"
    """Every fact is an event of its own (repeats are counted by the reducer, never folded)."""
    LEVEL_STATE = "level_state"
    """Reports a level (on/off, a health state): a contiguous repeat in a drained batch — same
    kind, nothing lost in between — is folded into the first fact of its run."""
    RECONCILED_TERMINAL = "reconciled_terminal"
    """An operation's native terminal: the reconciler holds it until the engine's authoritative
    return value decides the operation's one terminal event."""


@dataclass(frozen=True, slots=True)
class NativeKindSpec:
    """One row of the native kind table."""

    kind: NativeKind
    event: EventId
    handling: Handling = Handling.OCCURRENCE
    reason: ReasonCode | None = None
    """A reason code every event of this kind carries."""
    reason_from_failure_code: bool = False
    """The event carries the reason the fact's ``failure_code`` maps to (pipeline adapter)."""
    load_phase: str | None = None
    """The model-load phase this kind announces (at most 15 characters)."""

    def __post_init__(self) -> None:
        if self.reason is not None and self.reason_from_failure_code:
            raise ValueError(f"{self.kind.name}: a fixed reason or one from failure_code")
        if self.load_phase is not None and len(self.load_phase) > MAX_LOAD_PHASE_CHARS:
            raise ValueError(f"{self.kind.name}: load phase longer than the phase column")

    @property
    def delivery(self) -> DeliveryClass:
        """The catalog's delivery class of the event (also the kind's native ring)."""
        return spec_of(self.event).delivery


_K = NativeKind
_E = EventId
_LEVEL = Handling.LEVEL_STATE

NATIVE_KINDS: Final[tuple[NativeKindSpec, ...]] = (
    NativeKindSpec(_K.MODEL_OPEN_STARTED, _E.MODEL_LOAD_STARTED),
    NativeKindSpec(_K.MODEL_OPEN_PROGRESS, _E.MODEL_LOAD_PROGRESS),
    NativeKindSpec(_K.MODEL_OPEN_BACKEND_DEVICE_SELECTED, _E.BACKEND_DEVICE_SELECTED),
    NativeKindSpec(
        _K.MODEL_OPEN_FINISHED, _E.NATIVE_MODEL_LOAD_COMPLETED, Handling.RECONCILED_TERMINAL
    ),
    NativeKindSpec(
        _K.MODEL_OPEN_FAILED_HANDLED,
        _E.MODEL_LOAD_FAILED,
        Handling.RECONCILED_TERMINAL,
        reason_from_failure_code=True,
    ),
    NativeKindSpec(_K.MODEL_LOAD_PHASE_CHANGED, _E.MODEL_LOAD_PHASE_CHANGED, load_phase="loading"),
    NativeKindSpec(
        _K.MODEL_LOAD_MEMORY_ALLOCATED,
        _E.MODEL_MEMORY_ALLOCATION_SUMMARY,
        load_phase="allocating mem",
    ),
    NativeKindSpec(
        _K.MODEL_LOAD_TENSORS_OFFLOADED, _E.MODEL_LOAD_PHASE_CHANGED, load_phase="offloading"
    ),
    NativeKindSpec(
        _K.MODEL_LOAD_TOKENIZER_READY, _E.MODEL_LOAD_PHASE_CHANGED, load_phase="tokenizer ready"
    ),
    NativeKindSpec(
        _K.MODEL_LOAD_AUX_COMPONENT_READY, _E.MODEL_LOAD_PHASE_CHANGED, load_phase="aux components"
    ),
    NativeKindSpec(_K.KV_INITIALIZED, _E.KV_CACHE_INITIALIZATION_COMPLETED),
    NativeKindSpec(_K.KV_PRESSURE_CROSSED, _E.CACHE_PRESSURE_CROSSED, _LEVEL),
    NativeKindSpec(_K.KV_PRESSURE_CLEARED, _E.CACHE_PRESSURE_CLEARED, _LEVEL),
    NativeKindSpec(_K.KV_APPROACHING_CAPACITY, _E.CONTEXT_CAPACITY_APPROACHING_LIMIT),
    NativeKindSpec(
        _K.KV_CAPACITY_EXHAUSTED, _E.CONTEXT_EXHAUSTED, reason=ReasonCode.CONTEXT_EXHAUSTED
    ),
    NativeKindSpec(_K.DEVICE_BACKEND_INITIALIZED, _E.BACKEND_INITIALIZATION_COMPLETED),
    NativeKindSpec(_K.DEVICE_READY, _E.DEVICE_READY, _LEVEL),
    NativeKindSpec(_K.DEVICE_DEGRADED, _E.DEVICE_DEGRADED, _LEVEL),
    NativeKindSpec(
        _K.DEVICE_UNAVAILABLE, _E.DEVICE_UNAVAILABLE, _LEVEL, reason=ReasonCode.DEVICE_UNAVAILABLE
    ),
    NativeKindSpec(_K.DEVICE_RECOVERED, _E.DEVICE_RECOVERED, _LEVEL),
    NativeKindSpec(_K.DEVICE_LOST, _E.DEVICE_LOST, reason_from_failure_code=True),
    NativeKindSpec(_K.DEVICE_RESOURCE_ALLOCATED, _E.RESOURCE_ALLOCATION_COMPLETED),
    NativeKindSpec(
        _K.DEVICE_OUT_OF_MEMORY, _E.OUT_OF_MEMORY_CONDITION, reason=ReasonCode.OUT_OF_MEMORY
    ),
    NativeKindSpec(_K.DEVICE_FALLBACK_ACTIVATED, _E.BACKEND_FALLBACK_ACTIVATED),
    NativeKindSpec(_K.DIAGNOSTIC_WARNING_RAISED, _E.WARNING_RAISED),
    NativeKindSpec(_K.DIAGNOSTIC_WARNING_CLEARED, _E.WARNING_CLEARED),
    NativeKindSpec(_K.DIAGNOSTIC_RECOVERABLE_FAILURE, _E.RECOVERABLE_NATIVE_FAILURE),
    NativeKindSpec(
        _K.DIAGNOSTIC_FATAL_FAILURE, _E.FATAL_NATIVE_FAILURE, reason_from_failure_code=True
    ),
    NativeKindSpec(_K.DIAGNOSTIC_INVARIANT_VIOLATION, _E.INVARIANT_PROTOCOL_VIOLATION),
    NativeKindSpec(_K.UNLOAD_STARTED, _E.UNLOAD_STARTED),
    NativeKindSpec(_K.UNLOAD_COMPLETED, _E.UNLOAD_COMPLETED),
    NativeKindSpec(_K.UNLOAD_FAILED, _E.UNLOAD_FAILED, reason_from_failure_code=True),
    NativeKindSpec(_K.UNLOAD_FORCED, _E.FORCED_UNLOAD),
    NativeKindSpec(_K.UNLOAD_SESSION_DRAINING, _E.SESSION_DRAINING_STARTED),
)

_BY_KIND: Final[Mapping[int, NativeKindSpec]] = MappingProxyType(
    {int(spec.kind): spec for spec in NATIVE_KINDS}
)
if len(_BY_KIND) != len(NATIVE_KINDS) or set(_BY_KIND) != {int(k) for k in NativeKind}:
    raise ValueError("the native kind table must have exactly one row per NativeKind")


KINDS_SHARING_AN_EVENT: Final[frozenset[NativeKind]] = frozenset(
    spec.kind
    for spec in NATIVE_KINDS
    if sum(other.event is spec.event for other in NATIVE_KINDS) > 1
)
"""Kinds whose event id several kinds share: their events carry a ``native_kind`` summary."""


def spec_of_kind(kind: int) -> NativeKindSpec | None:
    """The row of a raw kind value; None for a kind this host does not know."""
    return _BY_KIND.get(kind)


def load_phase(kind: int) -> str | None:
    """The load phase a raw native kind announces (e.g. a ``model_load_phase_changed`` event's
    ``native_kind`` summary), if it is a phase kind."""
    spec = _BY_KIND.get(kind)
    return None if spec is None else spec.load_phase


def markdown_table() -> str:
    """The table as Markdown (docs/NATIVE_KINDS.md carries it between markers)."""
    lines = [
        "| kind | `skippy_kind` | event id | delivery | handling | reason | load phase | summary |",
        "|---:|---|---|---|---|---|---|---|",
    ]
    for spec in NATIVE_KINDS:
        if spec.reason is not None:
            reason = f"`{spec.reason.value}`"
        elif spec.reason_from_failure_code:
            reason = "from `failure_code`"
        else:
            reason = ""
        phase = "" if spec.load_phase is None else spec.load_phase
        summary = "`native_kind`" if spec.kind in KINDS_SHARING_AN_EVENT else ""
        lines.append(
            f"| {spec.kind.value} | `{spec.kind.name}` | `{spec.event.value}` "
            f"| {spec.delivery.value} | {spec.handling.value} | {reason} | {phase} | {summary} |"
        )
    return "\n".join(lines) + "\n"
