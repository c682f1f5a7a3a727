"""Encoding: an `Event` as the NDJSON record or the SSE event object, and the SSE frame.

Both shapes come from one encoder walking the field mapping (codec.layout); the output is
byte-for-byte the public contract (key order included), so change the mapping, never the
output of one shape here. Fields that do not apply are absent (never 0 or "").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, assert_never

import orjson

from skippyctl.events.envelope import SCHEMA_VERSION, Event, Progress, Scope, StateChange
from skippyctl.output.codec.layout import (
    OBJECT,
    OUTCOME_KEYS,
    RECORD,
    SCOPE_KEYS,
    WIRE_VERSION,
    Layout,
    Part,
)
from skippyctl.output.summary import render_summary


def rfc3339(wall_ns: int) -> str:
    """UTC RFC 3339 with microseconds (`2026-01-15T09:00:00.000000Z`)."""
    stamp = datetime.fromtimestamp(wall_ns / 1e9, tz=UTC)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _scope(scope: Scope) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in SCOPE_KEYS:
        value = getattr(scope, key)
        if value is not None:
            out[key] = str(value)
    if scope.stage_index is not None:
        out["stage_index"] = scope.stage_index
    return out


_Writer = Callable[[dict[str, Any], Event, int | None, str | None], None]
"""Adds one part of an event (given its stream position) to the shape being built."""


def _schema(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["schema_version"] = SCHEMA_VERSION


def _category(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["category"] = event.category.value


def _severity(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["severity"] = event.severity.value


def _ts(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["ts"] = rfc3339(event.wall_ns)


def _position(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    if seq is not None:
        out["seq"] = seq
    if cursor is not None:
        out["cursor"] = cursor


def _producer(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["producer"] = event.producer.value


def _flat_operation(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    if event.operation_id is not None:
        out["operation_id"] = str(event.operation_id)


def _flat_scope(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out.update(_scope(event.scope))


def _progress(progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"current": progress.current}
    if progress.total is not None:
        out["total"] = progress.total
    out["unit"] = progress.unit.value
    return out


def _state(state: StateChange) -> dict[str, Any]:
    out: dict[str, Any] = {"current": state.current}
    if state.previous is not None:
        out["previous"] = state.previous
    return out


def _enum(value: StrEnum) -> str:
    return value.value


def _as_is(value: float) -> float:
    return value


_OUTCOME_VALUES: Final[Mapping[str, Callable[[Any], Any]]] = {
    "progress": _progress,
    "outcome": _enum,
    "reason_code": _enum,
    "duration_ms": _as_is,
    "stop_reason": _enum,
    "batching": _enum,
    "state": _state,
}
_OUTCOME: Final = tuple((key, _OUTCOME_VALUES[key]) for key in OUTCOME_KEYS)
"""The outcome fields in the layout's order, each with its JSON form (the `Event` attribute
has the key's name)."""


def _outcome(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    for key, to_json in _OUTCOME:
        value = getattr(event, key)
        if value is not None:
            out[key] = to_json(value)


def _summary(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    out["summary"] = render_summary(event)


def _id_writer(key: str) -> _Writer:
    def write(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
        out[key] = event.id.value

    return write


def _nested_operation_writer(key: str) -> _Writer:
    def write(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
        if event.operation_id is None:
            return
        operation = {"root": str(event.parent_operation_id or event.operation_id)}
        if event.parent_operation_id is not None:
            operation["child"] = str(event.operation_id)
        out[key] = operation

    return write


def _nested_scope_writer(key: str) -> _Writer:
    def write(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
        out[key] = _scope(event.scope)

    return write


def _native_writer(keys: tuple[str, ...]) -> _Writer:
    def write(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
        native = event.native
        if native is not None:
            values = {
                "sequence": native.sequence,
                "timestamp_ns": native.timestamp_ns,
                "evidence": native.evidence.value,
            }
            out["native"] = {key: values[key] for key in keys}

    return write


def _summaries_writer(key: str, listed: bool) -> _Writer:
    def write(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
        if not event.summaries:
            return
        if listed:
            out[key] = [{"key": s.key.value, "value": s.value} for s in event.summaries]
        else:
            out[key] = {s.key.value: s.value for s in event.summaries}

    return write


def _settings(out: dict[str, Any], event: Event, seq: int | None, cursor: str | None) -> None:
    if event.settings:
        out["settings"] = {s.key: s.value for s in event.settings}


def _writer(part: Part, layout: Layout) -> _Writer:
    """The writer of `part` in `layout` (resolved once per shape: encoding is a hot path)."""
    match part:
        case Part.SCHEMA:
            return _schema
        case Part.ID:
            return _id_writer(layout.id_key)
        case Part.CATEGORY:
            return _category
        case Part.SEVERITY:
            return _severity
        case Part.TS:
            return _ts
        case Part.POSITION:
            return _position
        case Part.PRODUCER:
            return _producer
        case Part.OPERATION:
            key = layout.operation_key
            return _flat_operation if key is None else _nested_operation_writer(key)
        case Part.SCOPE:
            key = layout.scope_key
            return _flat_scope if key is None else _nested_scope_writer(key)
        case Part.OUTCOME:
            return _outcome
        case Part.NATIVE:
            return _native_writer(layout.native_keys)
        case Part.SUMMARIES:
            return _summaries_writer(layout.summaries_key, layout.summaries_listed)
        case Part.SETTINGS:
            return _settings
        case Part.SUMMARY:
            return _summary
        case _:
            assert_never(part)


class Encoder:
    """Encodes events in one layout's shape; fields that do not apply are absent."""

    __slots__ = ("layout", "_writers")

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._writers = tuple(_writer(part, layout) for part in layout.order)

    def __call__(
        self, event: Event, seq: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for write in self._writers:
            write(out, event, seq, cursor)
        return out


_RECORD: Final = Encoder(RECORD)
_OBJECT: Final = Encoder(OBJECT)


def event_record(event: Event, seq: int | None = None, cursor: str | None = None) -> dict[str, Any]:
    """The NDJSON record of `event` (with its stream position when given)."""
    return _RECORD(event, seq, cursor)


def event_object(event: Event) -> dict[str, Any]:
    """The SSE event object of `event` (its stream position is in the frame)."""
    return _OBJECT(event)


def dumps_line(record: Mapping[str, Any]) -> bytes:
    """One JSON object and a newline."""
    return orjson.dumps(record) + b"\n"


def frame(
    name: str, payload: Mapping[str, Any], *, cursor: str, instance: str, sequence: int
) -> bytes:
    """One SSE frame: `id: <cursor>`, `event: <name>`, `data:` the envelope plus `payload`."""
    envelope = {
        "version": WIRE_VERSION,
        "cursor": cursor,
        "process_instance_id": instance,
        "sequence": sequence,
        **payload,
    }
    return f"id: {cursor}\nevent: {name}\ndata: ".encode() + orjson.dumps(envelope) + b"\n\n"


def event_frame(event: Event, *, cursor: str, instance: str, sequence: int) -> bytes:
    """The `runtime_event` frame of `event`."""
    payload = {"event": event_object(event)}
    return frame("runtime_event", payload, cursor=cursor, instance=instance, sequence=sequence)
