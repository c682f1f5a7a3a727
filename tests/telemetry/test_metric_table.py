"""The one metric table: `/metrics` and the OTLP metric reader expose exactly its rows, with its
kinds, units, help texts, label names and the same values. The OTLP side is decoded from what a
real loopback receiver gets from the real SDK metric reader."""

from __future__ import annotations

import re
from typing import Any

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, make_event, summaries
from skippyctl.events.reasons import ReasonCode
from skippyctl.pipeline.dispatch import Dispatched, Dispatcher
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.reducer.state import (
    KvView,
    ModelState,
    ModelView,
    PluginState,
    PluginView,
    RuntimeView,
)
from skippyctl.telemetry.metric_table import METRICS, Metric, MetricKind, Source
from skippyctl.telemetry.metrics import MetricsCollector
from skippyctl.telemetry.otlp import OtlpConfig, Signal, SignalConfig
from tests.telemetry.otlp_receiver import Receiver, points
from tests.telemetry.prometheus_text import families

TINY, IDLE = LogicalId("tiny"), LogicalId("idle")


def test_every_row_has_distinct_conventional_names_and_labels() -> None:
    assert len({m.prometheus for m in METRICS}) == len(METRICS)
    assert len({m.otlp for m in METRICS}) == len(METRICS)
    for metric in METRICS:
        assert re.fullmatch(r"skippy_[a-z_]+", metric.prometheus), metric
        assert re.fullmatch(r"skippy(\.[a-z_]+)+", metric.otlp), metric
        # Prometheus: a counter's name ends in _total (a gauge's should not, but the contract
        # name skippy_kv_cells_total, a count of cells, predates this table).
        if metric.kind is MetricKind.COUNTER:
            assert metric.prometheus.endswith("_total"), metric
        for names in ([x.prometheus for x in metric.labels], [x.otlp for x in metric.labels]):
            assert len(set(names)) == len(names) and all(names), metric
        assert metric.help.endswith(".") and metric.unit


def _collector() -> MetricsCollector:
    """A collector subscribed to a real dispatcher, fed one completed request."""
    collector = MetricsCollector()
    collector.attach(Dispatcher())
    scope = Scope(model_id=TINY, request_id=LogicalId("r-1"))
    for sequence, event in enumerate(
        [
            make_event(
                EventId.GENERATION_COMPLETED,
                scope=scope,
                summaries=summaries(prompt_tokens=5, generated_tokens=7),
            ),
            make_event(EventId.REQUEST_COMPLETED, scope=scope),
            make_event(EventId.REQUEST_FAILED, scope=scope, reason_code=ReasonCode.TIMEOUT),
        ],
        start=1,
    ):
        collector.observe(Dispatched(sequence, event))
    return collector


def _state() -> RuntimeView:
    """Two models, one with every KV figure and a serving plugin, so every state row has
    samples."""
    plugin = PluginView(
        LogicalId("ngram"), PluginState.SERVING, failures=1, delivered=12, dropped=2, late=3
    )
    return RuntimeView(
        models={
            TINY: ModelView(
                TINY,
                ModelState.AVAILABLE,
                kv=KvView(cells_total=256, cells_used=40),
                plugins=(plugin,),
            ),
            IDLE: ModelView(IDLE, ModelState.LOADING),
        }
    )


def _prometheus_samples(metric: Metric[Any], text: str) -> set[tuple[tuple[str, str], ...]]:
    """A row's samples in `/metrics`, as sorted (OTLP label name, value) pairs plus the value."""
    by_name = {label.prometheus: label.otlp for label in metric.labels}
    return {
        (*sorted((by_name[k], v) for k, v in labels.items()), ("=", str(value)))
        for labels, value in families(text)[metric.prometheus].samples
    }


def _otlp_samples(points_: list[tuple[dict[str, Any], float]]) -> set[tuple[tuple[str, str], ...]]:
    return {
        (*sorted((k, str(v)) for k, v in attributes.items()), ("=", str(value)))
        for attributes, value in points_
    }


