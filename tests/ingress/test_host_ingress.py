from __future__ import annotations

import threading

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Progress, Scope, make_event
from skippyctl.events.reasons import DeliveryClass, ProgressUnit
from skippyctl.ingress.host import HostIngress, HostIngressConfig, HostIngressStats, SubmitOutcome


def _progress(op: str, value: int) -> Event:
    return make_event(
        EventId.MODEL_LOAD_PROGRESS,
        operation_id=LogicalId(op),
        progress=Progress(value, 1000, ProgressUnit.STEPS),
    )


def _assert_conserved(stats: HostIngressStats) -> None:
    for cls, lane in stats.lanes.items():
        assert lane.submitted == (
            lane.delivered + lane.coalesced + lane.dropped + lane.rejected + lane.pending
        ), cls


def test_full_progress_lane_coalesces_instead_of_blocking() -> None:
    ingress = HostIngress()
    outcomes = [ingress.submit(_progress("op-1", value)) for value in range(1, 1001)]
    assert outcomes[0] is SubmitOutcome.ACCEPTED
    drained = ingress.drain()
    assert [e.progress.current for e in drained if e.progress] == [1000]
    stats = ingress.stats()
    assert stats.lanes[DeliveryClass.PROGRESS].coalesced == 999
    _assert_conserved(stats)


def test_progress_regressions_and_duplicates_are_suppressed_even_after_delivery() -> None:
    ingress = HostIngress()
    assert ingress.submit(_progress("op-1", 500)) is SubmitOutcome.ACCEPTED
    ingress.drain()
    assert ingress.submit(_progress("op-1", 500)) is SubmitOutcome.COALESCED
    assert ingress.submit(_progress("op-1", 100)) is SubmitOutcome.COALESCED
    assert ingress.submit(_progress("op-1", 600)) is SubmitOutcome.ACCEPTED
    assert ingress.stats().suppressed_regression == 2


def test_terminal_uses_reserve_that_state_transitions_cannot_take() -> None:
    config = HostIngressConfig(max_state_queue_size=4, terminal_reserve_size=2)
    ingress = HostIngress(config)
    for n in range(4):
        state = make_event(EventId.MODEL_LOAD_STARTED, operation_id=LogicalId(f"op-{n}"))
        assert ingress.submit(state) is SubmitOutcome.ACCEPTED
    refused = make_event(EventId.MODEL_LOAD_STARTED, operation_id=LogicalId("op-9"))
    assert ingress.submit(refused) is SubmitOutcome.DROPPED_QUEUE_FULL
    for n in range(2):
        terminal = make_event(EventId.MODEL_LOAD_FAILED, operation_id=LogicalId(f"op-{n}"))
        assert ingress.submit(terminal) is SubmitOutcome.ACCEPTED
    lost = make_event(EventId.MODEL_LOAD_FAILED, operation_id=LogicalId("op-3"))
    assert ingress.submit(lost) is SubmitOutcome.DROPPED_QUEUE_FULL
    undelivered = ingress.take_undelivered_terminals()
    assert [u.event.operation_id for u in undelivered] == ["op-3"]
    stats = ingress.stats()
    assert stats.terminal_reserve_used == 2
    _assert_conserved(stats)


def test_diagnostics_are_sampled_then_dropped_and_counted() -> None:
    config = HostIngressConfig(max_diagnostic_queue_size=100, diagnostic_sample_every=4)
    ingress = HostIngress(config)
    outcomes = [ingress.submit(make_event(EventId.WARNING_RAISED)) for _ in range(1000)]
    assert outcomes[:50] == [SubmitOutcome.ACCEPTED] * 50
    assert SubmitOutcome.DROPPED_SAMPLED in outcomes
    assert outcomes[-1] in {SubmitOutcome.DROPPED_QUEUE_FULL, SubmitOutcome.DROPPED_SAMPLED}
    stats = ingress.stats()
    lane = stats.lanes[DeliveryClass.DIAGNOSTIC]
    assert lane.pending == 100 and lane.dropped == 900
    assert stats.sampled > 0
    _assert_conserved(stats)


