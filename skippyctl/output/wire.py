"""The live event stream's wire format (reference: skippy-facts.md "Live event stream").

SSE frames `id: <cursor>\\nevent: <name>\\ndata: <one-line JSON>\\n\\n`; names `runtime_state`,
`runtime_event`, `runtime_health`, `runtime_replay_gap`; every frame's envelope carries
`version` (1), `cursor`, `process_instance_id`, `sequence`. `event_object` is the reference event
shape (`kind` is the event id); `event_from_object` decodes it back for clients, tolerating
unknown ids and fields (returns None for an id it does not know).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import orjson

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    BatchingMode,
    Event,
    InvalidLogicalId,
    LogicalId,
    NativeStamp,
    NumericSummary,
    Progress,
    Scope,
    SequenceEvidence,
    StateChange,
    StopReason,
    SummaryKey,
)
from skippyctl.events.reasons import Outcome, Producer, ProgressUnit, ReasonCode, Severity
from skippyctl.output.records import outcome_fields, rfc3339
from skippyctl.output.summary import render_summary

WIRE_VERSION: Final = 1
_SCOPE_KEYS: Final = (
    "model_id",
    "topology_id",
    "stage_id",
    "session_id",
    "request_id",
    "device_id",
)


def event_object(event: Event) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    for key in _SCOPE_KEYS:
        value = getattr(event.scope, key)
        if value is not None:
            scope[key] = str(value)
    if event.scope.stage_index is not None:
        scope["stage_index"] = event.scope.stage_index
    out: dict[str, Any] = {
        "category": event.category.value,
        "kind": event.id.value,
        "producer": event.producer.value,
        "severity": event.severity.value,
        "ts": rfc3339(event.wall_ns),
        "scope": scope,
    }
    if event.operation_id is not None:
        operation = {"root": str(event.parent_operation_id or event.operation_id)}
        if event.parent_operation_id is not None:
            operation["child"] = str(event.operation_id)
        out["operation"] = operation
    out.update(outcome_fields(event))
    if event.native is not None:
        out["native"] = {
            "sequence": event.native.sequence,
            "timestamp_ns": event.native.timestamp_ns,
            "evidence": event.native.evidence.value,
        }
    if event.summaries:
        out["numeric_summaries"] = [{"key": s.key.value, "value": s.value} for s in event.summaries]
    out["summary"] = render_summary(event)
    return out


def frame(
    name: str, payload: dict[str, Any], *, cursor: str, instance: str, sequence: int
) -> bytes:
    envelope = {
        "version": WIRE_VERSION,
        "cursor": cursor,
        "process_instance_id": instance,
        "sequence": sequence,
        **payload,
    }
    return f"id: {cursor}\nevent: {name}\ndata: ".encode() + orjson.dumps(envelope) + b"\n\n"


def _id(value: Any) -> LogicalId | None:
    if not isinstance(value, str):
        return None
    try:
        return LogicalId(value)
    except InvalidLogicalId:
        return None


def _enum(kind: Any, value: Any) -> Any:
    try:
        return None if value is None else kind(value)
    except ValueError:
        return None


def _wall_ns(value: Any) -> int:
    if not isinstance(value, str):
        return 0
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return int(stamp.timestamp() * 1_000_000) * 1000


def event_from_object(data: dict[str, Any], mono_ns: int = 0) -> Event | None:
    """Decode a wire event object; None for an unknown event id (a newer runtime)."""
    event_id = _enum(EventId, data.get("kind"))
    if event_id is None:
        return None
    wall_ns = _wall_ns(data.get("ts"))
    scope_data = data.get("scope") or {}
    stage_index = scope_data.get("stage_index")
    scope = Scope(
        **{key: _id(scope_data.get(key)) for key in _SCOPE_KEYS},
        stage_index=stage_index if isinstance(stage_index, int) else None,
    )
    operation = data.get("operation") or {}
    child = _id(operation.get("child"))
    root = _id(operation.get("root"))
    state = data.get("state")
    progress = data.get("progress")
    native = data.get("native")
    numbers: list[NumericSummary] = []
    for item in data.get("numeric_summaries") or ():
        key = _enum(SummaryKey, item.get("key")) if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if key is not None and isinstance(value, int | float):
            numbers.append(NumericSummary(key, value))
    return Event(
        id=event_id,
        producer=_enum(Producer, data.get("producer")) or Producer.RUNTIME,
        severity=_enum(Severity, data.get("severity")) or Severity.INFO,
        wall_ns=wall_ns,
        mono_ns=mono_ns,
        operation_id=child or root,
        parent_operation_id=root if child is not None else None,
        scope=scope,
        native=None
        if not isinstance(native, dict)
        else NativeStamp(
            int(native.get("timestamp_ns", 0)),
            int(native.get("sequence", 0)),
            _enum(SequenceEvidence, native.get("evidence")) or SequenceEvidence.FIRST,
        ),
        state=None
        if not isinstance(state, dict)
        else StateChange(state.get("previous"), str(state.get("current"))),
        progress=None
        if not isinstance(progress, dict)
        else Progress(
            int(progress.get("current", 0)),
            progress.get("total"),
            _enum(ProgressUnit, progress.get("unit")) or ProgressUnit.NONE,
        ),
        outcome=_enum(Outcome, data.get("outcome")),
        reason_code=_enum(ReasonCode, data.get("reason_code")),
        duration_ms=data.get("duration_ms"),
        stop_reason=_enum(StopReason, data.get("stop_reason")),
        batching=_enum(BatchingMode, data.get("batching")),
        summaries=tuple(numbers),
    )
