"""One codec, two shapes: decode(encode(event)) is the event for generated events, and every
skip the decoder takes is counted with the same reason in both shapes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import (
    BatchingMode,
    Event,
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
    make_event,
)
from skippyctl.events.reasons import Outcome, Producer, ProgressUnit, ReasonCode, Severity
from skippyctl.output.codec import (
    OBJECT,
    RECORD,
    Layout,
    SkipReason,
    decode,
    decode_line,
    event_object,
    event_record,
)

SHAPES: dict[str, tuple[Layout, Callable[[Event], dict[str, Any]]]] = {
    "record": (RECORD, lambda event: event_record(event, seq=3, cursor="rt1:abc:3")),
    "object": (OBJECT, event_object),
}

_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:+=-]{0,63}", fullmatch=True).map(LogicalId)
_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=64)
_numbers = st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


events = st.builds(
    Event,
    id=st.sampled_from(list(EventId)),
    producer=st.sampled_from(list(Producer)),
    severity=st.sampled_from(list(Severity)),
    # Whole microseconds (what `ts` carries) up to 2033: within float precision of rfc3339.
    wall_ns=st.integers(0, 2 * 10**12).map(lambda us: us * 1000),
    mono_ns=st.integers(0, 2**63 - 1),
    operation_id=_maybe(_ids),
    parent_operation_id=_maybe(_ids),
    scope=st.builds(
        Scope,
        model_id=_maybe(_ids),
        topology_id=_maybe(_ids),
        stage_id=_maybe(_ids),
        stage_index=_maybe(st.integers(0, 2**31)),
        session_id=_maybe(_ids),
        request_id=_maybe(_ids),
        device_id=_maybe(_ids),
    ),
    native=_maybe(
        st.builds(
            NativeStamp,
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**63 - 1),
            st.sampled_from(list(SequenceEvidence)),
        )
    ),
    state=_maybe(st.builds(StateChange, _maybe(_names), _names)),
    progress=_maybe(
        st.builds(
            Progress,
            st.integers(0, 2**63 - 1),
            _maybe(st.integers(0, 2**63 - 1)),
            st.sampled_from(list(ProgressUnit)),
        )
    ),
    outcome=_maybe(st.sampled_from(list(Outcome))),
    reason_code=_maybe(st.sampled_from(list(ReasonCode))),
    duration_ms=_maybe(st.floats(allow_nan=False, allow_infinity=False)),
    stop_reason=_maybe(st.sampled_from(list(StopReason))),
    batching=_maybe(st.sampled_from(list(BatchingMode))),
    # Distinct keys: the record's summaries are an object, one value per key.
    summaries=st.lists(
        st.builds(NumericSummary, st.sampled_from(list(SummaryKey)), _numbers),
        max_size=6,
        unique_by=lambda s: s.key,
    ).map(tuple),
    # Distinct keys (an object); a value is a number, a flag or a short token.
    settings=st.lists(
        st.builds(
            Setting,
            st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True),
            st.one_of(st.booleans(), _numbers, _ids),
        ),
        max_size=4,
        unique_by=lambda s: s.key,
    ).map(tuple),
)


def _carried(event: Event, layout: Layout) -> Event:
    """`event` as far as `layout` carries it (see the codec's "reconstructed" rules)."""
    parent = event.parent_operation_id if event.operation_id is not None else None
    native = event.native
    if layout is RECORD:
        parent = None
        if native is not None:
            native = dataclasses.replace(native, timestamp_ns=event.wall_ns)
    return dataclasses.replace(
        event, mono_ns=event.wall_ns, parent_operation_id=parent, native=native
    )


@pytest.mark.parametrize("shape", SHAPES)
@given(event=events)
def test_decode_of_encode_is_the_event_in_both_shapes(shape: str, event: Event) -> None:
    layout, encode = SHAPES[shape]
    wire = orjson.loads(orjson.dumps(encode(event)))
    decoded, skipped = decode(wire, layout)
    assert skipped == ()
    assert decoded == _carried(event, layout)
    assert orjson.dumps(encode(decoded)) == orjson.dumps(encode(event))


# -- counted skips, the same table for both shapes -------------------------------------------

BASE = make_event(
    EventId.GENERATION_COMPLETED,
    Producer.NATIVE,
    operation_id=LogicalId("req-1"),
    scope=Scope(model_id=LogicalId("tiny"), request_id=LogicalId("req-1")),
    native=NativeStamp(5, 2, SequenceEvidence.CONTIGUOUS),
    state=StateChange("decode", "done"),
    progress=Progress(3, 8, ProgressUnit.TOKENS),
    outcome=Outcome.SUCCESS,
    reason_code=ReasonCode.TIMEOUT,
    duration_ms=2.5,
    stop_reason=StopReason.EOS,
    batching=BatchingMode.SINGLE,
    summaries=(NumericSummary(SummaryKey.GENERATED_TOKENS, 8),),
    wall_ns=1_795_000_000_000_000_000,
)

Mutation = Callable[[dict[str, Any], Layout], None]


def _set(key: str, value: object) -> Mutation:
    return lambda data, layout: data.update({key: value})


def _nested(key: str, inner: str, value: object) -> Mutation:
    return lambda data, layout: data[key].update({inner: value})


def _scope_key(key: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any], layout: Layout) -> None:
        (data if layout.scope_key is None else data[layout.scope_key])[key] = value

    return mutate


