"""The SSE wire projection round-trips every event, and tolerates what it does not know."""

from __future__ import annotations

import dataclasses

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
from skippyctl.output.wire import event_from_object, event_object, frame


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
    assert decoded is not None
    assert dataclasses.replace(decoded, mono_ns=original.mono_ns) == original


def test_unknown_ids_and_fields_are_tolerated() -> None:
    assert event_from_object({"kind": "some_future_event", "scope": {}}) is None
    decoded = event_from_object(
        {
            "kind": "warning_raised",
            "scope": {"model_id": "/not/an/id"},
            "surprise": 1,
            "numeric_summaries": [{"key": "future_key", "value": 1}],
            "outcome": "weird",
        }
    )
    assert decoded is not None
    assert decoded.scope.model_id is None and decoded.outcome is None and decoded.summaries == ()


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
