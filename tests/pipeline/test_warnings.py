"""Structured warnings on the pipeline thread: a really lagging subscriber raises and clears
`subscriber_lagging`; malformed records refused by a real native ring become one
`invariant_protocol_violation`; llama.cpp-style log lines through the real log callback become
`native_log_summary` counts; the deriver's gate (one pair per condition, flapping suppressed,
never derived from its own output)."""

from __future__ import annotations

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Scope,
    SummaryKey,
    make_event,
    summaries,
)
from skippyctl.events.reasons import ReasonCode, WarningCode
from skippyctl.native.ingress import EngineAdapter, IngressConfig, SharedIngress
from skippyctl.native.library import native_library
from skippyctl.pipeline.dispatch import Subscription
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.pipeline.warnings import (
    RAISE_MIN_INTERVAL_S,
    SOURCE_EVENTS,
    WarningDeriver,
)
from skippyctl.reducer.state import RuntimeView
from tests.native.helpers import emit
from tests.native.helpers import make_event as raw_event

NS = 1_000_000_000
TINY = LogicalId("tiny")


def _until(subscription: Subscription, wanted: EventId, timeout_s: float = 10.0) -> Event:
    while True:
        item = subscription.get(timeout_s)
        assert item is not None, f"no {wanted.value}"
        if item.event.id is wanted:
            return item.event


def test_a_lagging_subscriber_raises_a_warning_that_clears_when_it_catches_up() -> None:
    pipeline = Pipeline(health_interval_s=0.05).start()
    watcher = pipeline.subscribe("watcher", max_queue_size=1 << 14)
    slow = pipeline.subscribe("slow", max_queue_size=64)
    try:
        for n in range(40):  # past half the slow reader's bound: lagging, not disconnected
            pipeline.submit(make_event(EventId.REQUEST_RECEIVED, operation_id=LogicalId(f"r{n}")))
        raised = _until(watcher, EventId.WARNING_RAISED)
        assert raised.state is not None and raised.state.current == "subscriber_lagging"
        assert raised.reason_code is ReasonCode.RESERVATION_EXHAUSTED
        assert raised.summary_value(SummaryKey.LAGGING_SUBSCRIBERS) == 1
        assert [w.code for w in pipeline.state.warnings.values()] == ["subscriber_lagging"]
        slow.get_many(1 << 10, 1.0)  # the reader catches up on its own thread
        cleared = _until(watcher, EventId.WARNING_CLEARED)
        assert cleared.operation_id == raised.operation_id
        assert pipeline.wait_state(lambda s: not s.warnings, 5.0) is not None
    finally:
        pipeline.shutdown()


def test_malformed_ring_records_are_reported_as_one_protocol_violation() -> None:
    ring = SharedIngress.create(IngressConfig(), library=native_library())
    adapter = EngineAdapter(ring)
    pipeline = Pipeline(health_interval_s=0.05).start()
    watcher = pipeline.subscribe("watcher", max_queue_size=1 << 14)
    pipeline.attach_engine("engine", ring, TINY)
    try:
        for _ in range(3):  # refused by the ring's validation: shorter than the ABI's base
            emit(adapter, raw_event(struct_size=8))
        violation = _until(watcher, EventId.INVARIANT_PROTOCOL_VIOLATION)
        assert violation.reason_code is ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
        assert violation.summary_value(SummaryKey.COUNT) == 3
    finally:
        pipeline.detach_engine("engine")
        pipeline.shutdown()
        adapter.close()
        ring.close()


def test_llama_log_lines_are_counted_by_level_in_a_native_log_summary() -> None:
    ring = SharedIngress.create(IngressConfig(), library=native_library())
    adapter = EngineAdapter(ring)
    callback = adapter._lib.cdll.skippy_llama_log_callback
    pipeline = Pipeline(health_interval_s=0.05).start()
    watcher = pipeline.subscribe("watcher", max_queue_size=1 << 14)
    pipeline.attach_engine("engine", ring, TINY)
    try:
        # ggml_log_level: 2 INFO, 3 WARN, 4 ERROR (the callback llama_log_set is given).
        for level in (2, 2, 3, 4, 4):
            callback(level, b"llama_model_loader: a line nobody parses\n", adapter.user_data)
        summary = _until(watcher, EventId.NATIVE_LOG_SUMMARY)
        assert summary.scope.model_id == TINY
        assert summary.summary_value(SummaryKey.COUNT) == 5
        assert summary.summary_value(SummaryKey.LOG_MESSAGES_WARN) == 1
        assert summary.summary_value(SummaryKey.LOG_MESSAGES_ERROR) == 2
    finally:
        pipeline.detach_engine("engine")
        pipeline.shutdown()
        adapter.close()
        ring.close()


