"""A typed reading of the state document (`GET /api/runtime/state`, `ps --json`, SSE
`runtime_state` frames), for clients that decide on its states (`ps`, `wait`).

The document is built by skippyctl.output.state; this is its reader, so the state names are
spelled once (the reducer's enums), never again as strings by a client. Contract:

- `read_state_document(document)` never raises. It reads what this build knows and leaves the
  rest: an enum value it does not know reads as `EnumValue(text, None)` (a newer runtime's state
  keeps its name for people, and matches no member), a value of the wrong JSON type reads as
  absent, a model or session entry without a usable id is left out.
- The reading is frozen; the document's JSON is not changed by reading it (commands that print
  the document print the document, not this view).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Generic, TypeVar

from skippyctl.events.envelope import Progress
from skippyctl.events.reasons import ProgressUnit, ReasonCode
from skippyctl.reducer.state import (
    EventSystemView,
    ModelState,
    NativeMode,
    NodeState,
    RuntimeState,
    SessionState,
    StageState,
    TopologyState,
)

E = TypeVar("E", bound=StrEnum)
ABSENT: Final = "?"
"""How an enum value the document does not carry reads for people."""


@dataclass(frozen=True, slots=True)
class EnumValue(Generic[E]):
    """A wire enum value as the document spells it, and the member it names in this build."""

    text: str
    member: E | None
    """None: a value this build does not know (or none at all)."""


def _enum(kind: type[E], value: object) -> EnumValue[E]:
    if not isinstance(value, str):
        return EnumValue(ABSENT, None)
    try:
        return EnumValue(value, kind(value))
    except ValueError:
        return EnumValue(value, None)


def _optional_enum(kind: type[E], value: object) -> EnumValue[E] | None:
    return None if value is None else _enum(kind, value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _float(value: object) -> float | None:
    number = _number(value)
    return None if number is None else float(number)


def _entries(document: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = document.get(key)
    if not isinstance(value, list):
        return []
    return [entry for entry in value if isinstance(entry, dict)]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model of the document (the fields clients read; `--json` has them all)."""

    model_id: str
    state: EnumValue[ModelState]
    reason_code: EnumValue[ReasonCode] | None = None
    progress: Progress | None = None
    device_id: str | None = None
    topology_id: str | None = None
    """The topology serving the model (a split load), if any."""
    model_size_bytes: int | None = None
    context_tokens: int | None = None
    lanes: int | None = None
    context_tokens_per_lane: int | None = None
    batch_invariant: bool | None = None
    """Whether its greedy texts do not depend on the batch (engine/kernels.py)."""
    lanes_in_use: int = 0
    queue_depth: int = 0
    decode_tokens_per_s: int | float | None = None
    settings: tuple[tuple[str, int | float | bool | str], ...] = ()
    """What the load asked for beyond the defaults, in the document's order (values that are
    not a number, a flag or a text are left out)."""
    idle_expires_at: datetime | None = None
    """When the idle model unloads unless a request comes (None: in use, or no idle TTL)."""
    recovery_attempt: int | None = None
    """The runtime's restart of its crashed engine under way (None: none)."""
    spec_proposed_tokens: int = 0
    """Proposed tokens its ended requests verified (speculative decoding)."""
    spec_accepted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LoadableEntry:
    """A model the runtime may load on demand and has not loaded (``loadable_models``)."""

    model_id: str
    source: str = ABSENT
    """``preset``, ``models_dir`` or ``hub_cache`` (a newer runtime's word as it came)."""
    pinned: bool = False
    idle_ttl_s: float | None = None
    """Idle seconds before it unloads once loaded (None: never)."""


@dataclass(frozen=True, slots=True)
class SessionEntry:
    session_id: str
    state: EnumValue[SessionState]
    model_id: str | None = None
    spec_proposed_tokens: int = 0
    """Proposed tokens its ended requests verified (speculative decoding)."""
    spec_accepted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StageEntry:
    """One stage: its place in its topology, its share of the plan, its state and link figures
    (``link_*``: absent in documents of runtimes that do not measure links)."""

    stage_id: str
    state: EnumValue[StageState]
    topology_id: str | None = None
    stage_index: int | None = None
    reason_code: EnumValue[ReasonCode] | None = None
    layer_start: int | None = None
    layer_count: int | None = None
    planned_bytes: int | None = None
    offered_bytes: int | None = None
    link_rtt_ms: float | None = None
    link_p95_ms: float | None = None
    link_jitter_ms: float | None = None
    link_probes: int | None = None

    @property
    def layers(self) -> range | None:
        if self.layer_start is None or self.layer_count is None:
            return None
        return range(self.layer_start, self.layer_start + self.layer_count)


