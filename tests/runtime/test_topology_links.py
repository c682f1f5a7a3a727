"""A topology's link judgement (runtime/topology_links.py, through runtime/topology.py):
thresholds, hysteresis, the figures in the events, connection events. No stage or engine runs:
the topology is told what an engine would report."""

from __future__ import annotations

from skippyctl.config.endpoints import Endpoint
from skippyctl.engine.protocol_messages import Link
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.runtime import topology as topo
from skippyctl.runtime.topology_links import LINK_REPORT_INTERVAL_S
from skippyctl.runtime.topology_stages import TopologyStage


def _topology(
    threshold_ms: float = 50.0, report_interval_s: float = LINK_REPORT_INTERVAL_S
) -> tuple[topo.Topology, list[Event]]:
    events: list[Event] = []
    topology = topo.Topology(
        LogicalId("topology-1"),
        LogicalId("tiny"),
        LogicalId("load-1"),
        events.append,
        link_p95_threshold_ms=threshold_ms,
        link_report_interval_s=report_interval_s,
    )
    for port in (1, 2):
        endpoint = Endpoint("127.0.0.1", port)
        topology._stages.append(TopologyStage(endpoint, LogicalId(f"stage-{port}"), port - 1))
    return topology, events


def _link(stage: int, p95: float) -> Link:
    return Link(stage=stage, rtt_ms=p95 / 2, p95_ms=p95, jitter_ms=1.0, samples=3)


def _ids(events: list[Event]) -> list[tuple[EventId, int | None]]:
    """The transitions among the events (every figure's own report left out)."""
    return [(e.id, e.scope.stage_index) for e in events if e.id is not EventId.STAGE_LINK_OBSERVED]


def test_the_load_reports_each_stage_ready_and_connected_with_its_first_figures() -> None:
    topology, events = _topology()
    topology.engine_link(_link(0, 2.0))
    topology.engine_link(_link(1, 80.0))
    assert [(e.id, e.scope.stage_index) for e in events] == [
        (EventId.STAGE_LINK_OBSERVED, 0),
        (EventId.STAGE_LINK_OBSERVED, 1),
    ]
    events.clear()
    topology.engine_loaded(True)
    assert _ids(events) == [
        (EventId.STAGE_READY, 0),
        (EventId.DOWNSTREAM_CONNECTION_ESTABLISHED, 0),
        (EventId.STAGE_READY, 1),
        (EventId.DOWNSTREAM_CONNECTION_ESTABLISHED, 1),
    ]
    assert events[1].summary_value(SummaryKey.LINK_P95_MS) == 2.0
    assert events[3].summary_value(SummaryKey.LINK_RTT_MS) == 40.0
    events.clear()
    topology.engine_serving(True)  # figures that came before the context are judged now
    assert _ids(events) == [
        (EventId.TOPOLOGY_READY, None),
        (EventId.STAGE_DEGRADED, 1),
        (EventId.TOPOLOGY_DEGRADED, None),
    ]
    degraded = events[1]
    assert degraded.summary_value(SummaryKey.LINK_P95_MS) == 80.0
    assert degraded.summary_value(SummaryKey.LINK_JITTER_MS) == 1.0
    assert degraded.summary_value(SummaryKey.LINK_P95_THRESHOLD_MS) == 50.0
    assert degraded.operation_id is None  # the load is over


def test_a_degraded_link_recovers_only_below_the_hysteresis_mark() -> None:
    topology, events = _topology(threshold_ms=50.0)
    topology.engine_loaded(True)
    topology.engine_serving(True)
    events.clear()
    topology.engine_link(_link(0, 60.0))
    topology.engine_link(_link(0, 70.0))  # still above: no repeat
    topology.engine_link(_link(0, 45.0))  # below the threshold, above 0.8 x it: still degraded
    assert _ids(events) == [(EventId.STAGE_DEGRADED, 0), (EventId.TOPOLOGY_DEGRADED, None)]
    topology.engine_link(_link(1, 90.0))  # a second slow stage: the topology is degraded already
    topology.engine_link(_link(0, 39.0))
    assert _ids(events)[2:] == [(EventId.STAGE_DEGRADED, 1), (EventId.STAGE_READY, 0)]
    assert events[-1].summary_value(SummaryKey.LINK_P95_MS) == 39.0
    topology.engine_link(_link(1, 10.0))  # the last slow stage recovers: so does the topology
    assert _ids(events)[4:] == [(EventId.STAGE_READY, 1), (EventId.TOPOLOGY_READY, None)]