def _pressure(event_id: EventId, at_s: float) -> Event:
    return _pressure_of(TINY, event_id, at_s)


def _pressure_of(model: LogicalId, event_id: EventId, at_s: float) -> Event:
    return make_event(
        event_id,
        scope=Scope(model_id=model, request_id=LogicalId("r1")),
        summaries=summaries(kv_cells_used=220, kv_cells_total=256),
        mono_ns=int(at_s * NS),
    )


def test_a_flapping_condition_costs_one_pair_per_interval() -> None:
    deriver = WarningDeriver()
    state = RuntimeView()
    out: list[Event] = []
    times = [0.0, 1.0, 2.0, 3.0, RAISE_MIN_INTERVAL_S + 1, RAISE_MIN_INTERVAL_S + 2]
    for n, at in enumerate(times):
        event_id = EventId.CACHE_PRESSURE_CROSSED if n % 2 == 0 else EventId.CACHE_PRESSURE_CLEARED
        out.extend(deriver.derive(_pressure(event_id, at), state))
    assert [e.id for e in out] == [EventId.WARNING_RAISED, EventId.WARNING_CLEARED] * 2
    assert deriver.counters.suppressed == 1
    first, second = out[0], out[2]
    assert first.scope == Scope(model_id=TINY)  # about the model, not the request
    assert first.operation_id != second.operation_id
    assert out[1].operation_id == first.operation_id


def test_an_active_condition_raises_once_and_own_output_derives_nothing() -> None:
    deriver = WarningDeriver()
    state = RuntimeView()
    raised = deriver.derive(_pressure(EventId.CACHE_PRESSURE_CROSSED, 0.0), state)
    again = deriver.derive(_pressure(EventId.CACHE_PRESSURE_CROSSED, 0.5), state)
    assert len(raised) == 1 and again == []
    assert deriver.derive(raised[0], state) == []  # no recursion
    assert raised[0].state is not None
    assert raised[0].state.current == WarningCode.KV_NEAR_FULL.value


def test_exporter_failure_raises_a_warning_and_enters_degraded_operation() -> None:
    deriver = WarningDeriver()
    state = RuntimeView()
    degraded = make_event(EventId.TELEMETRY_EXPORTER_DEGRADED, reason_code=ReasonCode.TIMEOUT)
    out = deriver.derive(degraded, state)
    assert [e.id for e in out] == [EventId.WARNING_RAISED, EventId.DEGRADED_OPERATION_ENTERED]
    assert out[0].reason_code is ReasonCode.TIMEOUT
    back = deriver.derive(make_event(EventId.TELEMETRY_EXPORTER_RECOVERED), state)
    assert [e.id for e in back] == [EventId.WARNING_CLEARED, EventId.DEGRADED_OPERATION_EXITED]


def test_the_pipeline_keeps_active_warnings_and_degraded_modes_in_state() -> None:
    pipeline = Pipeline(health_interval_s=0.05).start()
    try:
        pipeline.submit(
            make_event(EventId.TELEMETRY_EXPORTER_DEGRADED, reason_code=ReasonCode.TIMEOUT)
        )
        state = pipeline.wait_state(lambda s: bool(s.warnings) and bool(s.degraded_modes), 5.0)
        assert state is not None
        assert [w.code for w in state.warnings.values()] == ["exporter_failing"]
        assert state.degraded_modes == frozenset({"telemetry_export_down"})
        pipeline.submit(make_event(EventId.TELEMETRY_EXPORTER_RECOVERED))
        cleared = pipeline.wait_state(lambda s: not s.warnings and not s.degraded_modes, 5.0)
        assert cleared is not None
    finally:
        pipeline.shutdown()


def test_only_the_source_events_can_raise_or_clear_anything() -> None:
    """The pipeline calls the deriver for SOURCE_EVENTS only: every other id must derive
    nothing, whatever the state, or a warning would be lost."""
    deriver = WarningDeriver()
    state = RuntimeView()
    scope = Scope(model_id=LogicalId("tiny"), stage_id=LogicalId("stage-1"))
    for event_id in EventId:
        if event_id in SOURCE_EVENTS:
            continue
        event = make_event(event_id, scope=scope, summaries=summaries(link_p95_ms=90.0))
        assert deriver.derive(event, state) == [], event_id
    crossed = make_event(EventId.CACHE_PRESSURE_CROSSED, scope=scope)
    assert deriver.derive(crossed, state)  # a source does raise: the check above can fail
