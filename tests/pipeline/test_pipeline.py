"""The pipeline thread with real threads: fan-out, lag, failure, replay, shutdown, health."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Progress, Scope, SummaryKey, make_event
from skippyctl.events.reasons import ProgressUnit, ReasonCode
from skippyctl.ingress.host import HostIngressConfig
from skippyctl.pipeline.dispatch import (
    DisconnectReason,
    SubscriberStatus,
    SubscriptionClosed,
    run_callback_subscriber,
)
from skippyctl.pipeline.pipeline import Pipeline


def _drain_until(subscription, predicate, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = subscription.get(0.1)
        if item is None:
            continue
        seen.append(item)
        if predicate(item):
            return seen
    raise AssertionError(f"not seen; got {[i.event.id for i in seen][-20:]}")


def test_events_and_transitions_reach_every_subscriber_in_order() -> None:
    pipeline = Pipeline().start()
    first = pipeline.subscribe("a")
    second = pipeline.subscribe("b")
    try:
        pipeline.submit(make_event(EventId.RUNTIME_INITIALIZED))
        for event in [EventId.WARNING_RAISED] * 3:
            pipeline.submit(make_event(event))
        for subscription in (first, second):
            seen = _drain_until(subscription, lambda i: i.event.id is EventId.WARNING_RAISED)
            sequences = [i.sequence for i in seen]
            assert sequences == sorted(sequences)
            assert seen[0].event.id is EventId.RUNTIME_INITIALIZED
            assert EventId.NODE_UNAVAILABLE in [i.event.id for i in seen]
    finally:
        pipeline.shutdown()


def test_stuck_subscriber_is_disconnected_without_slowing_others() -> None:
    pipeline = Pipeline(health_interval_s=0.05).start()
    stuck = pipeline.subscribe("stuck", max_queue_size=16)
    healthy = pipeline.subscribe("healthy", max_queue_size=100_000)
    try:
        for n in range(2000):
            scope = Scope(request_id=LogicalId(f"r{n}"))
            pipeline.submit(make_event(EventId.REQUEST_RECEIVED, scope=scope))
        # The health report says so between two pipeline cycles: before the last request
        # when the pipeline outruns this producer, after it otherwise.
        seen = _drain_until(healthy, lambda i: i.event.scope.request_id == "r1999")
        assert stuck.status is SubscriberStatus.DISCONNECTED
        assert stuck.disconnect_reason is DisconnectReason.LAG_BOUND_EXCEEDED
        if not any(i.event.id is EventId.SUBSCRIBER_DISCONNECTED for i in seen):
            _drain_until(healthy, lambda i: i.event.id is EventId.SUBSCRIBER_DISCONNECTED)
        assert pipeline.dispatcher.stats().disconnected_lag == 1
        with pytest.raises(SubscriptionClosed) as closed:
            stuck.get(0)
        assert closed.value.reason is DisconnectReason.LAG_BOUND_EXCEEDED
    finally:
        pipeline.shutdown()


def test_subscriber_that_raises_is_disconnected_and_counted() -> None:
    pipeline = Pipeline().start()
    calls = threading.Event()

    def explode(_item: object) -> None:
        calls.set()
        raise RuntimeError("subscriber bug")

    failing = pipeline.subscribe("failing")
    thread = run_callback_subscriber(pipeline.dispatcher, failing, explode, "failing")
    try:
        pipeline.submit(make_event(EventId.RUNTIME_INITIALIZED))
        assert calls.wait(5)
        thread.join(5)
        assert failing.status is SubscriberStatus.DISCONNECTED
        assert pipeline.dispatcher.stats().disconnected_failed == 1
    finally:
        pipeline.shutdown()


def test_replay_resumes_from_a_cursor_and_reports_a_gap_after_eviction() -> None:
    pipeline = Pipeline(max_replay_records=8).start()
    watcher = pipeline.subscribe("watch", max_queue_size=10_000)
    try:
        for _ in range(20):
            pipeline.submit(make_event(EventId.WARNING_RAISED))
        _drain_until(watcher, lambda i: i.sequence >= 20)
        items, gap = pipeline.dispatcher.replay_since(15)
        assert [i.sequence for i in items][0] == 16
        assert not gap
        items, gap = pipeline.dispatcher.replay_since(2)
        assert gap
        assert pipeline.dispatcher.cursor(5).startswith("rt1:")
    finally:
        pipeline.shutdown()


def test_undelivered_terminal_becomes_a_synthetic_terminal_not_delivered() -> None:
    config = HostIngressConfig(max_state_queue_size=2, terminal_reserve_size=0)
    pipeline = Pipeline(ingress_config=config)  # not started: the lane fills up
    watcher = pipeline.subscribe("watch", max_queue_size=100)
    for n in range(2):
        pipeline.submit(make_event(EventId.WARNING_RAISED, operation_id=LogicalId(f"op-{n}")))
        pipeline.submit(make_event(EventId.MODEL_LOAD_STARTED, operation_id=LogicalId(f"op-{n}")))
    lost = make_event(EventId.MODEL_LOAD_FAILED, operation_id=LogicalId("op-7"))
    pipeline.submit(lost)
    pipeline.start()
    try:
        seen = _drain_until(
            watcher, lambda i: i.event.reason_code is ReasonCode.TERMINAL_NOT_DELIVERED
        )
        synthetic = seen[-1].event
        assert synthetic.id is EventId.MODEL_LOAD_FAILED
        assert synthetic.operation_id == "op-7"
    finally:
        pipeline.shutdown()


def test_shutdown_drains_within_its_deadline_and_ends_subscriptions() -> None:
    pipeline = Pipeline().start()
    watcher = pipeline.subscribe("watch", max_queue_size=100_000)
    for _ in range(500):
        pipeline.submit(make_event(EventId.WARNING_RAISED))
    report = pipeline.shutdown(timeout_s=2.0)
    assert report.drained_in_time
    assert report.undelivered == 0
    received = 0
    while watcher.pending():
        assert watcher.get(0) is not None
        received += 1
    with pytest.raises(SubscriptionClosed) as closed:
        watcher.get(0.5)
    assert closed.value.reason is DisconnectReason.SHUTDOWN
    assert received >= 500
    assert pipeline.submit(make_event(EventId.WARNING_RAISED)).value == "rejected_shutting_down"
    assert pipeline.shutdown().drained_in_time  # idempotent


def test_health_reports_are_rate_limited_however_hard_the_pipeline_is_pushed() -> None:
    config = HostIngressConfig(max_diagnostic_queue_size=64)
    interval = 0.2
    pipeline = Pipeline(ingress_config=config, health_interval_s=interval).start()
    watcher = pipeline.subscribe("watch", max_queue_size=1_000_000)
    stop = threading.Event()

    def flood() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            pipeline.submit(make_event(EventId.WARNING_RAISED))
            pipeline.submit(
                make_event(
                    EventId.MODEL_LOAD_PROGRESS,
                    operation_id=LogicalId("op-1"),
                    progress=Progress(n, None, ProgressUnit.STEPS),
                )
            )

    producers = [threading.Thread(target=flood) for _ in range(4)]
    started = time.monotonic()
    for producer in producers:
        producer.start()
    time.sleep(1.5)
    stop.set()
    for producer in producers:
        producer.join()
    elapsed = time.monotonic() - started
    pipeline.shutdown()
    health_ids = {
        EventId.EVENTS_DROPPED_BY_CLASS,
        EventId.EVENTS_COALESCED,
        EventId.EVENTS_SAMPLED,
    }
    reports: dict[EventId, int] = {}
    try:
        while (item := watcher.get(0.2)) is not None:
            if item.event.id in health_ids:
                reports[item.event.id] = reports.get(item.event.id, 0) + 1
    except SubscriptionClosed:
        pass
    assert reports.get(EventId.EVENTS_DROPPED_BY_CLASS, 0) >= 1
    budget = int(elapsed / interval) + 3
    assert all(count <= budget for count in reports.values()), (reports, budget)
    stats = pipeline.ingress.stats()
    for lane in stats.lanes.values():
        assert (
            lane.submitted
            == lane.delivered + lane.coalesced + lane.dropped + lane.rejected + lane.pending
        )


def test_a_state_lane_that_filled_past_half_is_reported_as_ingress_pressure_once() -> None:
    config = HostIngressConfig(max_state_queue_size=16)
    pipeline = Pipeline(ingress_config=config, health_interval_s=0.05)  # not started yet
    watcher = pipeline.subscribe("watch", max_queue_size=1000)
    for n in range(12):  # a burst the pipeline has not drained: 12 of 16
        pipeline.submit(make_event(EventId.MODEL_LOAD_STARTED, operation_id=LogicalId(f"op-{n}")))
    pipeline.start()
    try:
        seen = _drain_until(watcher, lambda i: i.event.id is EventId.INGRESS_QUEUE_PRESSURE)
        pressure = seen[-1].event
        assert pressure.summary_value(SummaryKey.QUEUE_DEPTH) == 12
        assert pressure.summary_value(SummaryKey.QUEUE_CAPACITY) == 16
        time.sleep(0.3)  # several reports with the lane calm
    finally:
        pipeline.shutdown()
    later = []
    with contextlib.suppress(SubscriptionClosed):
        while (item := watcher.get(0.2)) is not None:
            later.append(item.event.id)
    assert EventId.INGRESS_QUEUE_PRESSURE not in later  # once per episode, not per report


def test_an_event_the_reducer_refuses_is_reported_as_a_reducer_error() -> None:
    pipeline = Pipeline(health_interval_s=0.05).start()
    watcher = pipeline.subscribe("watch", max_queue_size=1000)
    try:
        # A load that never began cannot start: the model moves nowhere, the refusal counts.
        pipeline.submit(
            make_event(
                EventId.MODEL_LOAD_STARTED,
                operation_id=LogicalId("op-9"),
                scope=Scope(model_id=LogicalId("nobody")),
            )
        )
        seen = _drain_until(watcher, lambda i: i.event.id is EventId.REDUCER_ERROR)
        assert seen[-1].event.summary_value(SummaryKey.REJECTED) == 1
    finally:
        pipeline.shutdown()


def test_a_runtime_that_stops_drains_then_stops_its_node() -> None:
    from skippyctl.runtime.host import RuntimeHost

    host = RuntimeHost().start()
    watcher = host.pipeline.subscribe("watch", max_queue_size=10_000, replay=True)
    host.shutdown()
    seen: list[EventId] = []
    with contextlib.suppress(SubscriptionClosed):
        while (item := watcher.get(2.0)) is not None:
            seen.append(item.event.id)
    assert seen.index(EventId.RUNTIME_STOPPING) < seen.index(EventId.NODE_DRAINING)
    assert seen.index(EventId.NODE_DRAINING) < seen.index(EventId.NODE_STOPPED)
