"""Reconciliation matrix: native terminal × authoritative return, missing terminals, crashes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import Producer, ReasonCode
from skippyctl.pipeline.authority import (
    CancelRequested,
    ContextBegun,
    ContextReturned,
    EngineExited,
    LoadBegun,
    LoadReturned,
    OperationBound,
)
from skippyctl.pipeline.native_adapter import NativeAdapter
from skippyctl.pipeline.reconcile import Reconciler

OP = LogicalId("load-1")
MODEL = LogicalId("tiny")


@dataclass(frozen=True)
class Fact:
    """A drained native record, as the ring hands it over (only the fields the adapter reads)."""

    kind: int
    sequence: int
    operation_id: int = 1
    category: int = 1
    timestamp_mono_ns: int = 1
    progress_current: int = 0
    progress_total: int = 0
    progress_unit: int = 0
    failure_code: int = 0
    status: int = 0
    detail: bytes = b""
    numeric_summaries: tuple[int, int, int, int] | None = None
    coalesced_count: int = 0


def _setup() -> tuple[NativeAdapter, Reconciler]:
    adapter, reconciler = NativeAdapter(), Reconciler()
    binding = OperationBound("engine-1", OP, 1, MODEL)
    adapter.bind(binding)
    reconciler.on_authority(binding)
    return adapter, reconciler


def _native(adapter: NativeAdapter, reconciler: Reconciler, fact: Fact) -> list[Event]:
    return [e for a in adapter.adapt(fact) for e in reconciler.on_native(a)]


def _ids(events: list[Event]) -> list[EventId]:
    return [e.id for e in events]


@pytest.mark.parametrize(
    ("native_kind", "returned_ok", "expected", "producer", "conflicts"),
    [
        (4, True, EventId.NATIVE_MODEL_LOAD_COMPLETED, Producer.NATIVE, 0),
        (5, False, EventId.MODEL_LOAD_FAILED, Producer.NATIVE, 0),
        (4, False, EventId.MODEL_LOAD_FAILED, Producer.RECONCILED, 1),
        (5, True, EventId.NATIVE_MODEL_LOAD_COMPLETED, Producer.RECONCILED, 1),
        (None, True, EventId.NATIVE_MODEL_LOAD_COMPLETED, Producer.RECONCILED, 0),
        (None, False, EventId.MODEL_LOAD_FAILED, Producer.RECONCILED, 0),
    ],
)
def test_return_value_decides_every_callback_return_combination(
    native_kind: int | None,
    returned_ok: bool,
    expected: EventId,
    producer: Producer,
    conflicts: int,
) -> None:
    adapter, reconciler = _setup()
    assert _ids(_native(adapter, reconciler, Fact(kind=1, sequence=1))) == [
        EventId.MODEL_LOAD_STARTED
    ]
    if native_kind is not None:
        assert _native(adapter, reconciler, Fact(kind=native_kind, sequence=2)) == []
    events = reconciler.on_authority(LoadReturned(OP, ok=returned_ok))
    assert _ids(events) == [expected]
    assert events[0].producer is producer
    assert reconciler.counters.conflicts == conflicts
    assert reconciler.on_authority(LoadReturned(OP, ok=returned_ok)) == []


def test_legacy_runtime_without_events_gets_started_and_terminal_from_returns() -> None:
    _, reconciler = _setup()
    events = reconciler.on_authority(LoadBegun(OP))
    events += reconciler.on_authority(LoadReturned(OP, ok=True))
    events += reconciler.on_authority(ContextBegun(OP))
    events += reconciler.on_authority(ContextReturned(OP, ok=True, context_tokens=512))
    assert _ids(events) == [
        EventId.MODEL_LOAD_STARTED,
        EventId.NATIVE_MODEL_LOAD_COMPLETED,
        EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
        EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
    ]
    assert {e.producer for e in events[:2]} == {Producer.RECONCILED}


def test_the_returned_figures_become_the_summaries_of_the_events_made_from_the_returns() -> None:
    _, reconciler = _setup()
    reconciler.on_authority(LoadBegun(OP))
    (loaded,) = reconciler.on_authority(
        LoadReturned(
            OP,
            ok=True,
            model_size_bytes=410880,
            parameters=205120,
            layers=2,
            context_train_tokens=2048,
            vocab_size=1024,
            files=3,
        )
    )
    reconciler.on_authority(ContextBegun(OP))
    (serving,) = reconciler.on_authority(
        ContextReturned(
            OP, ok=True, context_tokens=256, lanes=1, context_tokens_per_lane=256, batch_tokens=256
        )
    )
    assert loaded.id is EventId.NATIVE_MODEL_LOAD_COMPLETED
    assert {s.key: s.value for s in loaded.summaries} == {
        SummaryKey.MODEL_SIZE_BYTES: 410880,
        SummaryKey.PARAMETERS: 205120,
        SummaryKey.LAYERS: 2,
        SummaryKey.CONTEXT_TRAIN_TOKENS: 2048,
        SummaryKey.VOCAB_SIZE: 1024,
        SummaryKey.FILES: 3,
    }
    assert serving.id is EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED
    assert {s.key: s.value for s in serving.summaries} == {
        SummaryKey.CONTEXT_TOKENS: 256,
        SummaryKey.LANES: 1,
        SummaryKey.CONTEXT_TOKENS_PER_LANE: 256,
        SummaryKey.BATCH_TOKENS: 256,
    }


def test_a_figure_the_engine_did_not_return_is_no_summary() -> None:
    _, reconciler = _setup()
    reconciler.on_authority(LoadBegun(OP))
    (loaded,) = reconciler.on_authority(LoadReturned(OP, ok=True, layers=2))
    assert [s.key for s in loaded.summaries] == [SummaryKey.LAYERS]


def test_native_started_is_not_repeated_by_the_return_path() -> None:
    adapter, reconciler = _setup()
    _native(adapter, reconciler, Fact(kind=1, sequence=1))
    assert reconciler.on_authority(LoadBegun(OP)) == []


def test_engine_crash_gives_each_in_flight_operation_exactly_one_process_crash() -> None:
    adapter, reconciler = _setup()
    other = OperationBound("engine-1", LogicalId("load-2"), 2, LogicalId("other"))
    adapter.bind(other)
    reconciler.on_authority(other)
    _native(adapter, reconciler, Fact(kind=1, sequence=1))
    events = reconciler.on_authority(EngineExited("engine-1", True, None, 9))
    failed = [e for e in events if e.id is EventId.MODEL_LOAD_FAILED]
    assert sorted(str(e.operation_id) for e in failed) == ["load-1", "load-2"]
    assert {e.reason_code for e in failed} == {ReasonCode.PROCESS_CRASH}
    assert _ids(events)[-1] is EventId.ENGINE_PROCESS_CRASHED
    again = reconciler.on_authority(EngineExited("engine-1", True, None, 9))
    assert [e for e in again if e.id is EventId.MODEL_LOAD_FAILED] == []


def test_cancel_request_decides_the_reason_of_a_failed_return() -> None:
    _, reconciler = _setup()
    reconciler.on_authority(CancelRequested(OP, ReasonCode.TIMEOUT))
    events = reconciler.on_authority(LoadReturned(OP, ok=False))
    assert _ids(events) == [EventId.MODEL_LOAD_FAILED]
    assert events[0].reason_code is ReasonCode.TIMEOUT
    _, reconciler = _setup()
    reconciler.on_authority(CancelRequested(OP, ReasonCode.CANCELLATION))
    assert _ids(reconciler.on_authority(LoadReturned(OP, ok=False))) == [
        EventId.MODEL_LOAD_CANCELLED
    ]


def test_lost_progress_does_not_change_the_terminal() -> None:
    adapter, reconciler = _setup()
    _native(adapter, reconciler, Fact(kind=1, sequence=1))
    # progress sequences 2..9 were dropped in the ring; the terminal still reconciles
    events = _native(
        adapter,
        reconciler,
        Fact(kind=2, sequence=10, progress_current=900, progress_total=1000, progress_unit=4),
    )
    assert _ids(events) == [EventId.NATIVE_SEQUENCE_GAP_DETECTED, EventId.MODEL_LOAD_PROGRESS]
    _native(adapter, reconciler, Fact(kind=4, sequence=11))
    assert _ids(reconciler.on_authority(LoadReturned(OP, ok=True))) == [
        EventId.NATIVE_MODEL_LOAD_COMPLETED
    ]


def test_gap_explained_by_ring_coalescing_is_not_reported() -> None:
    adapter, reconciler = _setup()
    _native(adapter, reconciler, Fact(kind=1, sequence=1))
    fact = Fact(
        kind=2,
        sequence=5,
        progress_current=4,
        progress_total=1000,
        progress_unit=4,
        coalesced_count=3,
    )
    assert _ids(_native(adapter, reconciler, fact)) == [EventId.MODEL_LOAD_PROGRESS]


def test_unknown_native_kind_is_counted_not_raised() -> None:
    adapter, reconciler = _setup()
    assert _native(adapter, reconciler, Fact(kind=9999, sequence=1)) == []
    assert _native(adapter, reconciler, Fact(kind=1, sequence=2, category=77)) == []
    assert adapter.counters.unknown == 2


def test_context_failure_ends_the_load_with_backend_reason() -> None:
    _, reconciler = _setup()
    reconciler.on_authority(LoadReturned(OP, ok=True))
    events = reconciler.on_authority(ContextReturned(OP, ok=False))
    assert _ids(events) == [
        EventId.SERVING_BACKEND_INITIALIZATION_FAILED,
        EventId.MODEL_LOAD_FAILED,
    ]
    assert events[1].reason_code is ReasonCode.BACKEND_INITIALIZATION_FAILURE
