"""The one metric table: every metric the runtime exposes, read by both exporters.

`/metrics` (Prometheus text: `telemetry.metrics.render_prometheus`) and the OTLP metric reader
(`telemetry.otlp_metrics.install_instruments`) both iterate `METRICS`, so a row added here
appears in both, with the same help text, kind, labels and values. A row states:

- its name in each exporter: `prometheus` (`skippy_…`, `_total` on counters) and `otlp`
  (`skippy.…`); both are contracts, so neither is derived from the other;
- its kind (a counter only grows; a gauge is a current value), its unit (UCUM, as OTLP carries
  it), its help text;
- its labels, each with its Prometheus and its OTLP attribute name (`model` / `model_id`);
- its source and how its samples are read from it: the collector's event counters
  (`CounterSnapshot`), the reduced state (`RuntimeView`), the pipeline's health
  (`EventSystemHealth`) or the OTLP exporter's own counters (`OtlpStats`). Rows read from the
  exporter exist only while it runs: without OTLP, `/metrics` leaves them out.

A reader yields `(label values, value)` in the order of the row's labels, sorted, so a scrape
reads the same twice. Label values are bounded: model ids, serving plugin ids, outcomes, reason
codes, event categories, delivery classes, signals, failure kinds — never text, paths or
credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from skippyctl.reducer.state import SERVING_MODEL_STATES, RuntimeView, lanes_in_use, queue_depth

if TYPE_CHECKING:  # types only: reading a source needs no pipeline or exporter import
    from skippyctl.pipeline.pipeline import EventSystemHealth
    from skippyctl.telemetry.otlp import OtlpStats


class MetricKind(StrEnum):
    """The Prometheus `# TYPE`; OTLP: an observable counter (monotonic sum) or gauge."""

    COUNTER = "counter"
    GAUGE = "gauge"


class Source(StrEnum):
    """Where a row's samples are read from."""

    COLLECTOR = "collector"
    """`CounterSnapshot`: what `MetricsCollector` counted from the events it was dispatched."""
    STATE = "state"
    """`RuntimeView`: the reduced state published last."""
    PIPELINE = "pipeline"
    """`EventSystemHealth`: the event system's own counters (ingress, native ring, dispatcher)."""
    EXPORTER = "exporter"
    """`OtlpStats`: the OTLP exporter's ledger; no such rows while no exporter runs."""


@dataclass(frozen=True, slots=True)
class Label:
    prometheus: str
    otlp: str


@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    """A copy of the collector's counters."""

    requests: Mapping[tuple[str, str, str], int]
    """(model, outcome, reason) → requests."""
    prompt_tokens: Mapping[str, int]
    generated_tokens: Mapping[str, int]
    events: Mapping[str, int]
    """category → events."""
    collector_up: bool
    """The collector's subscription is live (a failed collector is disconnected)."""
    spec_drafted_tokens: Mapping[str, int] = field(default_factory=dict)
    """model → proposed tokens that speculation verified (llama-server's n_draft_total)."""
    spec_accepted_tokens: Mapping[str, int] = field(default_factory=dict)
    """model → of them accepted (llama-server's n_draft_accepted_total)."""


@dataclass(frozen=True, slots=True)
class Readings:
    """One look at every source: what a `/metrics` scrape renders."""

    counters: CounterSnapshot
    state: RuntimeView
    pipeline: EventSystemHealth
    exporter: OtlpStats | None

    def of(self, source: Source) -> object | None:
        """The value a row of `source` reads (None: that source is absent)."""
        match source:
            case Source.COLLECTOR:
                return self.counters
            case Source.STATE:
                return self.state
            case Source.PIPELINE:
                return self.pipeline
            case Source.EXPORTER:
                return self.exporter


Sample = tuple[tuple[str, ...], float]
"""Label values (in the order of the row's labels) and the value."""

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Metric(Generic[S]):
    prometheus: str
    otlp: str
    kind: MetricKind
    unit: str
    help: str
    labels: tuple[Label, ...]
    source: Source
    read: Callable[[S], Iterable[Sample]]
    """Samples from the source's value (a `CounterSnapshot`, `RuntimeView`, … per `source`)."""


