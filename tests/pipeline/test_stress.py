"""The stress run (benchmarks/pipeline_stress.py) as a correctness test: figures vary, the
properties must not."""

from __future__ import annotations

from benchmarks.pipeline_stress import run_stress


def test_flooded_pipeline_conserves_counts_and_keeps_state_correct() -> None:
    report = run_stress(seconds=1.5, native_threads=3, python_threads=2)
    assert report.native_conserved
    assert report.python_conserved
    assert report.burst_finished_while_gil_held
    assert report.native_dropped_diagnostic > 0  # the diagnostic lane really was full
    assert report.stuck_subscriber_status == "disconnected"
    assert report.healthy_subscriber_received == report.dispatched
    assert report.health_events <= report.health_event_budget
    assert report.final_model_state == "available"
    assert report.final_node_state == "accepting"
