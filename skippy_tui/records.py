"""Decode `--json` event records (skippyctl.output.records.event_record) back into `Event`s.

Contract:

- `decode_record(record)` never raises. It returns the event (or None when the whole record is
  skipped) and the list of problems it skipped, one `SkipReason` per dropped record, field or value:
  - a record whose `event` id is not in this build's catalog is skipped (`unknown_event`);
  - a record with a `schema_version` other than this build's is skipped (`unsupported_schema`);
  - a record missing a required field (`event`, `schema_version`, `ts`) or carrying an invalid
    identity, number or shape is skipped (`invalid_record`);
  - an unknown top-level field or summary key is dropped, the record kept (`unknown_field`);
  - an unknown enum value (outcome, reason code, stop reason, batching, producer, severity, unit,
    evidence) is dropped or replaced by the catalog default, the record kept (`unknown_value`).
- `event_from_record(record)` is the strict form: the event, or `RecordError` for a skipped record.
- `decode_line(line)` adds JSON parsing (`malformed_line` for text that is not a JSON object).

What the record does not carry is reconstructed, never invented as a sentinel: the monotonic
timestamp is the record's wall time (`ts`), the native stamp's timestamp is that same time, the
category comes from the catalog, and the human `summary` is re-rendered by consumers. Nothing here
imports Textual, so a live SSE client can reuse the decoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final, TypeVar

import orjson

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import (
    SCHEMA_VERSION,
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


class SkipReason(StrEnum):
    """Why a line, record, field or value was not taken as it came (wire-stable values)."""

    MALFORMED_LINE = "malformed_line"
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    UNKNOWN_EVENT = "unknown_event"
    INVALID_RECORD = "invalid_record"
    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_VALUE = "unknown_value"


RECORD_SKIPS: Final = frozenset(
    {
        SkipReason.MALFORMED_LINE,
        SkipReason.UNSUPPORTED_SCHEMA,
        SkipReason.UNKNOWN_EVENT,
        SkipReason.INVALID_RECORD,
    }
)
"""Reasons that drop a whole record (the others drop a field or value only)."""


class RecordError(ValueError):
    """A record that cannot become an event; `reason` says why."""

    def __init__(self, reason: SkipReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


_SCOPE_FIELDS: Final = (
    "model_id",
    "topology_id",
    "stage_id",
    "session_id",
    "request_id",
    "device_id",
)
_KNOWN_FIELDS: Final = frozenset(
    {
        "schema_version",
        "event",
        "category",
        "severity",
        "ts",
        "seq",
        "cursor",
        "producer",
        "operation_id",
        "parent_operation_id",
        *_SCOPE_FIELDS,
        "stage_index",
        "progress",
        "outcome",
        "reason_code",
        "duration_ms",
        "stop_reason",
        "batching",
        "state",
        "native",
        "summaries",
        "summary",
    }
)
MAX_STATE_CHARS: Final = 64
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)

E = TypeVar("E", bound=StrEnum)


class _Invalid(Exception):
    """Internal: the record is structurally wrong (becomes INVALID_RECORD)."""


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid
    return value


def _number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid
    return value


def _text(value: object, limit: int = MAX_STATE_CHARS) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise _Invalid
    return value


def _logical(value: object) -> LogicalId:
    if not isinstance(value, str):
        raise _Invalid
    try:
        return LogicalId(value)
    except InvalidLogicalId as error:
        raise _Invalid from error


def _wall_ns(value: object) -> int:
    if not isinstance(value, str):
        raise _Invalid
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError as error:
        raise _Invalid from error
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return ((stamp - _EPOCH) // _MICROSECOND) * 1000


class _Decoder:
    """One record's decoding; collects field-level skips as it goes."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record = record
        self.skipped: list[SkipReason] = []

    def enum(self, kind: type[E], value: object) -> E | None:
        """The member for `value`, or None (an unknown value is counted)."""
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        self.skipped.append(SkipReason.UNKNOWN_VALUE)
        return None

    def decode(self) -> Event:
        record = self.record
        version = record.get("schema_version")
        if version is None or isinstance(version, bool) or not isinstance(version, int):
            raise _Invalid
        if version != SCHEMA_VERSION:
            raise RecordError(SkipReason.UNSUPPORTED_SCHEMA)
        raw_id = record.get("event")
        if not isinstance(raw_id, str):
            raise _Invalid
        try:
            event_id = EventId(raw_id)
        except ValueError as error:
            raise RecordError(SkipReason.UNKNOWN_EVENT) from error
        wall_ns = _wall_ns(record.get("ts"))
        self.skipped.extend(SkipReason.UNKNOWN_FIELD for key in record if key not in _KNOWN_FIELDS)

        severity = self.enum(Severity, record.get("severity", spec_of(event_id).severity))
        producer = self.enum(Producer, record.get("producer", Producer.RUNTIME))
        return Event(
            id=event_id,
            producer=producer or Producer.RUNTIME,
            severity=severity or spec_of(event_id).severity,
            wall_ns=wall_ns,
            mono_ns=wall_ns,
            operation_id=self.logical("operation_id"),
            parent_operation_id=self.logical("parent_operation_id"),
            scope=self.scope(),
            native=self.native(wall_ns),
            state=self.state(),
            progress=self.progress(),
            outcome=self.enum_field(Outcome, "outcome"),
            reason_code=self.enum_field(ReasonCode, "reason_code"),
            duration_ms=self.duration(),
            stop_reason=self.enum_field(StopReason, "stop_reason"),
            batching=self.enum_field(BatchingMode, "batching"),
            summaries=self.summaries(),
        )

    def logical(self, key: str) -> LogicalId | None:
        value = self.record.get(key)
        return None if value is None else _logical(value)

    def enum_field(self, kind: type[E], key: str) -> E | None:
        value = self.record.get(key)
        return None if value is None else self.enum(kind, value)

    def scope(self) -> Scope:
        ids = {key: self.logical(key) for key in _SCOPE_FIELDS}
        index = self.record.get("stage_index")
        return Scope(
            model_id=ids["model_id"],
            topology_id=ids["topology_id"],
            stage_id=ids["stage_id"],
            stage_index=None if index is None else _int(index),
            session_id=ids["session_id"],
            request_id=ids["request_id"],
            device_id=ids["device_id"],
        )

    def native(self, wall_ns: int) -> NativeStamp | None:
        value = self.record.get("native")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _Invalid
        evidence = self.enum(SequenceEvidence, value.get("evidence"))
        if evidence is None:
            return None
        return NativeStamp(
            timestamp_ns=wall_ns, sequence=_int(value.get("sequence")), evidence=evidence
        )

    def state(self) -> StateChange | None:
        value = self.record.get("state")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _Invalid
        previous = value.get("previous")
        return StateChange(
            previous=None if previous is None else _text(previous),
            current=_text(value.get("current")),
        )

    def progress(self) -> Progress | None:
        value = self.record.get("progress")
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _Invalid
        total = value.get("total")
        unit = self.enum(ProgressUnit, value.get("unit", ProgressUnit.NONE))
        return Progress(
            current=_int(value.get("current")),
            total=None if total is None else _int(total),
            unit=unit or ProgressUnit.NONE,
        )

    def duration(self) -> float | None:
        value = self.record.get("duration_ms")
        return None if value is None else float(_number(value))

    def summaries(self) -> tuple[NumericSummary, ...]:
        value = self.record.get("summaries")
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise _Invalid
        items: list[NumericSummary] = []
        for key, number in value.items():
            try:
                summary_key = SummaryKey(key)
            except ValueError:
                self.skipped.append(SkipReason.UNKNOWN_FIELD)
                continue
            items.append(NumericSummary(summary_key, _number(number)))
        return tuple(items)


def decode_record(record: object) -> tuple[Event | None, tuple[SkipReason, ...]]:
    """The event of one record (None when skipped) and every skip it took. Never raises."""
    if not isinstance(record, dict):
        return None, (SkipReason.INVALID_RECORD,)
    decoder = _Decoder(record)
    try:
        event = decoder.decode()
    except RecordError as error:
        return None, (error.reason,)
    except _Invalid:
        return None, (SkipReason.INVALID_RECORD,)
    return event, tuple(decoder.skipped)


def event_from_record(record: dict[str, Any]) -> Event:
    """The event of one `event_record` dict; `RecordError` when the record must be skipped.

    Unknown fields and values are dropped silently here; use `decode_record` to count them.
    """
    event, skipped = decode_record(record)
    if event is None:
        raise RecordError(skipped[0] if skipped else SkipReason.INVALID_RECORD)
    return event


def decode_line(line: bytes | str) -> tuple[Event | None, tuple[SkipReason, ...]]:
    """`decode_record` of one NDJSON line; a line that is not a JSON object is `malformed_line`."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, (SkipReason.MALFORMED_LINE,)
    if not isinstance(record, dict):
        return None, (SkipReason.MALFORMED_LINE,)
    return decode_record(record)