@dataclass(frozen=True, slots=True)
class TopologyEntry:
    topology_id: str
    state: EnumValue[TopologyState]
    model_id: str | None = None
    reason_code: EnumValue[ReasonCode] | None = None
    layers: int | None = None
    stages: tuple[StageEntry, ...] = ()
    """Its stages in the document, by stage index."""


@dataclass(frozen=True, slots=True)
class WarningEntry:
    """One active warning of the document: its code, reason and what it is about."""

    code: str
    reason_code: str | None = None
    about: str | None = None


def _warnings(document: Mapping[str, Any]) -> tuple[WarningEntry, ...]:
    out = []
    for entry in _entries(document, "warnings"):
        code = entry.get("code")
        if not isinstance(code, str):
            continue
        reason = entry.get("reason_code")
        about = entry.get("model_id") or entry.get("stage_id")
        out.append(
            WarningEntry(
                code,
                reason if isinstance(reason, str) else None,
                about if isinstance(about, str) else None,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StateDocumentView:
    """The typed reading of one state document."""

    runtime: EnumValue[RuntimeState] = field(default_factory=lambda: EnumValue(ABSENT, None))
    node: EnumValue[NodeState] = field(default_factory=lambda: EnumValue(ABSENT, None))
    native_mode: EnumValue[NativeMode] = field(default_factory=lambda: EnumValue(ABSENT, None))
    models: tuple[ModelEntry, ...] = ()
    sessions: tuple[SessionEntry, ...] = ()
    topologies: tuple[TopologyEntry, ...] = ()
    event_system: EventSystemView = field(default_factory=EventSystemView)
    subscribers_lagging: int | None = None
    """From the document's `health` (the API's live counter), when it carries one."""
    warnings: tuple[WarningEntry, ...] = ()
    """The active structured warnings (`warnings`; absent in older documents)."""
    degraded_modes: tuple[str, ...] = ()
    loadable: tuple[LoadableEntry, ...] = ()
    """The models the runtime may load on demand that are neither loaded nor loading
    (``loadable_models``; absent in older documents and in the stream's ``runtime_state``)."""

    def model(self, model_id: str) -> ModelEntry | None:
        return next((m for m in self.models if m.model_id == model_id), None)

    def topology_of(self, model: ModelEntry) -> TopologyEntry | None:
        """The topology serving ``model`` (a split load), when the document lists it."""
        if model.topology_id is None:
            return None
        return next((t for t in self.topologies if t.topology_id == model.topology_id), None)


def _progress(value: object) -> Progress | None:
    if not isinstance(value, dict):
        return None
    current = _int(value.get("current"))
    unit = _enum(ProgressUnit, value.get("unit")).member
    return Progress(
        current=0 if current is None else current,
        total=_int(value.get("total")),
        unit=unit or ProgressUnit.NONE,
    )


def _model(entry: Mapping[str, Any]) -> ModelEntry | None:
    model_id = _text(entry.get("model_id"))
    if model_id is None:
        return None
    return ModelEntry(
        model_id=model_id,
        state=_enum(ModelState, entry.get("state")),
        reason_code=_optional_enum(ReasonCode, entry.get("reason_code")),
        progress=_progress(entry.get("progress")),
        device_id=_text(entry.get("device_id")),
        topology_id=_text(entry.get("topology_id")),
        model_size_bytes=_int(entry.get("model_size_bytes")),
        context_tokens=_int(entry.get("context_tokens")),
        lanes=_int(entry.get("lanes")),
        context_tokens_per_lane=_int(entry.get("context_tokens_per_lane")),
        batch_invariant=_flag(entry.get("batch_invariant")),
        lanes_in_use=_int(entry.get("lanes_in_use")) or 0,
        queue_depth=_int(entry.get("queue_depth")) or 0,
        decode_tokens_per_s=_number(entry.get("decode_tokens_per_s")),
        settings=_settings(entry.get("settings")),
        idle_expires_at=_timestamp(entry.get("idle_expires_at")),
        recovery_attempt=_int(entry.get("recovery_attempt")),
        spec_proposed_tokens=_int(entry.get("spec_proposed_tokens")) or 0,
        spec_accepted_tokens=_int(entry.get("spec_accepted_tokens")) or 0,
    )


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else None


def _settings(value: object) -> tuple[tuple[str, int | float | bool | str], ...]:
    if not isinstance(value, dict):
        return ()
    return tuple(
        (str(key), item) for key, item in value.items() if isinstance(item, int | float | str)
    )


def _loadable(entry: Mapping[str, Any]) -> LoadableEntry | None:
    model_id = _text(entry.get("model_id"))
    if model_id is None:
        return None
    pinned = entry.get("pinned")
    return LoadableEntry(
        model_id=model_id,
        source=_text(entry.get("source")) or ABSENT,
        pinned=pinned if isinstance(pinned, bool) else False,
        idle_ttl_s=_float(entry.get("idle_ttl_s")),
    )


def _session(entry: Mapping[str, Any]) -> SessionEntry | None:
    session_id = _text(entry.get("session_id"))
    if session_id is None:
        return None
    return SessionEntry(
        session_id=session_id,
        state=_enum(SessionState, entry.get("state")),
        model_id=_text(entry.get("model_id")),
        spec_proposed_tokens=_int(entry.get("spec_proposed_tokens")) or 0,
        spec_accepted_tokens=_int(entry.get("spec_accepted_tokens")) or 0,
    )


def _stage(entry: Mapping[str, Any]) -> StageEntry | None:
    stage_id = _text(entry.get("stage_id"))
    if stage_id is None:
        return None
    return StageEntry(
        stage_id=stage_id,
        state=_enum(StageState, entry.get("state")),
        topology_id=_text(entry.get("topology_id")),
        stage_index=_int(entry.get("stage_index")),
        reason_code=_optional_enum(ReasonCode, entry.get("reason_code")),
        layer_start=_int(entry.get("layer_start")),
        layer_count=_int(entry.get("layer_count")),
        planned_bytes=_int(entry.get("planned_bytes")),
        offered_bytes=_int(entry.get("offered_bytes")),
        link_rtt_ms=_float(entry.get("link_rtt_ms")),
        link_p95_ms=_float(entry.get("link_p95_ms")),
        link_jitter_ms=_float(entry.get("link_jitter_ms")),
        link_probes=_int(entry.get("link_probes")),
    )


def _topologies(document: Mapping[str, Any]) -> tuple[TopologyEntry, ...]:
    stages = [s for e in _entries(document, "stages") if (s := _stage(e)) is not None]
    stages.sort(key=lambda s: (s.stage_index if s.stage_index is not None else 1 << 30, s.stage_id))
    out = []
    for entry in _entries(document, "topologies"):
        topology_id = _text(entry.get("topology_id"))
        if topology_id is None:
            continue
        out.append(
            TopologyEntry(
                topology_id=topology_id,
                state=_enum(TopologyState, entry.get("state")),
                model_id=_text(entry.get("model_id")),
                reason_code=_optional_enum(ReasonCode, entry.get("reason_code")),
                layers=_int(entry.get("layers")),
                stages=tuple(s for s in stages if s.topology_id == topology_id),
            )
        )
    return tuple(out)


def _event_system(value: object) -> EventSystemView:
    """The counters this build knows, each taken only with its own JSON type."""
    if not isinstance(value, dict):
        return EventSystemView()
    known: dict[str, Any] = {}  # each value checked against its field below
    for spec in dataclasses.fields(EventSystemView):
        item = value.get(spec.name)
        if isinstance(spec.default, bool):
            if isinstance(item, bool):
                known[spec.name] = item
        elif (number := _int(item)) is not None:
            known[spec.name] = number
    return dataclasses.replace(EventSystemView(), **known)


def read_state_document(document: Mapping[str, Any]) -> StateDocumentView:
    """The typed reading of a state document. Never raises."""
    health = document.get("health")
    return StateDocumentView(
        runtime=_enum(RuntimeState, document.get("runtime")),
        node=_enum(NodeState, document.get("node")),
        native_mode=_enum(NativeMode, document.get("native_mode")),
        models=tuple(m for e in _entries(document, "models") if (m := _model(e)) is not None),
        sessions=tuple(s for e in _entries(document, "sessions") if (s := _session(e)) is not None),
        topologies=_topologies(document),
        event_system=_event_system(document.get("event_system")),
        subscribers_lagging=_int(health.get("subscribers_lagging"))
        if isinstance(health, dict)
        else None,
        warnings=_warnings(document),
        degraded_modes=tuple(m for m in document.get("degraded_modes") or () if isinstance(m, str))
        if isinstance(document.get("degraded_modes"), list)
        else (),
        loadable=tuple(
            entry
            for e in _entries(document, "loadable_models")
            if (entry := _loadable(e)) is not None
        ),
    )
