"""Stress run of the whole event pipeline: native and Python producers at once, a deliberately
stuck subscriber, a saturated diagnostic lane. Prints a table and a JSON summary.

    .venv/bin/python -m benchmarks.pipeline_stress [--seconds 3] [--native-threads 4]
        [--python-threads 4]

What it shows: native producers never wait (per-emit latency, and a burst that completes while
a Python thread holds the GIL), every counter conserves exactly, the stuck subscriber is cut off
without slowing anyone, health reports stay rate-limited, and the reduced state is still right.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import asdict, dataclass

import orjson

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Progress, Scope, make_event, summaries
from skippyctl.events.reasons import DeliveryClass, ProgressUnit
from skippyctl.native.abi import Kind, TestProducerMode
from skippyctl.native.ingress import EngineAdapter, ProducerThreads, SharedIngress
from skippyctl.native.library import load_native_library
from skippyctl.pipeline.dispatch import SubscriberStatus, SubscriptionClosed
from skippyctl.pipeline.pipeline import HEALTH_REPORTS, Pipeline
from skippyctl.reducer.state import ModelState, NodeState

MODEL = LogicalId("stress-model")
HEALTH_INTERVAL_S = 0.25


@dataclass(frozen=True)
class StressReport:
    seconds: float
    native_threads: int
    python_threads: int
    native_attempts: int
    native_emit_p50_ns: int
    native_emit_p99_ns: int
    native_emit_max_ns: int
    native_facts_drained: int
    native_facts_per_s: float
    native_dropped_terminal: int
    native_dropped_progress: int
    native_dropped_diagnostic: int
    native_coalesced: int
    native_conserved: bool
    burst_finished_while_gil_held: bool
    python_submitted: int
    python_delivered: int
    python_coalesced: int
    python_dropped: int
    python_conserved: bool
    dispatched: int
    healthy_subscriber_received: int
    stuck_subscriber_status: str
    health_events: int
    health_event_budget: int
    reducer_rejections: int
    final_model_state: str
    final_node_state: str


def run_stress(seconds: float, native_threads: int, python_threads: int) -> StressReport:
    lib = load_native_library()
    ring = SharedIngress.create(library=lib)
    adapter = EngineAdapter(ring)
    pipeline = Pipeline(health_interval_s=HEALTH_INTERVAL_S).start()
    pipeline.attach_engine("stress", ring)
    healthy = pipeline.subscribe("healthy", max_queue_size=1 << 22)
    stuck = pipeline.subscribe("stuck", max_queue_size=256)
    received = 0
    health_counts: dict[EventId, int] = {}

    def consume() -> None:
        nonlocal received
        while True:
            try:
                item = healthy.get(0.2)
            except SubscriptionClosed:
                return
            if item is not None:
                received += 1
                if item.event.id in HEALTH_REPORTS:
                    health_counts[item.event.id] = health_counts.get(item.event.id, 0) + 1

    consumer = threading.Thread(target=consume, name="stress-consumer")
    consumer.start()

    op = LogicalId("load-stress")
    scope = Scope(model_id=MODEL)
    pipeline.submit(make_event(EventId.RUNTIME_INITIALIZED))
    pipeline.submit(make_event(EventId.MODEL_LOAD_REQUESTED, operation_id=op, scope=scope))
    pipeline.submit(make_event(EventId.MODEL_LOAD_STARTED, operation_id=op, scope=scope))

    stop = threading.Event()

    def python_producer(n: int) -> None:
        value = 0
        while not stop.is_set():
            value += 1
            request = Scope(model_id=MODEL, request_id=LogicalId(f"r{n}-{value % 50}"))
            pipeline.submit(make_event(EventId.WARNING_RAISED, scope=scope))
            pipeline.submit(
                make_event(
                    EventId.MODEL_LOAD_PROGRESS,
                    operation_id=op,
                    scope=scope,
                    progress=Progress(value, None, ProgressUnit.STEPS),
                )
            )
            pipeline.submit(make_event(EventId.REQUEST_RECEIVED, scope=request))
            pipeline.submit(make_event(EventId.REQUEST_COMPLETED, scope=request))

    per_kind = max(1, native_threads // 3)
    producers = [
        ProducerThreads(adapter, threads=per_kind, records_per_thread=0,
                        kind=Kind.DIAGNOSTIC_WARNING_RAISED),
        ProducerThreads(adapter, threads=per_kind, records_per_thread=0,
                        kind=Kind.MODEL_OPEN_PROGRESS, mode=TestProducerMode.PROGRESS_PER_THREAD),
        ProducerThreads(adapter, threads=max(1, native_threads - 2 * per_kind),
                        records_per_thread=0, kind=Kind.MODEL_OPEN_STARTED),
    ]  # fmt: skip
    python = [
        threading.Thread(target=python_producer, args=(n,), name=f"stress-python-{n}")
        for n in range(python_threads)
    ]
    started = time.monotonic()
    for thread in python:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for producer in producers:
        producer.stop()
    reports = [producer.join() for producer in producers]
    for thread in python:
        thread.join()

    burst = ProducerThreads(adapter, threads=2, records_per_thread=200_000,
                            kind=Kind.DIAGNOSTIC_WARNING_RAISED)  # fmt: skip
    finished_under_gil = burst.hold_gil_until_done(10.0)
    burst.join()
    elapsed = time.monotonic() - started

    # Let the backlog drain first: under this flood the state lane is full, and a terminal
    # submitted now would (correctly) become a synthetic `terminal_not_delivered` failure.
    deadline = time.monotonic() + 30
    while pipeline.ingress.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    pipeline.submit(make_event(EventId.NATIVE_MODEL_LOAD_COMPLETED, operation_id=op, scope=scope))
    pipeline.submit(
        make_event(
            EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
            operation_id=op,
            scope=scope,
            summaries=summaries(context_tokens=512),
        )
    )
    pipeline.wait_state(lambda s: s.models.get(MODEL) is not None and
                        s.models[MODEL].state is ModelState.AVAILABLE, 10.0)  # fmt: skip
    pipeline.detach_engine("stress")
    final = pipeline.state
    pipeline.shutdown(timeout_s=5.0)
    consumer.join(10)

    stats = ring.stats()
    lanes = (stats.terminal, stats.progress, stats.diagnostic)
    native_conserved = (
        all(lane.accepted == lane.drained + lane.dropped_full + lane.coalesced for lane in lanes)
        and pipeline.adapter.counters.facts == stats.total_drained
    )
    host = pipeline.ingress.stats()
    python_conserved = all(
        c.submitted == c.delivered + c.coalesced + c.dropped + c.rejected + c.pending
        for c in host.lanes.values()
    )
    adapter.close()
    ring.close()
    attempts = sum(r.records_attempted for r in reports)
    return StressReport(
        seconds=round(elapsed, 3),
        native_threads=native_threads,
        python_threads=python_threads,
        native_attempts=attempts,
        native_emit_p50_ns=max(r.latency_p50_ns for r in reports),
        native_emit_p99_ns=max(r.latency_p99_ns for r in reports),
        native_emit_max_ns=max(r.latency_max_ns for r in reports),
        native_facts_drained=stats.total_drained,
        native_facts_per_s=round(stats.total_drained / elapsed, 1),
        native_dropped_terminal=stats.terminal.dropped_full,
        native_dropped_progress=stats.progress.dropped_full,
        native_dropped_diagnostic=stats.diagnostic.dropped_full,
        native_coalesced=sum(lane.coalesced for lane in lanes),
        native_conserved=native_conserved,
        burst_finished_while_gil_held=finished_under_gil,
        python_submitted=host.total("submitted"),
        python_delivered=host.total("delivered"),
        python_coalesced=host.total("coalesced"),
        python_dropped=host.lanes[DeliveryClass.DIAGNOSTIC].dropped
        + host.lanes[DeliveryClass.PROGRESS].dropped
        + host.lanes[DeliveryClass.STATE_TRANSITION].dropped
        + host.lanes[DeliveryClass.TERMINAL].dropped,
        python_conserved=python_conserved,
        dispatched=pipeline.dispatcher.stats().dispatched,
        healthy_subscriber_received=received,
        stuck_subscriber_status=stuck.status.value,
        health_events=max(health_counts.values(), default=0),
        health_event_budget=int(elapsed / HEALTH_INTERVAL_S) + 3,
        reducer_rejections=final.counters.rejected_transitions,
        final_model_state=final.models[MODEL].state.value if MODEL in final.models else "absent",
        final_node_state=final.node.value,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--native-threads", type=int, default=4)
    parser.add_argument("--python-threads", type=int, default=4)
    args = parser.parse_args(argv)
    report = run_stress(args.seconds, args.native_threads, args.python_threads)
    width = max(len(name) for name in asdict(report))
    for name, value in asdict(report).items():
        sys.stderr.write(f"{name:<{width}}  {value}\n")
    sys.stdout.write(orjson.dumps(asdict(report)).decode() + "\n")
    ok = (
        report.native_conserved
        and report.python_conserved
        and report.burst_finished_while_gil_held
        and report.stuck_subscriber_status == SubscriberStatus.DISCONNECTED.value
        and report.final_model_state == ModelState.AVAILABLE.value
        and report.final_node_state == NodeState.ACCEPTING.value
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
