"""`make_event` builds the `Event` that `Event(...)` would, field for field; settings are
private by construction."""

from __future__ import annotations

import dataclasses

import pytest

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import (
    MAX_SETTINGS,
    BatchingMode,
    Event,
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
    make_event,
    settings,
)
from skippyctl.events.reasons import Outcome, Producer, ProgressUnit, ReasonCode, Severity


def test_make_event_with_every_field_given_equals_the_dataclass_built_from_them() -> None:
    fields = {
        "producer": Producer.NATIVE,
        "severity": Severity.ERROR,
        "wall_ns": 11,
        "mono_ns": 12,
        "operation_id": LogicalId("op-1"),
        "parent_operation_id": LogicalId("op-0"),
        "scope": Scope(model_id=LogicalId("tiny"), device_id=LogicalId("CPU")),
        "native": NativeStamp(5, 6, SequenceEvidence.GAP),
        "state": StateChange(previous="off", current="on"),
        "progress": Progress(3, 9, ProgressUnit.STEPS),
        "outcome": Outcome.FAILURE,
        "reason_code": ReasonCode.CANCELLATION,
        "duration_ms": 1.5,
        "stop_reason": next(iter(StopReason)),
        "batching": next(iter(BatchingMode)),
        "summaries": (NumericSummary(SummaryKey.COUNT, 2),),
        "settings": (Setting("threads", 2), Setting("spec", "ngram")),
    }
    built = make_event(EventId.MODEL_LOAD_FAILED, **fields)  # type: ignore[arg-type]  # the dict's values are typed per key above
    expected = Event(id=EventId.MODEL_LOAD_FAILED, **fields)  # type: ignore[arg-type]  # as above
    assert built == expected
    assert dataclasses.astuple(built) == dataclasses.astuple(expected)
    assert {f.name for f in dataclasses.fields(Event)} == {"id", *fields}


def test_make_event_defaults_are_the_dataclass_defaults_and_the_catalog_severity() -> None:
    built = make_event(EventId.CACHE_PRESSURE_CROSSED, wall_ns=1, mono_ns=2)
    expected = Event(
        id=EventId.CACHE_PRESSURE_CROSSED,
        producer=Producer.RUNTIME,
        severity=spec_of(EventId.CACHE_PRESSURE_CROSSED).severity,
        wall_ns=1,
        mono_ns=2,
    )
    assert built == expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model", "/home/user/model.gguf"),  # a path
        ("prompt", "say the secret word"),  # text with spaces
        ("Bad-Key", 1),
        ("ratio", float("nan")),
        ("nested", [1, 2]),
    ],
)
def test_a_setting_cannot_hold_a_path_text_or_an_unbounded_value(key: str, value: object) -> None:
    with pytest.raises(InvalidSetting):
        Setting(key, value)  # type: ignore[arg-type]  # deliberately ill-typed values too


def test_an_event_holds_at_most_max_settings() -> None:
    pairs = tuple((f"s{i}", i) for i in range(MAX_SETTINGS + 1))
    assert len(settings(pairs[:MAX_SETTINGS])) == MAX_SETTINGS
    with pytest.raises(InvalidSetting):
        settings(pairs)