MODEL: Final = Label("model", "model_id")
OUTCOME: Final = Label("outcome", "outcome")
REASON_CODE: Final = Label("reason", "reason_code")
STATE: Final = Label("state", "state")
CATEGORY: Final = Label("category", "category")
CLASS: Final = Label("class", "class")
SIGNAL: Final = Label("signal", "signal")
FAILURE_KIND: Final = Label("kind", "kind")
DROP_REASON: Final = Label("reason", "reason")
PLUGIN: Final = Label("plugin", "plugin_id")
RESULT: Final = Label("result", "result")
DISCARD_REASON: Final = Label("reason", "reason")


def _by_key(counts: Mapping[str, int]) -> list[Sample]:
    return [((key,), float(n)) for key, n in sorted(counts.items())]


def _one(value: float) -> list[Sample]:
    return [((), value)]


# -- collector -----------------------------------------------------------------------------------
def _requests(counters: CounterSnapshot) -> list[Sample]:
    return [(key, float(n)) for key, n in sorted(counters.requests.items())]


def _prompt_tokens(counters: CounterSnapshot) -> list[Sample]:
    return _by_key(counters.prompt_tokens)


def _generated_tokens(counters: CounterSnapshot) -> list[Sample]:
    return _by_key(counters.generated_tokens)


def _spec_drafted(counters: CounterSnapshot) -> list[Sample]:
    return _per_generating_model(counters, counters.spec_drafted_tokens)


def _spec_accepted(counters: CounterSnapshot) -> list[Sample]:
    return _per_generating_model(counters, counters.spec_accepted_tokens)


def _per_generating_model(counters: CounterSnapshot, values: Mapping[str, int]) -> list[Sample]:
    """A sample for every model that generated tokens (0 when it never speculated)."""
    return [((model,), float(values.get(model, 0))) for model in counters.generated_tokens]


def _events(counters: CounterSnapshot) -> list[Sample]:
    return _by_key(counters.events)


def _collector_up(counters: CounterSnapshot) -> list[Sample]:
    return _one(1.0 if counters.collector_up else 0.0)


# -- state ---------------------------------------------------------------------------------------
def _model_up(state: RuntimeView) -> list[Sample]:
    return [
        ((str(m.model_id), m.state.value), 1.0 if m.state in SERVING_MODEL_STATES else 0.0)
        for m in state.models.values()
    ]


def _queue_depth(state: RuntimeView) -> list[Sample]:
    return [((str(i),), float(queue_depth(state, i))) for i in state.models]


def _lanes_in_use(state: RuntimeView) -> list[Sample]:
    return [((str(i),), float(lanes_in_use(state, i))) for i in state.models]


def _kv_cells_used(state: RuntimeView) -> list[Sample]:
    return [
        ((str(m.model_id),), float(m.kv.cells_used))
        for m in state.models.values()
        if m.kv.cells_used is not None
    ]


def _kv_cells_total(state: RuntimeView) -> list[Sample]:
    return [
        ((str(m.model_id),), float(m.kv.cells_total))
        for m in state.models.values()
        if m.kv.cells_total is not None
    ]


def _plugin_messages(state: RuntimeView) -> list[Sample]:
    return sorted(
        ((str(m.model_id), str(p.plugin_id), result), float(getattr(p, result)))
        for m in state.models.values()
        for p in m.plugins
        for result in ("delivered", "deferred", "dropped")
    )


_DISCARD_COUNTERS: Final = (
    ("deadline_exceeded", "late"),
    ("invalid_token_count", "discarded_invalid_token_count"),
    ("invalid_token_id", "discarded_invalid_token_id"),
    ("position_mismatch", "discarded_position_mismatch"),
    ("execution_failed", "discarded_execution_failed"),
)
"""A discard reason (the label) and the plugin counter that counts it."""


