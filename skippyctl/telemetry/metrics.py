"""Prometheus metrics as an optional consumer of the event stream.

The collector is a subscriber like any other: it counts requests, tokens and rejections from
events on its own thread. If it fails it is disconnected (and counted by the pipeline); serving
never notices. `/metrics` renders the counters plus gauges read from the reduced state. Labels
carry only bounded values: model ids, outcomes, reason codes, delivery classes.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import SummaryKey
from skippyctl.pipeline.dispatch import (
    Dispatched,
    Dispatcher,
    SubscriberStatus,
    run_callback_subscriber,
)
from skippyctl.pipeline.pipeline import EventSystemHealth
from skippyctl.reducer.state import RuntimeView, lanes_in_use, queue_depth

if TYPE_CHECKING:  # only a type here: no exporter configured, nothing of it imported
    from skippyctl.telemetry.otlp_export import OtlpTelemetry


class _StatsRecord(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class PushExporter(Protocol):
    """A push exporter whose counters the API shows under `telemetry_exporter` and /metrics
    renders as `skippy_telemetry_*`: `as_dict()` has at least `degraded`, `exported`, `batches`,
    `failures` {kind: n}, `dropped` {reason: n}, `pending`, `in_flight`."""

    def stats(self) -> _StatsRecord: ...


@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    """A copy of the collector's counters (for the OTLP metric callbacks)."""

    requests: dict[tuple[str, str, str], int]
    """(model, outcome, reason) → requests."""
    prompt_tokens: dict[str, int]
    generated_tokens: dict[str, int]
    events: dict[str, int]
    """category → events."""


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
        self._events: Counter[str] = Counter()
        self.subscription_status = SubscriberStatus.DISCONNECTED
        self.exporter: PushExporter | None = None
        """The push exporter when one is configured (NDJSON if set, else OTLP): its counters
        are rendered too and /api/runtime/state shows them under `telemetry_exporter`."""
        self.otlp: OtlpTelemetry | None = None
        """The OTLP exporter when configured: per-signal counters as `skippy_otlp_*`."""

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

    def snapshot(self) -> CounterSnapshot:
        with self._lock:
            return CounterSnapshot(
                requests=dict(self._requests),
                prompt_tokens=dict(self._prompt_tokens),
                generated_tokens=dict(self._generated_tokens),
                events=dict(self._events),
            )

    def render(self, state: RuntimeView, health: EventSystemHealth) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{labels} {value}")

        with self._lock:
            requests = sorted(self._requests.items())
            prompt = sorted(self._prompt_tokens.items())
            generated = sorted(self._generated_tokens.items())
            events = sorted(self._events.items())
        metric(
            "skippy_requests_total",
            "counter",
            "Requests by model, outcome and reason code.",
            [
                (f'{{model="{m}",outcome="{o}",reason="{r}"}}', float(n))
                for (m, o, r), n in requests
            ],
        )
        metric(
            "skippy_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            [(f'{{model="{m}"}}', float(n)) for m, n in prompt],
        )
        metric(
            "skippy_generated_tokens_total",
            "counter",
            "Tokens generated.",
            [(f'{{model="{m}"}}', float(n)) for m, n in generated],
        )
        metric(
            "skippy_events_total",
            "counter",
            "Events dispatched, by category.",
            [(f'{{category="{c}"}}', float(n)) for c, n in events],
        )
        models = list(state.models.values())
        metric(
            "skippy_model_up",
            "gauge",
            "1 when the model serves (available or degraded).",
            [
                (
                    f'{{model="{m.model_id}",state="{m.state.value}"}}',
                    1.0 if m.state.value in ("available", "degraded") else 0.0,
                )
                for m in models
            ],
        )
        metric(
            "skippy_queue_depth",
            "gauge",
            "Requests waiting for a lane.",
            [(f'{{model="{m.model_id}"}}', float(queue_depth(state, m.model_id))) for m in models],
        )
        metric(
            "skippy_lanes_in_use",
            "gauge",
            "Lanes decoding or prefilling.",
            [(f'{{model="{m.model_id}"}}', float(lanes_in_use(state, m.model_id))) for m in models],
        )
        metric(
            "skippy_kv_cells_used",
            "gauge",
            "KV cells in use at the last report.",
            [
                (f'{{model="{m.model_id}"}}', float(m.kv.cells_used))
                for m in models
                if m.kv.cells_used is not None
            ],
        )
        metric(
            "skippy_kv_cells_total",
            "gauge",
            "KV cells available.",
            [
                (f'{{model="{m.model_id}"}}', float(m.kv.cells_total))
                for m in models
                if m.kv.cells_total is not None
            ],
        )
        drops = [
            (f'{{class="{cls.value}"}}', float(lane.dropped))
            for cls, lane in health.host_ingress.lanes.items()
        ]
        drops.append(('{class="native"}', float(health.native_dropped)))
        metric(
            "skippy_events_dropped_total", "counter", "Events dropped, by delivery class.", drops
        )
        metric(
            "skippy_events_coalesced_total",
            "counter",
            "Progress values coalesced.",
            [("", float(health.host_ingress.total("coalesced") + health.native_coalesced))],
        )
        metric(
            "skippy_subscribers_disconnected_total",
            "counter",
            "Subscribers cut off.",
            [
                (
                    "",
                    float(
                        health.dispatcher.disconnected_lag + health.dispatcher.disconnected_failed
                    ),
                )
            ],
        )
        metric(
            "skippy_metrics_collector_up",
            "gauge",
            "1 while this collector receives events.",
            [("", 1.0 if self.up else 0.0)],
        )
        if self.exporter is not None:
            exporter = self.exporter.stats().as_dict()
            metric(
                "skippy_telemetry_exported_events_total",
                "counter",
                "Events the telemetry exporter delivered to its collector.",
                [("", float(exporter["exported"]))],
            )
            metric(
                "skippy_telemetry_export_batches_total",
                "counter",
                "Batches the telemetry exporter delivered.",
                [("", float(exporter["batches"]))],
            )
            metric(
                "skippy_telemetry_export_failures_total",
                "counter",
                "Failed export attempts, by kind (timeout, connection, http_status).",
                [(f'{{kind="{k}"}}', float(n)) for k, n in exporter["failures"].items()],
            )
            metric(
                "skippy_telemetry_dropped_events_total",
                "counter",
                "Events the telemetry exporter dropped, by reason.",
                [(f'{{reason="{r}"}}', float(n)) for r, n in exporter["dropped"].items()],
            )
            metric(
                "skippy_telemetry_queue_events",
                "gauge",
                "Events buffered for export.",
                [("", float(exporter["pending"] + exporter["in_flight"]))],
            )
            metric(
                "skippy_telemetry_exporter_degraded",
                "gauge",
                "1 while the telemetry exporter's last attempt failed.",
                [("", 1.0 if exporter["degraded"] else 0.0)],
            )
        if self.otlp is not None:
            otlp = self.otlp.stats()
            metric(
                "skippy_otlp_exported_total",
                "counter",
                "Items the OTLP exporter delivered, by signal (log records, spans, points).",
                [(f'{{signal="{s.signal.value}"}}', float(s.exported)) for s in otlp.signals],
            )
            metric(
                "skippy_otlp_export_failures_total",
                "counter",
                "Failed OTLP export attempts, by signal and kind.",
                [
                    (f'{{signal="{s.signal.value}",kind="{k.value}"}}', float(n))
                    for s in otlp.signals
                    for k, n in s.failures.items()
                ],
            )
            metric(
                "skippy_otlp_dropped_total",
                "counter",
                "Items the OTLP exporter dropped, by signal and reason.",
                [
                    (f'{{signal="{s.signal.value}",reason="{r.value}"}}', float(n))
                    for s in otlp.signals
                    for r, n in s.dropped.items()
                ],
            )
            metric(
                "skippy_otlp_queue_items",
                "gauge",
                "Items queued or in flight in the OTLP exporter, by signal.",
                [
                    (f'{{signal="{s.signal.value}"}}', float(s.pending + s.in_flight))
                    for s in otlp.signals
                ],
            )
            metric(
                "skippy_otlp_spans_evicted_total",
                "counter",
                "Request span trees ended early because too many were open.",
                [("", float(otlp.spans.evicted))],
            )
            metric(
                "skippy_otlp_exporter_degraded",
                "gauge",
                "1 while the latest export of some OTLP signal failed.",
                [("", 1.0 if otlp.degraded else 0.0)],
            )
        return "\n".join(lines) + "\n"