def test_prometheus_and_otlp_expose_exactly_the_table_with_the_same_values(
    receiver: Receiver,
) -> None:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    collector, state, pipeline = _collector(), _state(), Pipeline()
    metrics = SignalConfig(Signal.METRICS, f"{receiver.url}/v1/metrics", receiver.url, 1.0)
    telemetry = OtlpTelemetry(
        OtlpConfig(signals=(metrics,), metric_export_interval_millis=50),
        submit=lambda _e: None,
        collector=collector,
        state=lambda: state,
        health=pipeline.health,
    )
    collector.exporter = telemetry
    try:
        receiver.wait_for(lambda r: len(r.metric_names()) == len(METRICS))
        text = collector.render(state, pipeline.health())
    finally:
        assert telemetry.shutdown(5000)

    prometheus = families(text)
    assert list(prometheus) == [m.prometheus for m in METRICS]  # every row, in table order
    exported = {m.name: m for m in receiver.metrics()}  # the latest export of each
    assert set(exported) == {m.otlp for m in METRICS}
    for metric in METRICS:
        family, otlp = prometheus[metric.prometheus], exported[metric.otlp]
        assert (family.kind, family.help) == (metric.kind.value, metric.help)
        assert (otlp.unit, otlp.description) == (metric.unit, metric.help)
        if metric.kind is MetricKind.COUNTER:
            assert otlp.HasField("sum") and otlp.sum.is_monotonic, metric.otlp
        else:
            assert otlp.HasField("gauge"), metric.otlp
        assert family.samples, metric.prometheus
        labels = [label.prometheus for label in metric.labels]
        assert all(list(sample) == labels for sample, _ in family.samples), metric.prometheus
        attributes = {label.otlp for label in metric.labels}
        assert all(set(a) == attributes for a, _ in points(otlp)), metric.otlp
        if metric.source is not Source.EXPORTER:  # the exporter's own counts move as it exports
            assert _prometheus_samples(metric, text) == _otlp_samples(points(otlp)), metric.otlp
    requests = families(text)["skippy_requests_total"].samples
    assert requests == [
        ({"model": "tiny", "outcome": "completed", "reason": "none"}, 1.0),
        ({"model": "tiny", "outcome": "failed", "reason": "timeout"}, 1.0),
    ]
    assert ({"model_id": "tiny"}, 7.0) in receiver.metric_points("skippy.generated_tokens")
    assert ({"model_id": "tiny"}, 40.0) in receiver.metric_points("skippy.kv.cells_used")
    assert ({"model_id": "idle", "state": "loading"}, 0.0) in receiver.metric_points(
        "skippy.model.up"
    )
    # a plugin's counters, by result and by discard reason (late is deadline_exceeded)
    messages = families(text)["skippy_plugin_messages_total"].samples
    assert ({"model": "tiny", "plugin": "ngram", "result": "dropped"}, 2.0) in messages
    discarded = families(text)["skippy_plugin_discarded_proposals_total"].samples
    assert ({"model": "tiny", "plugin": "ngram", "reason": "deadline_exceeded"}, 3.0) in discarded
    assert len(discarded) == 5
    failures = families(text)["skippy_plugin_failures_total"].samples
    assert failures == [({"model": "tiny", "plugin": "ngram"}, 1.0)]


def test_without_an_exporter_metrics_leaves_out_only_the_exporter_rows() -> None:
    pipeline = Pipeline()
    text = _collector().render(_state(), pipeline.health())
    assert list(families(text)) == [
        m.prometheus for m in METRICS if m.source is not Source.EXPORTER
    ]
    assert "skippy_otlp" not in text
    up = families(text)["skippy_metrics_collector_up"].samples
    assert up == [({}, 1.0)]
    assert families(MetricsCollector().render(RuntimeView(), pipeline.health()))[
        "skippy_metrics_collector_up"
    ].samples == [({}, 0.0)]  # never attached: not receiving