def _plugin_discards(state: RuntimeView) -> list[Sample]:
    return sorted(
        ((str(m.model_id), str(p.plugin_id), reason), float(getattr(p, counter)))
        for m in state.models.values()
        for p in m.plugins
        for reason, counter in _DISCARD_COUNTERS
    )


def _plugin_failures(state: RuntimeView) -> list[Sample]:
    return sorted(
        ((str(m.model_id), str(p.plugin_id)), float(p.failures))
        for m in state.models.values()
        for p in m.plugins
    )


# -- pipeline ------------------------------------------------------------------------------------
def _events_dropped(health: EventSystemHealth) -> list[Sample]:
    lanes: list[Sample] = [
        ((cls.value,), float(lane.dropped)) for cls, lane in health.host_ingress.lanes.items()
    ]
    return [*lanes, (("native",), float(health.native_dropped))]


def _events_coalesced(health: EventSystemHealth) -> list[Sample]:
    return _one(float(health.host_ingress.total("coalesced") + health.native_coalesced))


def _subscribers_disconnected(health: EventSystemHealth) -> list[Sample]:
    dispatcher = health.dispatcher
    return _one(float(dispatcher.disconnected_lag + dispatcher.disconnected_failed))


# -- exporter ------------------------------------------------------------------------------------
def _exported(stats: OtlpStats) -> list[Sample]:
    return [((s.signal.value,), float(s.exported)) for s in stats.signals]


def _export_failures(stats: OtlpStats) -> list[Sample]:
    return [
        ((s.signal.value, kind.value), float(n))
        for s in stats.signals
        for kind, n in s.failures.items()
    ]


def _dropped(stats: OtlpStats) -> list[Sample]:
    return [
        ((s.signal.value, reason.value), float(n))
        for s in stats.signals
        for reason, n in s.dropped.items()
    ]


def _queued(stats: OtlpStats) -> list[Sample]:
    return [((s.signal.value,), float(s.pending + s.in_flight)) for s in stats.signals]


def _spans_evicted(stats: OtlpStats) -> list[Sample]:
    return _one(float(stats.spans.evicted))


def _exporter_degraded(stats: OtlpStats) -> list[Sample]:
    return _one(1.0 if stats.degraded else 0.0)


_C, _G = MetricKind.COUNTER, MetricKind.GAUGE

