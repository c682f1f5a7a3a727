"""The batch path over drained native records: FactBatch columns, and NativeAdapter.adapt_batch
(same evidence as the per-fact path, diagnostics folded per operation and kind, gaps once)."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Scope,
    SequenceEvidence,
    SummaryKey,
    make_event,
    summaries,
)
from skippyctl.events.reasons import ReasonCode
from skippyctl.native import abi
from skippyctl.native.ingress import (
    EngineAdapter,
    FactBatch,
    IngressConfig,
    NativeFact,
    ProducerThreads,
    SharedIngress,
)
from skippyctl.native.library import native_library
from skippyctl.pipeline.authority import OperationBound
from skippyctl.pipeline.native_adapter import (
    DIAGNOSTIC_LANE,
    LEVEL_STATE_KINDS,
    AdaptedFact,
    NativeAdapter,
)
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import MAX_RECENT_EVENTS, RuntimeView

WARNING = int(abi.Kind.DIAGNOSTIC_WARNING_RAISED)
PRESSURE = int(abi.Kind.KV_PRESSURE_CROSSED)
PROGRESS = int(abi.Kind.MODEL_OPEN_PROGRESS)
CLEARED = int(abi.Kind.KV_PRESSURE_CLEARED)
EXHAUSTED = int(abi.Kind.KV_CAPACITY_EXHAUSTED)
UNLOAD_COMPLETED = int(abi.Kind.UNLOAD_COMPLETED)
STATE_LANE = 0
PROGRESS_LANE = 1


@dataclass(frozen=True)
class Record:
    operation_id: int
    sequence: int
    kind: int
    lane: int = STATE_LANE
    category: int = 1
    coalesced_count: int = 0
    progress_unit: int = 0


def batch_of(records: list[Record]) -> FactBatch:
    """Encode records exactly as skippy_ingress_drain writes them."""
    array = (abi.skippy_native_fact_v1 * max(1, len(records)))()
    for slot, record in zip(array, records, strict=False):
        slot.struct_size = ctypes.sizeof(abi.skippy_native_fact_v1)
        slot.lane = record.lane
        slot.operation_id = record.operation_id
        slot.coalesced_count = record.coalesced_count
        slot.event.abi_version = abi.RUNTIME_EVENT_ABI_VERSION
        slot.event.category = record.category
        slot.event.kind = record.kind
        slot.event.sequence = record.sequence
        slot.event.progress_unit = record.progress_unit
        slot.event.timestamp_mono_ns = 1000 + record.sequence
    size = ctypes.sizeof(abi.skippy_native_fact_v1) * len(records)
    return FactBatch(bytes(array)[:size], len(records))


def bound_adapter(*operations: int) -> NativeAdapter:
    adapter = NativeAdapter()
    for operation in operations:
        adapter.bind(
            OperationBound("engine", LogicalId(f"op-{operation}"), operation, LogicalId("m"))
        )
    return adapter


def test_fact_batch_columns_and_records_agree_with_the_encoded_records() -> None:
    records = [Record(3, 9, PRESSURE), Record(4, 2, WARNING, DIAGNOSTIC_LANE, 4, progress_unit=2)]
    batch = batch_of(records)
    assert len(batch) == 2
    assert batch.operation_ids.tolist() == [3, 4]
    assert batch.sequences.tolist() == [9, 2]
    assert batch.kinds.tolist() == [PRESSURE, WARNING]
    assert batch.lanes.tolist() == [STATE_LANE, DIAGNOSTIC_LANE]
    assert batch.timestamps_mono_ns.tolist() == [1009, 1002]
    assert batch.progress_units.tolist() == [0, 2]
    second = batch[1]
    assert isinstance(second, NativeFact)
    assert (second.operation_id, second.sequence, second.kind, second.category) == (4, 2, 400, 4)
    assert batch[-1] == second
    assert [fact.kind for fact in batch] == [PRESSURE, WARNING]


def test_a_diagnostic_storm_becomes_one_event_per_operation_and_kind_with_its_count() -> None:
    adapter = bound_adapter(1)
    storm = [Record(1, n, WARNING, DIAGNOSTIC_LANE, 4) for n in range(1, 501)]
    adapted = adapter.adapt_batch(batch_of(storm))
    assert [a.event.id for a in adapted] == [EventId.WARNING_RAISED]
    counts = {s.key: s.value for s in adapted[0].event.summaries}
    assert counts[SummaryKey.COUNT] == 500
    assert adapter.counters.facts == 500
    assert adapter.counters.sampled == 499  # facts = events' counts: nothing unaccounted


def count_of(adapted: AdaptedFact) -> int:
    numbers = {s.key: s.value for s in adapted.event.summaries}
    return int(numbers.get(SummaryKey.COUNT, 1))


def pressure_after(events: list[Event]) -> bool:
    """Model m's reduced kv pressure after its load was requested and `events` happened."""
    model = LogicalId("m")
    requested = make_event(
        EventId.MODEL_LOAD_REQUESTED, operation_id=LogicalId("op-1"), scope=Scope(model_id=model)
    )
    state = RuntimeView()
    for event in [requested, *events]:
        state, _ = reduce(state, event)
    return state.models[model].kv.pressure