def test_links_are_not_judged_before_the_model_serves_or_after_it_ended() -> None:
    topology, events = _topology(threshold_ms=10.0)
    topology.engine_link(_link(1, 500.0))
    assert [e.id for e in events] == [EventId.STAGE_LINK_OBSERVED]  # reported, not judged
    assert topology.links()[1] == _link(1, 500.0)
    topology.engine_link(Link(stage=7, rtt_ms=1.0, p95_ms=1.0, jitter_ms=0.0))  # ignored
    topology.close()
    events.clear()
    topology.engine_link(_link(1, 900.0))
    assert events == []  # ended: neither judged nor reported


def test_a_high_threshold_never_degrades() -> None:
    topology, events = _topology(threshold_ms=60_000.0)
    topology.engine_loaded(True)
    topology.engine_serving(True)
    for p95 in (1.0, 500.0, 5_000.0):
        topology.engine_link(_link(1, p95))
    assert EventId.STAGE_DEGRADED not in [e.id for e in events]


def test_figures_are_reported_per_stage_with_a_growing_probe_count() -> None:
    topology, events = _topology(threshold_ms=50.0, report_interval_s=0.0)
    topology.engine_link(_link(0, 2.0))  # during the load: under its operation
    topology.engine_loaded(True)
    topology.engine_serving(True)
    events.clear()
    topology.engine_link(_link(0, 3.0))
    topology.engine_link(_link(1, 4.0))
    topology.engine_link(_link(0, 5.0))
    observed = [e for e in events if e.id is EventId.STAGE_LINK_OBSERVED]
    assert [
        (e.scope.stage_index, e.progress.current if e.progress else None) for e in observed
    ] == [
        (0, 2),
        (1, 1),
        (0, 3),
    ]
    assert [e.summary_value(SummaryKey.LINK_P95_MS) for e in observed] == [3.0, 4.0, 5.0]
    assert all(e.operation_id is None and e.scope.stage_id for e in observed)
    assert [e.id for e in events if e.id is not EventId.STAGE_LINK_OBSERVED] == []


def test_the_first_figures_arrive_under_the_load_s_operation() -> None:
    topology, events = _topology()
    topology.engine_link(_link(1, 2.0))
    assert [(e.id, e.operation_id) for e in events] == [
        (EventId.STAGE_LINK_OBSERVED, LogicalId("load-1"))
    ]


def test_a_stage_s_figures_are_reported_at_once_then_at_most_every_interval() -> None:
    topology, events = _topology(report_interval_s=3600.0)
    for p95 in (2.0, 3.0, 4.0):
        topology.engine_link(_link(0, p95))
    topology.engine_link(_link(1, 9.0))
    observed = [e for e in events if e.id is EventId.STAGE_LINK_OBSERVED]
    assert [(e.scope.stage_index, e.summary_value(SummaryKey.LINK_P95_MS)) for e in observed] == [
        (0, 2.0),
        (1, 9.0),
    ]
    assert topology.links()[0] == _link(0, 4.0)  # kept for judging all the same


def test_a_degraded_link_is_a_structured_warning_until_the_stage_is_ready_again() -> None:
    """The topology's judgement through a real pipeline: `stage_degraded` raises
    `stage_link_degraded` about that stage, its `stage_ready` clears it. (The engine's `link`
    figures are given, as in the tests above: a real slow link is `stage relay`'s business.)"""
    from skippyctl.pipeline.pipeline import Pipeline

    pipeline = Pipeline(health_interval_s=0.05).start()
    watcher = pipeline.subscribe("watcher", max_queue_size=1 << 12)
    try:
        topology = topo.Topology(
            LogicalId("topology-1"),
            LogicalId("tiny"),
            LogicalId("load-1"),
            pipeline.submit,
            link_p95_threshold_ms=50.0,
        )
        endpoint = Endpoint("127.0.0.1", 1)
        topology._stages.append(TopologyStage(endpoint, LogicalId("stage-1"), 0))
        topology.engine_loaded(True)
        topology.engine_serving(True)
        topology.engine_link(_link(0, 80.0))
        topology.engine_link(_link(0, 10.0))
        seen: list[Event] = []
        while len([e for e in seen if e.id is EventId.WARNING_CLEARED]) < 1:
            item = watcher.get(5.0)
            assert item is not None, [e.id for e in seen]
            seen.append(item.event)
        raised, cleared = (
            e for e in seen if e.id in (EventId.WARNING_RAISED, EventId.WARNING_CLEARED)
        )
        assert raised.state is not None and raised.state.current == "stage_link_degraded"
        assert raised.scope.stage_id == LogicalId("stage-1")
        assert raised.summary_value(SummaryKey.LINK_P95_MS) == 80.0
        assert raised.reason_code is not None and raised.reason_code.value == "timeout"
        assert cleared.operation_id == raised.operation_id
    finally:
        pipeline.shutdown()
