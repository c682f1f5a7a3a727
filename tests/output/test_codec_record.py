"""The NDJSON record: `event_record` → `event_from_record` round-trips; bad input is counted."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from skippy_tui import demo
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    BatchingMode,
    LogicalId,
    NativeStamp,
    Scope,
    SequenceEvidence,
    StopReason,
    make_event,
)
from skippyctl.events.reasons import Producer, Severity
from skippyctl.output.codec import (
    RecordError,
    SkipReason,
    decode_line,
    decode_record,
    event_from_record,
    event_record,
)

ALL_SCENARIOS = demo.loading() + demo.failed() + demo.sessions() + demo.pressure() + demo.topology()


def _record(**overrides: Any) -> dict[str, Any]:
    record = event_record(demo.available()[-1], seq=7)
    record.update(overrides)
    return record


def test_every_scenario_event_round_trips_through_its_record() -> None:
    for event in ALL_SCENARIOS:
        record = event_record(event, seq=1)
        decoded = event_from_record(orjson.loads(orjson.dumps(record)))
        assert event_record(decoded, seq=1) == record
        assert decoded.wall_ns == event.wall_ns
        assert decoded.mono_ns == decoded.wall_ns  # not on the wire: the record's time stands in


def test_native_stamp_and_stage_index_survive() -> None:
    event = make_event(
        EventId.STAGE_READY,
        Producer.NATIVE,
        scope=Scope(stage_id=LogicalId("stage-0"), stage_index=0),
        native=NativeStamp(timestamp_ns=5, sequence=9, evidence=SequenceEvidence.GAP),
        wall_ns=demo.T0_NS,
        mono_ns=1,
    )
    decoded = event_from_record(event_record(event))
    assert decoded.scope.stage_index == 0
    assert decoded.native is not None
    assert (decoded.native.sequence, decoded.native.evidence) == (9, SequenceEvidence.GAP)


def test_ndjson_lines_of_a_load_decode_without_skips() -> None:
    lines = [orjson.dumps(event_record(e, seq=i)) for i, e in enumerate(demo.available())]
    for line in lines:
        event, skipped = decode_line(line)
        assert event is not None
        assert skipped == ()


def test_generation_fields_round_trip() -> None:
    event = make_event(
        EventId.GENERATION_COMPLETED,
        scope=Scope(model_id=LogicalId("tiny"), request_id=LogicalId("req-1")),
        stop_reason=StopReason.EOS,
        batching=BatchingMode.CONTINUOUS,
        wall_ns=demo.T0_NS,
        mono_ns=1,
    )
    decoded = event_from_record(event_record(event))
    assert (decoded.stop_reason, decoded.batching) == (StopReason.EOS, BatchingMode.CONTINUOUS)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_record(event="model_teleported"), SkipReason.UNKNOWN_EVENT),
        (_record(schema_version=2), SkipReason.UNSUPPORTED_SCHEMA),
        (_record(schema_version="1"), SkipReason.INVALID_RECORD),
        (_record(ts="yesterday"), SkipReason.INVALID_RECORD),
        (_record(model_id="/home/me/models/tiny.gguf"), SkipReason.INVALID_RECORD),
        (_record(progress={"current": "half"}), SkipReason.INVALID_RECORD),
        (_record(summaries={"lanes": True}), SkipReason.INVALID_RECORD),
        ({"event": "model_available"}, SkipReason.INVALID_RECORD),
    ],
)
def test_records_that_cannot_be_events_are_skipped_with_a_reason(
    record: dict[str, Any], reason: SkipReason
) -> None:
    event, skipped = decode_record(record)
    assert event is None
    assert skipped == (reason,)
    with pytest.raises(RecordError) as raised:
        event_from_record(record)
    assert raised.value.reason is reason


def test_unknown_fields_and_values_are_dropped_and_counted_not_fatal() -> None:
    record = _record(
        future_field={"x": 1},
        reason_code="solar_flare",
        severity="catastrophic",
        summaries={"lanes": 4, "warp_factor": 9},
    )
    event, skipped = decode_record(record)
    assert event is not None
    assert event.reason_code is None
    assert event.severity is Severity.INFO  # the catalog default for model_available
    assert event.summaries[0].value == 4
    assert sorted(skipped) == sorted(
        [
            SkipReason.UNKNOWN_FIELD,  # future_field
            SkipReason.UNKNOWN_FIELD,  # warp_factor
            SkipReason.UNKNOWN_VALUE,  # reason_code
            SkipReason.UNKNOWN_VALUE,  # severity
        ]
    )


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b"{", b'"text"'])
def test_lines_that_are_not_json_objects_are_malformed(line: bytes) -> None:
    assert decode_line(line) == (None, (SkipReason.MALFORMED_LINE,))
