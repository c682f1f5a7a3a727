"""The adapter does what the native kind table says, kind by kind, on both paths."""

from __future__ import annotations

import pytest

from skippyctl.events.envelope import SummaryKey
from skippyctl.events.native_kinds import (
    KINDS_SHARING_AN_EVENT,
    NATIVE_KINDS,
    Handling,
    NativeKindSpec,
)
from skippyctl.events.reasons import ReasonCode
from skippyctl.native import abi
from skippyctl.pipeline.native_adapter import AdaptedFact, NativeAdapter
from tests.pipeline.test_native_batch import Record, batch_of, bound_adapter
from tests.pipeline.test_reconcile import Fact

LANE_OF_KIND = {2: 1, 400: 2, 401: 2, 402: 2}


def _check(spec: NativeKindSpec, adapted: list[AdaptedFact], reason_from_code: ReasonCode) -> None:
    [only] = adapted
    event = only.event
    assert event.id is spec.event
    assert only.needs_authority is (spec.handling is Handling.RECONCILED_TERMINAL)
    if spec.reason is not None:
        assert event.reason_code is spec.reason
    elif spec.reason_from_failure_code:
        assert event.reason_code is reason_from_code
    else:
        assert event.reason_code is None
    tagged = event.summary_value(SummaryKey.NATIVE_KIND)
    assert tagged == (int(spec.kind) if spec.kind in KINDS_SHARING_AN_EVENT else None)


@pytest.mark.parametrize("spec", NATIVE_KINDS, ids=lambda spec: spec.kind.name)
def test_one_fact_of_each_kind_per_fact(spec: NativeKindSpec) -> None:
    adapter = NativeAdapter()
    fact = Fact(kind=spec.kind, sequence=1, failure_code=abi.FailureCode.IO_ERROR)
    _check(spec, adapter.adapt(fact), ReasonCode.ARTIFACT_IO_FAILURE)


@pytest.mark.parametrize("spec", NATIVE_KINDS, ids=lambda spec: spec.kind.name)
def test_one_fact_of_each_kind_in_a_batch(spec: NativeKindSpec) -> None:
    adapter = bound_adapter(1)
    lane = LANE_OF_KIND.get(int(spec.kind), 0)
    batch = batch_of([Record(1, 1, int(spec.kind), lane)])
    # batch_of leaves failure_code 0 (FailureCode.NONE)
    _check(spec, adapter.adapt_batch(batch), ReasonCode.UNKNOWN_FAILURE)


def test_a_kind_outside_the_table_is_counted_not_adapted() -> None:
    adapter = NativeAdapter()
    assert adapter.adapt(Fact(kind=105, sequence=1)) == []
    assert adapter.adapt(Fact(kind=201, sequence=1, category=9)) == []
    assert adapter.adapt_batch(batch_of([Record(1, 1, 9999), Record(1, 2, 201, category=0)])) == []
    assert adapter.counters.unknown == 4
