"""Decoding: the one tolerant decoder of both event shapes; it counts every skip.

Contract (the full list of reasons is in skippyctl.output.codec): a decoder never raises and
never invents a value. It returns the event, or None when the whole input is skipped, with one
`SkipReason` per record, field or value it did not take as it came. `event_from_record` and
`event_from_object` are the strict forms (`RecordError` for a skipped input).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final, TypeVar

import orjson

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import (
    MAX_SETTINGS,
    SCHEMA_VERSION,
    BatchingMode,
    Event,
    InvalidLogicalId,
    InvalidSetting,
    LogicalId,
    NativeStamp,
    NumericSummary,
    Progress,
    Scope,
    SequenceEvidence,
    Setting,
    StateChange,
    StopReason,
    SummaryKey,
)
from skippyctl.events.reasons import Outcome, Producer, ProgressUnit, ReasonCode, Severity
from skippyctl.output.codec.layout import (
    OBJECT,
    OPERATION_KEYS,
    PROGRESS_KEYS,
    RECORD,
    SCOPE_FIELDS,
    STATE_KEYS,
    SUMMARY_ITEM_KEYS,
    WIRE_VERSION,
    Layout,
    Part,
)

MAX_STATE_CHARS: Final = 64
"""A `state` value is an enum name, never longer than an identity."""


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

Decoded = tuple[Event | None, tuple[SkipReason, ...]]
"""What a decoder returns: the event (None when skipped) and every skip it took."""


class RecordError(ValueError):
    """A record or object that cannot become an event; `reason` says why."""

    def __init__(self, reason: SkipReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
E = TypeVar("E", bound=StrEnum)


class _Invalid(Exception):
    """Internal: the input is structurally wrong (becomes INVALID_RECORD)."""


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid
    return value


def _number(value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_STATE_CHARS:
        raise _Invalid
    return value


def _logical(value: object) -> LogicalId:
    if not isinstance(value, str):
        raise _Invalid
    try:
        return LogicalId(value)
    except InvalidLogicalId as error:
        raise _Invalid from error


def _object(value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid
    return value


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
    """One input's decoding in one layout; collects field-level skips as it goes."""

    def __init__(self, data: Mapping[str, Any], layout: Layout) -> None:
        self.data = data
        self.layout = layout
        self.skipped: list[SkipReason] = []

    def known(self, value: Mapping[str, Any], keys: frozenset[str]) -> Mapping[str, Any]:
        """`value`, with every key outside `keys` counted as an unknown field."""
        self.skipped.extend(SkipReason.UNKNOWN_FIELD for key in value if key not in keys)
        return value

    def enum(self, kind: type[E], value: object) -> E | None:
        """The member for `value`, or None (an unknown value is counted)."""
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        self.skipped.append(SkipReason.UNKNOWN_VALUE)
        return None

    def optional_enum(self, kind: type[E], value: object) -> E | None:
        return None if value is None else self.enum(kind, value)

    def decode(self) -> Event:
        data, layout = self.data, self.layout
        if Part.SCHEMA in layout.order:
            version = data.get("schema_version")
            if _int(version) != SCHEMA_VERSION:
                raise RecordError(SkipReason.UNSUPPORTED_SCHEMA)
        raw_id = data.get(layout.id_key)
        if not isinstance(raw_id, str):
            raise _Invalid
        try:
            event_id = EventId(raw_id)
        except ValueError as error:
            raise RecordError(SkipReason.UNKNOWN_EVENT) from error
        wall_ns = _wall_ns(data.get("ts"))
        self.known(data, layout.known_keys)
        default_severity = spec_of(event_id).severity
        severity = self.enum(Severity, data.get("severity", default_severity))
        producer = self.enum(Producer, data.get("producer", Producer.RUNTIME))
        operation_id, parent_operation_id = self.operation()
        return Event(
            id=event_id,
            producer=producer or Producer.RUNTIME,
            severity=severity or default_severity,
            wall_ns=wall_ns,
            mono_ns=wall_ns,
            operation_id=operation_id,
            parent_operation_id=parent_operation_id,
            scope=self.scope(),
            native=self.native(wall_ns),
            state=self.state(),
            progress=self.progress(),
            outcome=self.optional_enum(Outcome, data.get("outcome")),
            reason_code=self.optional_enum(ReasonCode, data.get("reason_code")),
            duration_ms=self.duration(),
            stop_reason=self.optional_enum(StopReason, data.get("stop_reason")),
            batching=self.optional_enum(BatchingMode, data.get("batching")),
            summaries=self.summaries(),
            settings=self.settings(),
        )

    @staticmethod
    def logical(values: Mapping[str, Any], key: str) -> LogicalId | None:
        value = values.get(key)
        return None if value is None else _logical(value)

    def operation(self) -> tuple[LogicalId | None, LogicalId | None]:
        """(operation_id, parent_operation_id)."""
        key = self.layout.operation_key
        if key is None:
            return self.logical(self.data, "operation_id"), self.logical(
                self.data, "parent_operation_id"
            )
        value = self.data.get(key)
        if value is None:
            return None, None
        operation = self.known(_object(value), OPERATION_KEYS)
        root = _logical(operation.get("root"))
        child = self.logical(operation, "child")
        return (root, None) if child is None else (child, root)

    def scope(self) -> Scope:
        key = self.layout.scope_key
        if key is None:
            values = self.data
        else:
            nested = self.data.get(key)
            values = {} if nested is None else self.known(_object(nested), SCOPE_FIELDS)
        index = values.get("stage_index")
        return Scope(
            model_id=self.logical(values, "model_id"),
            topology_id=self.logical(values, "topology_id"),
            stage_id=self.logical(values, "stage_id"),
            stage_index=None if index is None else _int(index),
            session_id=self.logical(values, "session_id"),
            request_id=self.logical(values, "request_id"),
            device_id=self.logical(values, "device_id"),
            plugin_id=self.logical(values, "plugin_id"),
        )

    def native(self, wall_ns: int) -> NativeStamp | None:
        value = self.data.get("native")
        if value is None:
            return None
        keys = self.layout.native_keys
        native = self.known(_object(value), frozenset(keys))
        evidence = self.enum(SequenceEvidence, native.get("evidence"))
        if evidence is None:
            return None
        clock = _int(native.get("timestamp_ns")) if "timestamp_ns" in keys else wall_ns
        return NativeStamp(
            timestamp_ns=clock, sequence=_int(native.get("sequence")), evidence=evidence
        )

    def state(self) -> StateChange | None:
        value = self.data.get("state")
        if value is None:
            return None
        state = self.known(_object(value), STATE_KEYS)
        previous = state.get("previous")
        return StateChange(
            previous=None if previous is None else _text(previous),
            current=_text(state.get("current")),
        )

    def progress(self) -> Progress | None:
        value = self.data.get("progress")
        if value is None:
            return None
        progress = self.known(_object(value), PROGRESS_KEYS)
        total = progress.get("total")
        unit = self.enum(ProgressUnit, progress.get("unit", ProgressUnit.NONE))
        return Progress(
            current=_int(progress.get("current")),
            total=None if total is None else _int(total),
            unit=unit or ProgressUnit.NONE,
        )

    def duration(self) -> float | None:
        value = self.data.get("duration_ms")
        return None if value is None else float(_number(value))

    def summaries(self) -> tuple[NumericSummary, ...]:
        value = self.data.get(self.layout.summaries_key)
        if value is None:
            return ()
        if self.layout.summaries_listed:
            if not isinstance(value, list):
                raise _Invalid
            pairs = [self.summary_item(item) for item in value]
        else:
            pairs = list(_object(value).items())
        items: list[NumericSummary] = []
        for key, number in pairs:
            try:
                summary_key = SummaryKey(key)
            except ValueError:
                self.skipped.append(SkipReason.UNKNOWN_FIELD)
                continue
            items.append(NumericSummary(summary_key, _number(number)))
        return tuple(items)

    def settings(self) -> tuple[Setting, ...]:
        value = self.data.get("settings")
        if value is None:
            return ()
        items: list[Setting] = []
        for key, setting in _object(value).items():
            try:
                items.append(Setting(key, setting))
            except InvalidSetting:
                self.skipped.append(SkipReason.UNKNOWN_VALUE)
        if len(items) > MAX_SETTINGS:
            raise _Invalid
        return tuple(items)

    def summary_item(self, item: object) -> tuple[str, object]:
        pair = self.known(_object(item), SUMMARY_ITEM_KEYS)
        key = pair.get("key")
        if not isinstance(key, str):
            raise _Invalid
        return key, pair.get("value")