# One row a metric: Prometheus name, OTLP name, kind, unit, help, labels, source, reader.
# fmt: off
METRICS: Final[tuple[Metric[Any], ...]] = (
    Metric("skippy_requests_total", "skippy.requests", _C, "{request}",
           "Requests by model, outcome and reason code.",
           (MODEL, OUTCOME, REASON_CODE), Source.COLLECTOR, _requests),
    Metric("skippy_prompt_tokens_total", "skippy.prompt_tokens", _C, "{token}",
           "Prompt tokens processed.", (MODEL,), Source.COLLECTOR, _prompt_tokens),
    Metric("skippy_generated_tokens_total", "skippy.generated_tokens", _C, "{token}",
           "Tokens generated.", (MODEL,), Source.COLLECTOR, _generated_tokens),
    Metric("skippy_spec_drafted_tokens_total", "skippy.spec.drafted_tokens", _C, "{token}",
           "Proposed tokens speculative decoding verified.", (MODEL,), Source.COLLECTOR,
           _spec_drafted),
    Metric("skippy_spec_accepted_tokens_total", "skippy.spec.accepted_tokens", _C, "{token}",
           "Proposed tokens speculative decoding accepted.", (MODEL,), Source.COLLECTOR,
           _spec_accepted),
    Metric("skippy_events_total", "skippy.events", _C, "{event}",
           "Events dispatched, by category.", (CATEGORY,), Source.COLLECTOR, _events),
    Metric("skippy_model_up", "skippy.model.up", _G, "1",
           "1 when the model serves (available or degraded).",
           (MODEL, STATE), Source.STATE, _model_up),
    Metric("skippy_queue_depth", "skippy.queue.depth", _G, "{request}",
           "Requests waiting for a lane.", (MODEL,), Source.STATE, _queue_depth),
    Metric("skippy_lanes_in_use", "skippy.lanes.in_use", _G, "{lane}",
           "Lanes decoding or prefilling.", (MODEL,), Source.STATE, _lanes_in_use),
    Metric("skippy_kv_cells_used", "skippy.kv.cells_used", _G, "{cell}",
           "KV cells in use at the last report.", (MODEL,), Source.STATE, _kv_cells_used),
    Metric("skippy_kv_cells_total", "skippy.kv.cells_total", _G, "{cell}",
           "KV cells available.", (MODEL,), Source.STATE, _kv_cells_total),
    Metric("skippy_plugin_messages_total", "skippy.plugin.messages", _C, "{message}",
           "Messages to a serving plugin: delivered, deferred (a commit that went with a later "
           "message) or dropped (its queue was full).",
           (MODEL, PLUGIN, RESULT), Source.STATE, _plugin_messages),
    Metric("skippy_plugin_discarded_proposals_total", "skippy.plugin.discarded_proposals", _C,
           "{proposal}", "A serving plugin's proposals discarded unverified, by reason "
           "(deadline_exceeded: late).", (MODEL, PLUGIN, DISCARD_REASON), Source.STATE,
           _plugin_discards),
    Metric("skippy_plugin_failures_total", "skippy.plugin.failures", _C, "{failure}",
           "A serving plugin's failures (crashes, raised exceptions or error statuses, "
           "protocol errors).", (MODEL, PLUGIN), Source.STATE, _plugin_failures),
    Metric("skippy_events_dropped_total", "skippy.events.dropped", _C, "{event}",
           "Events dropped, by delivery class.", (CLASS,), Source.PIPELINE, _events_dropped),
    Metric("skippy_events_coalesced_total", "skippy.events.coalesced", _C, "{event}",
           "Progress values coalesced.", (), Source.PIPELINE, _events_coalesced),
    Metric("skippy_subscribers_disconnected_total", "skippy.subscribers.disconnected", _C,
           "{subscriber}", "Subscribers cut off.", (), Source.PIPELINE,
           _subscribers_disconnected),
    Metric("skippy_metrics_collector_up", "skippy.metrics_collector.up", _G, "1",
           "1 while this collector receives events.", (), Source.COLLECTOR, _collector_up),
    Metric("skippy_otlp_exported_total", "skippy.telemetry.exported", _C, "{item}",
           "Items the OTLP exporter delivered, by signal (log records, spans, points).",
           (SIGNAL,), Source.EXPORTER, _exported),
    Metric("skippy_otlp_export_failures_total", "skippy.telemetry.export_failures", _C,
           "{export}", "Failed OTLP export attempts, by signal and kind.",
           (SIGNAL, FAILURE_KIND), Source.EXPORTER, _export_failures),
    Metric("skippy_otlp_dropped_total", "skippy.telemetry.dropped", _C, "{item}",
           "Items the OTLP exporter dropped, by signal and reason.",
           (SIGNAL, DROP_REASON), Source.EXPORTER, _dropped),
    Metric("skippy_otlp_queue_items", "skippy.telemetry.queue", _G, "{item}",
           "Items queued or in flight in the OTLP exporter, by signal.",
           (SIGNAL,), Source.EXPORTER, _queued),
    Metric("skippy_otlp_spans_evicted_total", "skippy.telemetry.spans_evicted", _C, "{span}",
           "Request span trees ended early because too many were open.",
           (), Source.EXPORTER, _spans_evicted),
    Metric("skippy_otlp_exporter_degraded", "skippy.telemetry.degraded", _G, "1",
           "1 while the latest export of some OTLP signal failed.",
           (), Source.EXPORTER, _exporter_degraded),
)
# fmt: on