def test_repeated_level_states_fold_into_the_first_of_each_run_and_transitions_are_kept() -> None:
    adapter = bound_adapter(1)
    kinds = [PRESSURE] * 40 + [CLEARED] * 20 + [PRESSURE] * 10
    records = [Record(1, n, kind, category=3) for n, kind in enumerate(kinds, start=1)]
    records.append(Record(1, 71, PROGRESS, PROGRESS_LANE))
    records.append(Record(1, 72, PROGRESS, PROGRESS_LANE))
    adapted = adapter.adapt_batch(batch_of(records))
    assert [(a.event.id, count_of(a)) for a in adapted] == [
        (EventId.CACHE_PRESSURE_CROSSED, 40),
        (EventId.CACHE_PRESSURE_CLEARED, 20),
        (EventId.CACHE_PRESSURE_CROSSED, 10),
        (EventId.MODEL_LOAD_PROGRESS, 1),
        (EventId.MODEL_LOAD_PROGRESS, 1),
    ]
    # The event of a run is its first fact: the moment of the transition.
    assert adapted[1].event.native is not None and adapted[1].event.native.sequence == 41
    assert adapter.counters.coalesced == 39 + 19 + 9
    assert adapter.counters.sampled == 0


def test_occurrences_terminals_and_facts_after_a_gap_are_never_folded() -> None:
    adapter = bound_adapter(1)
    records = [Record(1, s, PRESSURE, category=3) for s in (1, 2, 5, 6)]
    records += [Record(1, s, EXHAUSTED, category=3) for s in (7, 8, 9)]
    records += [Record(1, s, UNLOAD_COMPLETED, category=7) for s in (10, 11)]
    adapted = adapter.adapt_batch(batch_of(records))
    assert [(a.event.id, count_of(a)) for a in adapted] == [
        (EventId.CACHE_PRESSURE_CROSSED, 2),
        (EventId.NATIVE_SEQUENCE_GAP_DETECTED, 1),
        # sequence 5 follows a gap: what was lost may have been a different state
        (EventId.CACHE_PRESSURE_CROSSED, 2),
        (EventId.CONTEXT_EXHAUSTED, 1),
        (EventId.CONTEXT_EXHAUSTED, 1),
        (EventId.CONTEXT_EXHAUSTED, 1),
        (EventId.UNLOAD_COMPLETED, 1),
        (EventId.UNLOAD_COMPLETED, 1),
    ]
    assert adapter.counters.coalesced == 2


def test_folding_repeats_leaves_the_reduced_kv_pressure_as_the_per_fact_stream_does() -> None:
    """Reducing the folded stream gives the same pressure state as reducing every fact."""
    kinds = [PRESSURE] * 5 + [CLEARED] * 3 + [PRESSURE] * 4
    records = [Record(1, n, kind, category=3) for n, kind in enumerate(kinds, start=1)]
    folded = [a.event for a in bound_adapter(1).adapt_batch(batch_of(records))]
    per_fact_adapter = bound_adapter(1)
    every = [a.event for fact in batch_of(records) for a in per_fact_adapter.adapt(fact)]
    assert len(folded) == 3 and len(every) == 12
    assert pressure_after(folded) == pressure_after(every) is True


class ScriptedRing:
    """A native ring that hands out the batches a test gives it, one per drain."""

    def __init__(self) -> None:
        self._batches: deque[FactBatch] = deque()
        self._filled = threading.Condition()

    def give(self, batch: FactBatch) -> None:
        with self._filled:
            self._batches.append(batch)
            self._filled.notify_all()

    def wait(self, timeout_s: float) -> bool:
        with self._filled:
            return self._filled.wait_for(lambda: bool(self._batches), timeout_s)

    def drain_batch(self, max_records: int = 512) -> FactBatch:
        with self._filled:
            return self._batches.popleft() if self._batches else batch_of([])

    def stats(self) -> SimpleNamespace:
        lane = SimpleNamespace(dropped_full=0, coalesced=0)
        return SimpleNamespace(
            terminal=lane,
            progress=lane,
            diagnostic=lane,
            unknown_kind=0,
            total_rejected=0,
            rejected_abi_version=0,
            log_messages_by_level=(),
        )