def test_submit_after_close_is_rejected_and_pending_stays_drainable() -> None:
    ingress = HostIngress()
    ingress.submit(make_event(EventId.RUNTIME_STOPPING))
    ingress.close()
    assert ingress.submit(make_event(EventId.RUNTIME_STOPPED)) is (
        SubmitOutcome.REJECTED_SHUTTING_DOWN
    )
    assert [e.id for e in ingress.drain()] == [EventId.RUNTIME_STOPPING]
    _assert_conserved(ingress.stats())


def test_concurrent_producers_conserve_exactly() -> None:
    ingress = HostIngress(
        HostIngressConfig(max_state_queue_size=500, max_diagnostic_queue_size=300)
    )
    threads = 8
    per_thread = 2000
    barrier = threading.Barrier(threads + 1)
    delivered: list[Event] = []
    done = threading.Event()

    def produce(n: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            kind = i % 3
            if kind == 0:
                ingress.submit(_progress(f"op-{n}", i))
            elif kind == 1:
                ingress.submit(make_event(EventId.WARNING_RAISED))
            else:
                ingress.submit(make_event(EventId.MODEL_LOAD_STARTED))

    def consume() -> None:
        while not done.is_set():
            delivered.extend(ingress.drain(256))

    workers = [threading.Thread(target=produce, args=(n,)) for n in range(threads)]
    consumer = threading.Thread(target=consume)
    for worker in workers:
        worker.start()
    consumer.start()
    barrier.wait()
    for worker in workers:
        worker.join()
    done.set()
    consumer.join()
    delivered.extend(ingress.drain(1 << 20))
    stats = ingress.stats()
    _assert_conserved(stats)
    assert sum(lane.submitted for lane in stats.lanes.values()) == threads * per_thread
    assert sum(lane.delivered for lane in stats.lanes.values()) == len(delivered)
    assert sum(lane.pending for lane in stats.lanes.values()) == 0


def _link_observed(stage: str, probes: int, topology: str = "topology-1") -> Event:
    return make_event(
        EventId.STAGE_LINK_OBSERVED,
        scope=Scope(topology_id=LogicalId(topology), stage_id=LogicalId(stage)),
        progress=Progress(probes, None, ProgressUnit.ITEMS),
    )


def test_link_figures_coalesce_per_stage_and_per_topology_not_across_them() -> None:
    ingress = HostIngress()
    # No operation once the model serves: two stages' figures are still two latest values.
    for probes in (1, 2, 3):
        ingress.submit(_link_observed("stage-a", probes))
    assert ingress.submit(_link_observed("stage-b", 1)) is SubmitOutcome.ACCEPTED
    drained = ingress.drain()
    assert [(e.scope.stage_id, e.progress.current) for e in drained if e.progress] == [
        ("stage-a", 3),
        ("stage-b", 1),
    ]
    assert ingress.submit(_link_observed("stage-a", 2)) is SubmitOutcome.COALESCED
    # The same stage in the next load's topology counts afresh.
    assert ingress.submit(_link_observed("stage-a", 1, "topology-2")) is SubmitOutcome.ACCEPTED
    _assert_conserved(ingress.stats())


def test_an_operations_last_progress_is_delivered_before_its_terminal() -> None:
    """The lanes drain state first; an operation's pending progress still comes before its own
    terminal (per-operation order), while another operation's waits its turn."""
    ingress = HostIngress()
    assert ingress.submit(_progress("op-2", 10)) is SubmitOutcome.ACCEPTED
    assert ingress.submit(_progress("op-1", 999)) is SubmitOutcome.ACCEPTED
    ended = make_event(EventId.MODEL_LOAD_CANCELLED, operation_id=LogicalId("op-1"))
    assert ingress.submit(ended) is SubmitOutcome.ACCEPTED

    drained = [(e.id, str(e.operation_id)) for e in ingress.drain()]

    assert drained == [
        (EventId.MODEL_LOAD_PROGRESS, "op-1"),
        (EventId.MODEL_LOAD_CANCELLED, "op-1"),
        (EventId.MODEL_LOAD_PROGRESS, "op-2"),
    ]
    _assert_conserved(ingress.stats())
