"""The SSE event object round-trips every event; what it does not know is counted, not guessed."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    BatchingMode,
    LogicalId,
    NativeStamp,
    Progress,
    Scope,
    SequenceEvidence,
    StateChange,
    StopReason,
    make_event,
    summaries,
)
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from skippyctl.output.codec import (
    RecordError,
    SkipReason,
    decode_frame_event,
    decode_object,
    event_frame,
    event_from_object,
    event_object,
    frame,
)

TS = "2026-01-15T09:00:00.000000Z"


@pytest.mark.parametrize("event_id", list(EventId))
def test_every_event_round_trips_through_the_wire_object(event_id: EventId) -> None:
    original = make_event(
        event_id,
        operation_id=LogicalId("req-7"),
        scope=Scope(model_id=LogicalId("tiny"), session_id=LogicalId("s-1"), stage_index=2),
        native=NativeStamp(123, 4, SequenceEvidence.CONTIGUOUS),
        state=StateChange("idle", "active"),
        progress=Progress(3, 10, ProgressUnit.TOKENS),
        outcome=Outcome.SUCCESS,
        reason_code=ReasonCode.TIMEOUT,
        duration_ms=1.5,
        stop_reason=StopReason.LENGTH,
        batching=BatchingMode.CONTINUOUS,
        summaries=summaries(prompt_tokens=5, decode_tokens_per_s=12.5),
        wall_ns=1_795_000_000_123_456_000,
    )
    wire = orjson.loads(orjson.dumps(event_object(original)))
    decoded = event_from_object(wire)
    assert dataclasses.replace(decoded, mono_ns=original.mono_ns) == original
    assert decoded.mono_ns == decoded.wall_ns  # not on the wire: the object's time stands in


def test_unknown_ids_and_fields_are_tolerated_and_counted() -> None:
    assert decode_object({"kind": "some_future_event", "ts": TS, "scope": {}}) == (
        None,
        (SkipReason.UNKNOWN_EVENT,),
    )
    decoded, skipped = decode_object(
        {
            "kind": "warning_raised",
            "ts": TS,
            "scope": {"model_id": "tiny", "galaxy_id": "m31"},
            "surprise": 1,
            "numeric_summaries": [{"key": "future_key", "value": 1}],
            "outcome": "weird",
        }
    )
    assert decoded is not None
    assert decoded.scope.model_id == "tiny" and decoded.outcome is None
    assert decoded.summaries == ()
    assert sorted(skipped) == sorted(
        [
            SkipReason.UNKNOWN_FIELD,  # scope.galaxy_id
            SkipReason.UNKNOWN_FIELD,  # surprise
            SkipReason.UNKNOWN_FIELD,  # numeric_summaries future_key
            SkipReason.UNKNOWN_VALUE,  # outcome
        ]
    )


def _object(**overrides: Any) -> dict[str, Any]:
    data = event_object(make_event(EventId.MODEL_AVAILABLE, wall_ns=1_795_000_000_000_000_000))
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_object(kind="model_teleported"), SkipReason.UNKNOWN_EVENT),
        (_object(ts="yesterday"), SkipReason.INVALID_RECORD),
        (_object(ts=None), SkipReason.INVALID_RECORD),
        (_object(scope={"model_id": "/not/an/id"}), SkipReason.INVALID_RECORD),
        (_object(scope=["tiny"]), SkipReason.INVALID_RECORD),
        (_object(operation={"child": "op-1"}), SkipReason.INVALID_RECORD),
        (_object(native={"sequence": 1, "evidence": "first"}), SkipReason.INVALID_RECORD),
        (_object(numeric_summaries={"lanes": 1}), SkipReason.INVALID_RECORD),
        (_object(numeric_summaries=[{"key": "lanes", "value": "1"}]), SkipReason.INVALID_RECORD),
        (_object(numeric_summaries=[{"key": 7, "value": 1}]), SkipReason.INVALID_RECORD),
        (_object(state={"current": "x" * 65}), SkipReason.INVALID_RECORD),
        ("not an object", SkipReason.INVALID_RECORD),
    ],
)
def test_objects_that_cannot_be_events_are_skipped_with_a_reason(
    data: object, reason: SkipReason
) -> None:
    assert decode_object(data) == (None, (reason,))
    with pytest.raises(RecordError) as raised:
        event_from_object(data)
    assert raised.value.reason is reason


def test_a_bad_timestamp_is_never_read_as_zero() -> None:
    """The old wire decoder turned an unparseable `ts` into 0 (1970); the codec skips it."""
    event, skipped = decode_object(_object(ts="2026-13-45T99:00:00Z"))
    assert event is None and skipped == (SkipReason.INVALID_RECORD,)


def test_operation_root_and_child_become_parent_and_operation() -> None:
    event = event_from_object(_object(operation={"root": "load-1", "child": "eng-2"}))
    assert (event.operation_id, event.parent_operation_id) == ("eng-2", "load-1")
    only_root = event_from_object(_object(operation={"root": "load-1"}))
    assert (only_root.operation_id, only_root.parent_operation_id) == ("load-1", None)


def test_frames_are_sse_with_the_reference_envelope() -> None:
    raw = frame("runtime_event", {"event": {}}, cursor="rt1:abc:5", instance="abc", sequence=5)
    head, data = raw.decode().rstrip("\n").rsplit("\n", 1)
    assert head == "id: rt1:abc:5\nevent: runtime_event"
    envelope = orjson.loads(data.removeprefix("data: "))
    assert envelope == {
        "version": 1,
        "cursor": "rt1:abc:5",
        "process_instance_id": "abc",
        "sequence": 5,
        "event": {},
    }
    assert raw.endswith(b"\n\n")


def test_an_event_frame_decodes_back_to_its_event() -> None:
    event = make_event(
        EventId.MODEL_LOAD_PROGRESS,
        operation_id=LogicalId("load-1"),
        scope=Scope(model_id=LogicalId("tiny")),
        progress=Progress(5, 10, ProgressUnit.BYTES),
        wall_ns=1_795_000_000_000_001_000,
    )
    raw = event_frame(event, cursor="rt1:abc:9", instance="abc", sequence=9)
    assert raw == frame(
        "runtime_event",
        {"event": event_object(event)},
        cursor="rt1:abc:9",
        instance="abc",
        sequence=9,
    )
    envelope = orjson.loads(raw.decode().rstrip("\n").rsplit("\n", 1)[1].removeprefix("data: "))
    decoded, skipped = decode_frame_event(envelope)
    assert skipped == ()
    assert decoded == dataclasses.replace(event, mono_ns=event.wall_ns)


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (2, SkipReason.UNSUPPORTED_SCHEMA),
        ("1", SkipReason.INVALID_RECORD),
        (None, SkipReason.INVALID_RECORD),
    ],
)
def test_a_frame_of_another_wire_version_is_skipped(version: object, reason: SkipReason) -> None:
    envelope = {"version": version, "sequence": 1, "event": _object()}
    assert decode_frame_event(envelope) == (None, (reason,))