def _serve_model(
    pipeline: Pipeline, model: LogicalId, operation: LogicalId, native_operation: int
) -> None:
    """`model` loaded and serving through `operation`, bound to the engine's operation id."""
    for event_id in (
        EventId.MODEL_LOAD_REQUESTED,
        EventId.MODEL_LOAD_STARTED,
        EventId.NATIVE_MODEL_LOAD_COMPLETED,
        EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
        EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
    ):
        pipeline.submit(make_event(event_id, operation_id=operation, scope=Scope(model_id=model)))
    pipeline.submit_authority(OperationBound("engine", operation, native_operation, model))


def test_kv_flapping_batches_publish_snapshots_that_later_batches_leave_untouched() -> None:
    """Every fact a distinct transition, in drained batches of ~100: each fact's node transition
    is dispatched, and a state read between two batches still reads the same after the next
    ones (each batch updates only the copies it made itself)."""
    model, operation = LogicalId("m"), LogicalId("op-7")
    facts = 400
    kinds = [PRESSURE if n % 2 else CLEARED for n in range(1, facts + 1)]
    records = [Record(7, n, kind, category=3) for n, kind in enumerate(kinds, start=1)]
    ring = ScriptedRing()
    pipeline = Pipeline().start()
    subscription = pipeline.subscribe("test", max_queue_size=1 << 14)
    changes: list[str] = []

    def take_changes(count: int) -> None:
        while len(changes) < count:
            item = subscription.get(10.0)
            assert item is not None, "the pipeline stopped delivering"
            if item.event.id is EventId.NODE_RESOURCE_PRESSURE_CHANGED:
                assert item.event.state is not None
                changes.append(item.event.state.current)

    try:
        pipeline.submit(make_event(EventId.RUNTIME_INITIALIZED))
        _serve_model(pipeline, model, operation, 7)
        pipeline.attach_engine("engine", ring)
        ring.give(batch_of(records[:101]))
        take_changes(101)
        # The state as of the first batch (under pressure); values, not references (an update
        # in place would change a referenced object too).
        before = pipeline.state
        assert before.models[model].kv.pressure
        figures = _figures(before)
        recent = before.recent_events
        for start in range(101, facts, 100):
            ring.give(batch_of(records[start : start + 100]))
        take_changes(facts)
        after = pipeline.state
    finally:
        pipeline.detach_engine("engine")
        pipeline.shutdown()
    assert changes == ["pressure", "normal"] * (facts // 2)
    assert not after.models[model].kv.pressure and not after.node_pressure
    assert after.counters.rejected_transitions == before.counters.rejected_transitions
    assert len(after.recent_events) == MAX_RECENT_EVENTS
    assert _figures(before) == figures and before.recent_events is recent


def _figures(state: RuntimeView) -> tuple[object, ...]:
    return (
        {key: dataclasses.astuple(view) for key, view in state.models.items()},
        state.node,
        state.node_pressure,
        dataclasses.astuple(state.counters),
    )


def test_gaps_are_reported_once_per_operation_per_batch_and_all_counted() -> None:
    adapter = bound_adapter(1)
    records = [Record(1, s, EXHAUSTED, category=3) for s in (1, 2, 5, 6, 9)]
    adapted = adapter.adapt_batch(batch_of(records))
    ids = [a.event.id for a in adapted]
    assert ids.count(EventId.NATIVE_SEQUENCE_GAP_DETECTED) == 1
    assert ids.index(EventId.NATIVE_SEQUENCE_GAP_DETECTED) == 2  # just before sequence 5
    gap = adapted[2].event
    numbers = {s.key: s.value for s in gap.summaries}
    assert numbers[SummaryKey.EXPECTED_SEQUENCE] == 3
    assert numbers[SummaryKey.RECEIVED_SEQUENCE] == 5
    assert numbers[SummaryKey.COUNT] == 2
    assert adapter.counters.gaps == 2


def test_a_gap_at_a_folded_diagnostic_is_still_reported() -> None:
    adapter = bound_adapter(1)
    records = [Record(1, s, WARNING, DIAGNOSTIC_LANE, 4) for s in (1, 2, 7)]
    ids = [a.event.id for a in adapter.adapt_batch(batch_of(records))]
    assert ids == [EventId.WARNING_RAISED, EventId.NATIVE_SEQUENCE_GAP_DETECTED]


def test_unknown_kinds_and_categories_are_counted_not_adapted() -> None:
    adapter = bound_adapter(1)
    records = [
        Record(1, 1, 9999),
        Record(1, 2, PRESSURE, category=77),
        Record(1, 3, PRESSURE, 0, 3),
    ]
    adapted = adapter.adapt_batch(batch_of(records))
    assert [a.event.id for a in adapted] == [EventId.CACHE_PRESSURE_CROSSED]
    assert adapter.counters.unknown == 2
    assert adapter.counters.facts == 3


def test_an_empty_batch_adapts_to_nothing() -> None:
    adapter = NativeAdapter()
    assert adapter.adapt_batch(batch_of([])) == []
    assert adapter.counters.facts == 0


def _standing_for(adapted: AdaptedFact, facts: int) -> AdaptedFact:
    """`adapted` as the first event of a folded run of `facts` facts: with their `count`."""
    if facts == 1:
        return adapted
    event = adapted.event
    folded = dataclasses.replace(event, summaries=event.summaries + summaries(count=facts))
    return dataclasses.replace(adapted, event=folded)


def _unstamped(event: Event) -> Event:
    """The event without the clocks of the moment it was made."""
    return dataclasses.replace(event, wall_ns=0, mono_ns=0)


records_strategy = st.lists(
    st.builds(
        Record,
        operation_id=st.sampled_from([0, 1, 2, 3]),
        sequence=st.integers(0, 40),
        kind=st.sampled_from(
            [PRESSURE, CLEARED, int(abi.Kind.DEVICE_READY), EXHAUSTED, 9999]
            # Kinds whose event reads more of the record than its kind: a device, a failure
            # code, a progress.
            + [
                int(abi.Kind.MODEL_OPEN_BACKEND_DEVICE_SELECTED),
                int(abi.Kind.MODEL_OPEN_FAILED_HANDLED),
                int(abi.Kind.DEVICE_LOST),
                PROGRESS,
                int(abi.Kind.MODEL_LOAD_PHASE_CHANGED),
            ]
        ),
        lane=st.just(STATE_LANE),
        category=st.sampled_from([1, 3, 5]),
        coalesced_count=st.integers(0, 2),
        progress_unit=st.sampled_from([*abi.ProgressUnit, 77]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(first=records_strategy, second=records_strategy)
def test_without_diagnostics_the_batch_path_matches_the_per_fact_path(
    first: list[Record], second: list[Record]
) -> None:
    """Same events, evidence and counters, over two consecutive batches (tracks carry over),
    once the per-fact stream's contiguous repeats of a level state are folded as documented
    (into the run's first event, with the run's length as its `count`)."""
    per_fact, batched = bound_adapter(1, 2), bound_adapter(1, 2)
    expected: list[AdaptedFact] = []
    got: list[AdaptedFact] = []
    folded = 0
    for records in (first, second):
        batch = batch_of(records)
        ordered = sorted(batch, key=lambda f: (f.operation_id, f.sequence))
        singles: list[AdaptedFact] = []
        stands_for: dict[int, int] = {}  # a folded run's first event: how many facts it stands for
        head = -1
        previous: NativeFact | None = None
        for fact in ordered:
            adapted = per_fact.adapt(fact)
            if not adapted:
                continue  # unknown: not adapted, not part of a run
            main = adapted[-1]
            repeat = (
                previous is not None
                and fact.kind in LEVEL_STATE_KINDS
                and (previous.operation_id, previous.kind) == (fact.operation_id, fact.kind)
                and main.event.native is not None
                and main.event.native.evidence is SequenceEvidence.CONTIGUOUS
            )
            if repeat:
                # Folded into its run's first event, which then stands for one fact more.
                stands_for[head] = stands_for.get(head, 1) + 1
            else:
                singles += adapted
                head = len(singles) - 1
            folded += repeat
            previous = fact
        singles = [_standing_for(a, stands_for.get(n, 1)) for n, a in enumerate(singles)]
        many = batched.adapt_batch(batch)
        # The batch path reports one gap event per operation per batch; compare the rest.
        expected += [a for a in singles if a.event.id is not EventId.NATIVE_SEQUENCE_GAP_DETECTED]
        got += [a for a in many if a.event.id is not EventId.NATIVE_SEQUENCE_GAP_DETECTED]
    assert [_unstamped(a.event) for a in got] == [_unstamped(a.event) for a in expected]
    assert batched.counters.facts == per_fact.counters.facts
    assert batched.counters.unknown == per_fact.counters.unknown
    assert batched.counters.duplicates == per_fact.counters.duplicates
    assert batched.counters.gaps == per_fact.counters.gaps
    assert batched.counters.unbound == per_fact.counters.unbound
    assert batched.counters.coalesced == folded


def test_a_real_diagnostic_storm_is_folded_and_every_fact_accounted_for() -> None:
    """4,000 warnings through a real ring and pipeline: the warning events' counts add up to
    4,000 and the health report's `sampled` covers exactly the folded ones."""
    storm = 4000
    ring = SharedIngress.create(IngressConfig(diagnostic_capacity=8192), library=native_library())
    adapter = EngineAdapter(ring)
    adapter.operation_begin(5)
    ProducerThreads(adapter, threads=2, records_per_thread=storm // 2, kind=WARNING).join()
    assert ring.stats().diagnostic.dropped_full == 0
    pipeline = Pipeline(health_interval_s=0.05).start()
    subscription = pipeline.subscribe("test", max_queue_size=1 << 16)
    pipeline.attach_engine("engine", ring)
    represented = warning_events = sampled = 0
    try:
        while represented < storm or sampled < storm - warning_events:
            item = subscription.get(10.0)
            assert item is not None, "the pipeline stopped delivering"
            numbers = {s.key: s.value for s in item.event.summaries}
            if item.event.id is EventId.WARNING_RAISED:
                warning_events += 1
                represented += int(numbers.get(SummaryKey.COUNT, 1))
            elif item.event.id is EventId.EVENTS_SAMPLED:
                sampled += int(numbers[SummaryKey.SAMPLED])
    finally:
        pipeline.detach_engine("engine")
        pipeline.shutdown()
        adapter.operation_end()
        adapter.close()
        ring.close()
    assert represented == storm
    assert sampled == storm - warning_events
    assert warning_events < storm // 8  # folded per drained batch, not one event per fact


def test_the_batch_path_does_not_import_numpy_ma() -> None:
    """np.unique/np.isin import numpy.ma (~15 ms) at first use: inside every host's first
    model load. The batch path must stay clear of them."""
    script = (
        "import sys\n"
        "from tests.pipeline.test_native_batch import Record, batch_of, DIAGNOSTIC_LANE\n"
        "from skippyctl.pipeline.native_adapter import NativeAdapter\n"
        "records = [Record(1, n, 400 + n % 2, DIAGNOSTIC_LANE, 4) for n in range(1, 9)]\n"
        "records.append(Record(1, 20, 201, category=3))\n"
        "NativeAdapter().adapt_batch(batch_of(records))\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_records_of_another_event_abi_are_reported_as_a_schema_incompatibility() -> None:
    """A native producer built for another event ABI version writes into a real ring: the
    ring ignores its records whole and the pipeline reports them (not as a protocol breach,
    which a malformed record of this ABI is)."""
    from tests.native.helpers import emit
    from tests.native.helpers import make_event as make_raw

    ring = SharedIngress.create(IngressConfig(), library=native_library())
    adapter = EngineAdapter(ring)
    pipeline = Pipeline(health_interval_s=0.05).start()
    subscription = pipeline.subscribe("test", max_queue_size=1 << 12)
    pipeline.attach_engine("engine", ring)
    try:
        for _ in range(3):
            emit(adapter, make_raw(abi_version=2))  # a future ABI: not this schema
        emit(adapter, make_raw(struct_size=8))  # this ABI, too short: malformed
        seen: dict[EventId, int] = {}
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            item = subscription.get(0.5)
            if item is None:
                continue
            numbers = {s.key: s.value for s in item.event.summaries}
            if item.event.id in (
                EventId.EVENT_SCHEMA_INCOMPATIBILITY,
                EventId.INVARIANT_PROTOCOL_VIOLATION,
            ):
                seen[item.event.id] = int(numbers[SummaryKey.COUNT])
                assert item.event.reason_code is ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
    finally:
        pipeline.detach_engine("engine")
        pipeline.shutdown()
        adapter.close()
        ring.close()
    assert seen == {
        EventId.EVENT_SCHEMA_INCOMPATIBILITY: 3,
        EventId.INVARIANT_PROTOCOL_VIOLATION: 1,
    }