def decode(data: object, layout: Layout) -> Decoded:
    """The event `data` holds in the shape `layout` describes, and every skip. Never raises."""
    if not isinstance(data, dict):
        return None, (SkipReason.INVALID_RECORD,)
    decoder = _Decoder(data, layout)
    try:
        event = decoder.decode()
    except RecordError as error:
        return None, (error.reason,)
    except _Invalid:
        return None, (SkipReason.INVALID_RECORD,)
    return event, tuple(decoder.skipped)


def decode_record(record: object) -> Decoded:
    """The event of one NDJSON record (a parsed `event_record`), and every skip."""
    return decode(record, RECORD)


def decode_object(data: object) -> Decoded:
    """The event of one SSE event object (a parsed `event_object`), and every skip."""
    return decode(data, OBJECT)


def decode_line(line: bytes | str) -> Decoded:
    """`decode_record` of one NDJSON line; a line that is not a JSON object is `malformed_line`."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, (SkipReason.MALFORMED_LINE,)
    if not isinstance(record, dict):
        return None, (SkipReason.MALFORMED_LINE,)
    return decode_record(record)


def decode_frame_event(envelope: Mapping[str, Any]) -> Decoded:
    """The event of a `runtime_event` frame's parsed data (the envelope with its `event`)."""
    version = envelope.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        return None, (SkipReason.INVALID_RECORD,)
    if version != WIRE_VERSION:
        return None, (SkipReason.UNSUPPORTED_SCHEMA,)
    return decode_object(envelope.get("event"))


def _strict(decoded: Decoded) -> Event:
    event, skipped = decoded
    if event is None:
        raise RecordError(skipped[0] if skipped else SkipReason.INVALID_RECORD)
    return event


def event_from_record(record: object) -> Event:
    """The event of one record; `RecordError` when it must be skipped (field skips are dropped
    silently here: use `decode_record` to count them)."""
    return _strict(decode_record(record))


def event_from_object(data: object) -> Event:
    """The event of one SSE event object; `RecordError` when it must be skipped."""
    return _strict(decode_object(data))