def _summary(key: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any], layout: Layout) -> None:
        if layout.summaries_listed:
            data[layout.summaries_key].append({"key": key, "value": value})
        else:
            data[layout.summaries_key][key] = value

    return mutate


def _event_id(value: object) -> Mutation:
    return lambda data, layout: data.update({layout.id_key: value})


FIELD_SKIPS: list[tuple[str, Mutation, tuple[SkipReason, ...], Callable[[Event], bool]]] = [
    ("unknown top field", _set("warp", 9), (SkipReason.UNKNOWN_FIELD,), lambda e: True),
    (
        "unknown scope key",
        _scope_key("galaxy_id", "m31"),
        (SkipReason.UNKNOWN_FIELD,),
        lambda e: True,
    ),
    (
        "unknown summary key",
        _summary("warp_factor", 9),
        (SkipReason.UNKNOWN_FIELD,),
        lambda e: e.summaries == BASE.summaries,
    ),
    (
        "unknown progress key",
        _nested("progress", "eta", 1),
        (SkipReason.UNKNOWN_FIELD,),
        lambda e: e.progress == BASE.progress,
    ),
    (
        "unknown severity",
        _set("severity", "catastrophic"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.severity is spec_of(BASE.id).severity,
    ),
    (
        "unknown producer",
        _set("producer", "martians"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.producer is Producer.RUNTIME,
    ),
    (
        "unknown outcome",
        _set("outcome", "weird"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.outcome is None,
    ),
    (
        "unknown reason code",
        _set("reason_code", "solar_flare"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.reason_code is None,
    ),
    (
        "unknown stop reason",
        _set("stop_reason", "boredom"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.stop_reason is None,
    ),
    (
        "unknown batching",
        _set("batching", "psychic"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.batching is None,
    ),
    (
        "unknown progress unit",
        _nested("progress", "unit", "furlongs"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.progress is not None and e.progress.unit is ProgressUnit.NONE,
    ),
    (
        "unknown native evidence",
        _nested("native", "evidence", "hearsay"),
        (SkipReason.UNKNOWN_VALUE,),
        lambda e: e.native is None,
    ),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("mutate", "expected", "holds"),
    [pytest.param(m, x, h, id=name) for name, m, x, h in FIELD_SKIPS],
)
def test_field_skips_keep_the_record_and_are_counted(
    shape: str,
    mutate: Mutation,
    expected: tuple[SkipReason, ...],
    holds: Callable[[Event], bool],
) -> None:
    layout, encode = SHAPES[shape]
    data = orjson.loads(orjson.dumps(encode(BASE)))
    mutate(data, layout)
    event, skipped = decode(data, layout)
    assert event is not None
    assert skipped == expected
    assert holds(event)
    assert event.id is BASE.id and event.wall_ns == BASE.wall_ns


RECORD_SKIPS_TABLE: list[tuple[str, Mutation, SkipReason]] = [
    ("unknown event id", _event_id("model_teleported"), SkipReason.UNKNOWN_EVENT),
    ("event id not text", _event_id(7), SkipReason.INVALID_RECORD),
    ("bad timestamp", _set("ts", "yesterday"), SkipReason.INVALID_RECORD),
    ("no timestamp", _set("ts", None), SkipReason.INVALID_RECORD),
    ("path as identity", _scope_key("model_id", "/home/me/tiny.gguf"), SkipReason.INVALID_RECORD),
    ("progress not a number", _nested("progress", "current", "half"), SkipReason.INVALID_RECORD),
    ("boolean as a number", _set("duration_ms", True), SkipReason.INVALID_RECORD),
    ("summary not a number", _summary("lanes", "4"), SkipReason.INVALID_RECORD),
    ("state too long", _nested("state", "current", "x" * 65), SkipReason.INVALID_RECORD),
    ("native not an object", _set("native", [1]), SkipReason.INVALID_RECORD),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("mutate", "reason"), [pytest.param(m, r, id=name) for name, m, r in RECORD_SKIPS_TABLE]
)
def test_record_skips_drop_the_whole_record_with_one_reason(
    shape: str, mutate: Mutation, reason: SkipReason
) -> None:
    layout, encode = SHAPES[shape]
    data = orjson.loads(orjson.dumps(encode(BASE)))
    mutate(data, layout)
    assert decode(data, layout) == (None, (reason,))


@pytest.mark.parametrize("version", [0, 2, 99])
def test_a_record_of_another_schema_version_is_unsupported(version: int) -> None:
    record = event_record(BASE)
    record["schema_version"] = version
    assert decode(record, RECORD) == (None, (SkipReason.UNSUPPORTED_SCHEMA,))


def test_several_skips_in_one_record_are_each_counted() -> None:
    record = event_record(BASE)
    record.update(warp=1, reason_code="solar_flare", severity="catastrophic")
    record["summaries"]["warp_factor"] = 9
    event, skipped = decode_line(orjson.dumps(record))
    assert event is not None
    assert sorted(skipped) == sorted(
        [SkipReason.UNKNOWN_FIELD] * 2 + [SkipReason.UNKNOWN_VALUE] * 2
    )
