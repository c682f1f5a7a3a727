"""The metrics collector and the Prometheus text of the metric table.

The collector is a subscriber like any other: it counts requests, tokens and events from the
events it is dispatched, on its own thread. If it fails it is disconnected (and counted by the
pipeline); serving never notices. `/metrics` renders every row of `metric_table.METRICS` from
one `Readings` (the collector's counters, the reduced state, the pipeline's health and, when
OTLP runs, its exporter's counters); the OTLP metric reader exports the same rows.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final, Protocol

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import SummaryKey
from skippyctl.pipeline.dispatch import (
    Dispatched,
    Dispatcher,
    SubscriberStatus,
    run_callback_subscriber,
)
from skippyctl.pipeline.pipeline import EventSystemHealth
from skippyctl.reducer.state import RuntimeView
from skippyctl.telemetry.metric_table import METRICS, CounterSnapshot, Readings
from skippyctl.telemetry.otlp import OtlpStats


class ExporterCounters(Protocol):
    """The push exporter (OTLP) as the metric table and the state document read it."""

    def stats(self) -> OtlpStats: ...


_REQUEST_TERMINALS: Final = {
    EventId.REQUEST_COMPLETED: "completed",
    EventId.REQUEST_CANCELLED: "cancelled",
    EventId.REQUEST_TIMED_OUT: "timed_out",
    EventId.REQUEST_FAILED: "failed",
    EventId.REQUEST_REJECTED: "rejected",
}


class MetricsCollector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, str, str]] = Counter()
        self._prompt_tokens: Counter[str] = Counter()
        self._generated_tokens: Counter[str] = Counter()
        self._spec_drafted: Counter[str] = Counter()
        self._spec_accepted: Counter[str] = Counter()
        self._events: Counter[str] = Counter()
        self.subscription_status = SubscriberStatus.DISCONNECTED
        self.exporter: ExporterCounters | None = None
        """The OTLP exporter when one runs: the table's exporter rows read it, and
        /api/runtime/state shows its counters under `health.telemetry_exporter`."""

    def attach(self, dispatcher: Dispatcher) -> None:
        subscription = dispatcher.subscribe("metrics", max_queue_size=8192)
        self._subscription = subscription
        run_callback_subscriber(dispatcher, subscription, self.observe, "metrics")

    @property
    def up(self) -> bool:
        subscription = getattr(self, "_subscription", None)
        return subscription is not None and subscription.status is not SubscriberStatus.DISCONNECTED

    def observe(self, item: Dispatched) -> None:
        event = item.event
        model = str(event.scope.model_id or "unknown")
        with self._lock:
            self._events[event.category.value] += 1
            outcome = _REQUEST_TERMINALS.get(event.id)
            if outcome is not None:
                reason = event.reason_code.value if event.reason_code else "none"
                self._requests[(model, outcome, reason)] += 1
            if event.id is EventId.GENERATION_COMPLETED:
                prompt = event.summary_value(SummaryKey.PROMPT_TOKENS) or 0
                generated = event.summary_value(SummaryKey.GENERATED_TOKENS) or 0
                self._prompt_tokens[model] += int(prompt)
                self._generated_tokens[model] += int(generated)
            elif event.id is EventId.SPECULATION_SUMMARIZED:
                drafted = event.summary_value(SummaryKey.SPEC_PROPOSED_TOKENS) or 0
                accepted = event.summary_value(SummaryKey.SPEC_ACCEPTED_TOKENS) or 0
                self._spec_drafted[model] += int(drafted)
                self._spec_accepted[model] += int(accepted)

    def snapshot(self) -> CounterSnapshot:
        with self._lock:
            return CounterSnapshot(
                requests=dict(self._requests),
                prompt_tokens=dict(self._prompt_tokens),
                generated_tokens=dict(self._generated_tokens),
                spec_drafted_tokens=dict(self._spec_drafted),
                spec_accepted_tokens=dict(self._spec_accepted),
                events=dict(self._events),
                collector_up=self.up,
            )

    def readings(self, state: RuntimeView, health: EventSystemHealth) -> Readings:
        exporter = self.exporter.stats() if self.exporter is not None else None
        return Readings(self.snapshot(), state, health, exporter)

    def render(self, state: RuntimeView, health: EventSystemHealth) -> str:
        """`/metrics`: the Prometheus text of every row of the table."""
        return render_prometheus(self.readings(state, health))


def _label_value(value: str) -> str:
    """Prometheus text escaping (values are bounded ids; this keeps the format valid anyway)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(readings: Readings) -> str:
    """Prometheus text exposition (0.0.4) of `METRICS`; rows whose source is absent (the
    exporter's, without OTLP) are left out."""
    lines: list[str] = []
    for metric in METRICS:
        source = readings.of(metric.source)
        if source is None:
            continue
        lines.append(f"# HELP {metric.prometheus} {metric.help}")
        lines.append(f"# TYPE {metric.prometheus} {metric.kind.value}")
        names = [label.prometheus for label in metric.labels]
        for values, value in metric.read(source):
            labels = ",".join(
                f'{name}="{_label_value(v)}"' for name, v in zip(names, values, strict=True)
            )
            selector = f"{{{labels}}}" if labels else ""
            lines.append(f"{metric.prometheus}{selector} {value}")
    return "\n".join(lines) + "\n"
