"""Events as OTLP logs, requests as OTLP traces, counters as OTLP metrics — through the
OpenTelemetry SDK and its OTLP/HTTP exporters. Imported only when `otlp.otlp_config` says OTLP
is on (this module imports the SDK at the top).

Contract and invariants (the NDJSON exporter's, on the ecosystem's standard):

- **Never in the way.** `OtlpTelemetry` is a pipeline subscriber: the pipeline thread only
  appends to its bounded subscription (O(1)). Its intake thread (`skippy-subscriber-otlp`)
  maps each event to a log record and to span starts/ends, and hands them to the SDK's
  `BatchLogRecordProcessor` / `BatchSpanProcessor` (a deque append). Serialisation and HTTP run
  on the SDK's own worker threads; metrics are read by a `PeriodicExportingMetricReader` from
  counters the `MetricsCollector` already keeps. A dead, stalled or refusing collector costs
  counters only.
- **Bounded.** Queues are the processors' `max_queue_size` (OTEL_BLRP_* / OTEL_BSP_*); each
  export is bounded by the exporter's timeout (OTEL_EXPORTER_OTLP_TIMEOUT); open request span
  trees by `max_open_requests` (the oldest is ended early, marked and counted `evicted`);
  `shutdown(timeout_millis)` is idempotent and returns within about `timeout_millis`.
- **Counted.** `otlp.SignalLedger` per signal: `received == exported + sum(dropped) + pending +
  in_flight`, drops by reason (`queue_full`, `export_failed`, `shutting_down`), failures by kind
  (`timeout`, `connection`, `http_status`). Debug-class events (opt-in evidence) are never
  exported (`skipped_debug`). The SDK's own log lines are silenced: its messages can carry the
  endpoint URL, and the counters and health events say the same without it.
- **Health on transitions only** (`otlp.HealthTracker`): `telemetry_exporter_degraded` /
  `telemetry_exporter_recovered` through host ingress.
- **Privacy.** A log record is the `skippyctl events --json` record (`event_record`) flattened:
  body = event id, attributes = its fields (`summaries.prompt_tokens`, `progress.current`, …),
  nothing added. Span attributes are ids, counts, durations and closed vocabularies from the
  same typed events. Events have no free-text field (events/envelope.py), so no prompt,
  completion, token id or path can reach either. OTLP headers are read by the SDK exporter from
  the environment and never pass through this module.

Span tree per request (ids from the request's lifecycle events, times from their wall clocks):

    request        request_received → request_{completed,cancelled,timed_out,failed,rejected}
    ├─ queue       request_received → request_admitted (or the terminal, if never admitted)
    ├─ prefill     prompt_processing_started / prefill_started → prefill_completed
    └─ decode      generation_started → generation_{completed,cancelled,timed_out,failed}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import requests
from opentelemetry import trace as trace_api
from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Meter, Observation
from opentelemetry.sdk._logs import (
    LoggerProvider,
    LogRecordProcessor,
    ReadableLogRecord,
    ReadWriteLogRecord,
)
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExportResult,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from skippyctl import __version__
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import DeliveryClass, Outcome, Severity
from skippyctl.output.codec import event_record
from skippyctl.pipeline.dispatch import (
    Dispatched,
    Dispatcher,
    Subscription,
    run_callback_subscriber,
)
from skippyctl.pipeline.pipeline import EventSystemHealth
from skippyctl.reducer.state import RuntimeView, lanes_in_use, queue_depth
from skippyctl.telemetry.exporter import FailureKind
from skippyctl.telemetry.metrics import MetricsCollector
from skippyctl.telemetry.otlp import (
    DEFAULT_SERVICE_NAME,
    DEFAULT_SHUTDOWN_TIMEOUT_MILLIS,
    HealthTracker,
    OtlpConfig,
    OtlpStats,
    Signal,
    SignalConfig,
    SignalLedger,
    SpanStats,
)

SUBSCRIPTION_QUEUE_SIZE: Final = 8192
INSTRUMENTATION_SCOPE: Final = "skippyctl"
_SDK_LOGGERS: Final = ("opentelemetry.sdk", "opentelemetry.exporter")

SEVERITY_NUMBERS: Final = {
    Severity.TRACE: SeverityNumber.TRACE,
    Severity.DEBUG: SeverityNumber.DEBUG,
    Severity.INFO: SeverityNumber.INFO,
    Severity.WARNING: SeverityNumber.WARN,
    Severity.ERROR: SeverityNumber.ERROR,
    Severity.FATAL: SeverityNumber.FATAL,
}

_REQUEST_TERMINALS: Final = frozenset(
    {
        EventId.REQUEST_COMPLETED,
        EventId.REQUEST_CANCELLED,
        EventId.REQUEST_TIMED_OUT,
        EventId.REQUEST_FAILED,
        EventId.REQUEST_REJECTED,
    }
)
_PREFILL_STARTS: Final = frozenset({EventId.PROMPT_PROCESSING_STARTED, EventId.PREFILL_STARTED})
_PREFILL_ENDS: Final = frozenset(
    {EventId.PREFILL_COMPLETED, EventId.PREFILL_CANCELLED, EventId.PREFILL_FAILED}
)
_GENERATION_ENDS: Final = frozenset(
    {
        EventId.GENERATION_COMPLETED,
        EventId.GENERATION_CANCELLED,
        EventId.GENERATION_TIMED_OUT,
        EventId.GENERATION_FAILED,
    }
)
# Numbers copied onto the request span (and the child that measured them), by summary key.
_SPAN_NUMBERS: Final = (
    SummaryKey.PROMPT_TOKENS,
    SummaryKey.GENERATED_TOKENS,
    SummaryKey.REUSED_TOKENS,
    SummaryKey.QUEUE_DEPTH,
    SummaryKey.QUEUE_WAIT_MS,
    SummaryKey.TIME_TO_FIRST_TOKEN_MS,
    SummaryKey.PREFILL_MS,
    SummaryKey.DECODE_MS,
    SummaryKey.PREFILL_TOKENS_PER_S,
    SummaryKey.DECODE_TOKENS_PER_S,
    SummaryKey.SHARED_DECODE_STEPS,
    SummaryKey.BATCH_SIZE,
)


# -- log records ---------------------------------------------------------------------------------
def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, AttributeValue]:
    """A JSON record as OTLP attributes: nested objects become dotted keys
    (`summaries.prompt_tokens`, `progress.current`); scalars stay typed; None is skipped."""
    out: dict[str, AttributeValue] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
    return out


def log_attributes(item: Dispatched, dispatcher: Dispatcher | None) -> dict[str, AttributeValue]:
    cursor = dispatcher.cursor(item.sequence) if dispatcher is not None else None
    return flatten(event_record(item.event, item.sequence, cursor))


# -- exporters: the SDK's OTLP/HTTP ones, bracketed by the ledger ----------------------------------
class _ObservedSession(requests.Session):
    """The exporter's HTTP session, noting why the last request failed: the SDK reports only
    success or failure, the operator wants to know which (and the degraded event's reason)."""

    last_failure: FailureKind | None = None

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        self.last_failure = None
        try:
            response = super().request(*args, **kwargs)
        except requests.Timeout:
            self.last_failure = FailureKind.TIMEOUT
            raise
        except Exception:
            self.last_failure = FailureKind.CONNECTION
            raise
        if not 200 <= int(response.status_code) < 300:
            self.last_failure = FailureKind.HTTP_STATUS
        return response


def _failure(session: _ObservedSession) -> FailureKind:
    return session.last_failure or FailureKind.CONNECTION


class _LogExporter(OTLPLogExporter):
    def __init__(self, ledger: SignalLedger, signal: SignalConfig) -> None:
        self._session = _ObservedSession()
        super().__init__(endpoint=signal.endpoint, timeout=signal.timeout_s, session=self._session)
        self._ledger = ledger

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        count = len(batch)
        if not self._ledger.begin(count):
            return LogRecordExportResult.FAILURE
        result = LogRecordExportResult.FAILURE
        try:
            result = super().export(batch)
        finally:
            ok = result is LogRecordExportResult.SUCCESS
            self._ledger.end(count, None if ok else _failure(self._session))
        return result


class _SpanExporter(OTLPSpanExporter):
    def __init__(self, ledger: SignalLedger, signal: SignalConfig) -> None:
        self._session = _ObservedSession()
        super().__init__(endpoint=signal.endpoint, timeout=signal.timeout_s, session=self._session)
        self._ledger = ledger

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        count = len(spans)
        if not self._ledger.begin(count):
            return SpanExportResult.FAILURE
        result = SpanExportResult.FAILURE
        try:
            result = super().export(spans)
        finally:
            ok = result is SpanExportResult.SUCCESS
            self._ledger.end(count, None if ok else _failure(self._session))
        return result


def _data_points(metrics_data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for resource in metrics_data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )


class _MetricExporter(OTLPMetricExporter):
    def __init__(self, ledger: SignalLedger, signal: SignalConfig) -> None:
        self._session = _ObservedSession()
        super().__init__(endpoint=signal.endpoint, timeout=signal.timeout_s, session=self._session)
        self._ledger = ledger

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        count = _data_points(metrics_data)
        if not self._ledger.begin(count, admitted=False):
            return MetricExportResult.FAILURE
        result = MetricExportResult.FAILURE
        try:
            result = super().export(metrics_data, timeout_millis, **kwargs)
        finally:
            ok = result is MetricExportResult.SUCCESS
            self._ledger.end(count, None if ok else _failure(self._session))
        return result


# -- gates: the ledger's admission in front of the SDK batch processors ---------------------------
class _GatedLogProcessor(LogRecordProcessor):
    def __init__(self, ledger: SignalLedger, inner: BatchLogRecordProcessor) -> None:
        self._ledger = ledger
        self._inner = inner

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        if self._ledger.admit():
            self._inner.on_emit(log_record)

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call]  # unannotated in the SDK

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _GatedSpanProcessor(SpanProcessor):
    def __init__(self, ledger: SignalLedger, inner: BatchSpanProcessor) -> None:
        self._ledger = ledger
        self._inner = inner

    def on_end(self, span: ReadableSpan) -> None:
        if self._ledger.admit():
            self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call]  # unannotated in the SDK

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


# -- request spans -------------------------------------------------------------------------------
@dataclass(slots=True)
class _RequestTree:
    root: Span
    queue: Span | None = None
    prefill: Span | None = None
    decode: Span | None = None
    children: list[Span] = field(default_factory=list)

    def current(self) -> Span:
        for span in (self.decode, self.prefill, self.queue):
            if span is not None and span.is_recording():
                return span
        return self.root


def _scope_attributes(event: Event) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    scope = event.scope
    if scope.request_id is not None:
        attributes["request_id"] = str(scope.request_id)
    if scope.model_id is not None:
        attributes["model_id"] = str(scope.model_id)
        attributes["gen_ai.request.model"] = str(scope.model_id)
    if scope.session_id is not None:
        attributes["session_id"] = str(scope.session_id)
    return attributes


def _numbers(event: Event) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for key in _SPAN_NUMBERS:
        value = event.summary_value(key)
        if value is not None:
            attributes[key.value] = value
    if SummaryKey.PROMPT_TOKENS.value in attributes and event.id in _GENERATION_ENDS:
        attributes["gen_ai.usage.input_tokens"] = attributes[SummaryKey.PROMPT_TOKENS.value]
    if SummaryKey.GENERATED_TOKENS.value in attributes:
        attributes["gen_ai.usage.output_tokens"] = attributes[SummaryKey.GENERATED_TOKENS.value]
    return attributes


def _end(span: Span | None, event: Event, failed: bool = False) -> None:
    if span is None or not span.is_recording():
        return
    if failed:
        span.set_status(Status(StatusCode.ERROR, event.reason_code or None))
    span.end(end_time=event.wall_ns)


def _failed(event: Event) -> bool:
    return event.outcome in (Outcome.FAILURE, Outcome.REJECTED)


class RequestSpans:
    """Builds one span tree per request from its lifecycle events (intake thread only).

    At most `max_open` trees are open; a new request beyond that ends the oldest tree early
    (`skippy.span.evicted=true`, counted). Events for a request without an open tree (evicted,
    or received before the exporter subscribed) are counted `unmatched_events`."""

    def __init__(self, tracer: trace_api.Tracer, max_open: int) -> None:
        self._tracer = tracer
        self._max_open = max_open
        self._open: dict[str, _RequestTree] = {}
        self._lock = threading.Lock()  # guards the counters; the trees are intake-thread only
        self._started = 0
        self._ended = 0
        self._evicted = 0
        self._discarded = 0
        self._unmatched = 0

    def observe(self, event: Event) -> Span | None:
        """Advance the tree of the event's request; the span the event belongs to, if any."""
        request_id = event.scope.request_id
        if request_id is None:
            return None
        key = str(request_id)
        if event.id is EventId.REQUEST_RECEIVED:
            return self._start(key, event)
        tree = self._open.get(key)
        if tree is None:
            if event.category.value in ("request", "prefill", "generation"):
                with self._lock:
                    self._unmatched += 1
            return None
        self._advance(key, tree, event)
        return tree.current()

    def _start(self, key: str, event: Event) -> Span:
        if key in self._open:  # a duplicate: end the stale tree, start over
            self._finish(key, self._open[key], event, evicted=True)
        while len(self._open) >= self._max_open:
            oldest = next(iter(self._open))
            self._finish(oldest, self._open[oldest], event, evicted=True)
        attributes = _scope_attributes(event)
        root = self._tracer.start_span(
            "skippy.request",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=event.wall_ns,
        )
        tree = _RequestTree(root)
        tree.queue = self._child(tree, "queue", event)
        self._open[key] = tree
        with self._lock:
            self._started += 1
        return tree.queue

    def _child(self, tree: _RequestTree, name: str, event: Event) -> Span:
        span = self._tracer.start_span(
            name,
            context=trace_api.set_span_in_context(tree.root),
            kind=SpanKind.INTERNAL,
            attributes=_scope_attributes(event),
            start_time=event.wall_ns,
        )
        tree.children.append(span)
        return span

    def _advance(self, key: str, tree: _RequestTree, event: Event) -> None:
        numbers = _numbers(event)
        if numbers:
            tree.root.set_attributes(numbers)
        match event.id:
            case EventId.REQUEST_QUEUED if tree.queue is not None:
                tree.queue.set_attributes(numbers)
            case EventId.REQUEST_ADMITTED:
                if tree.queue is not None:
                    tree.queue.set_attributes(numbers)
                _end(tree.queue, event)
            case event_id if event_id in _PREFILL_STARTS:
                if tree.prefill is None:
                    _end(tree.queue, event)  # admission precedes it: never left open
                    tree.prefill = self._child(tree, "prefill", event)
                tree.prefill.set_attributes(numbers)
            case event_id if event_id in _PREFILL_ENDS:
                if tree.prefill is not None:
                    tree.prefill.set_attributes(numbers)
                    if event.duration_ms is not None:
                        tree.prefill.set_attribute("duration_ms", event.duration_ms)
                _end(tree.prefill, event, failed=event.id is EventId.PREFILL_FAILED)
            case EventId.GENERATION_STARTED:
                _end(tree.prefill, event)
                if tree.decode is None:
                    tree.decode = self._child(tree, "decode", event)
            case EventId.FIRST_TOKEN_PRODUCED if tree.decode is not None:
                tree.decode.add_event("first_token_produced", numbers, timestamp=event.wall_ns)
            case event_id if event_id in _GENERATION_ENDS:
                outcome: dict[str, AttributeValue] = {}
                if event.stop_reason is not None:
                    outcome["stop_reason"] = event.stop_reason.value
                    outcome["gen_ai.response.finish_reasons"] = (event.stop_reason.value,)
                if event.batching is not None:
                    outcome["batching"] = event.batching.value
                tree.root.set_attributes(outcome)
                if tree.decode is not None:
                    tree.decode.set_attributes({**numbers, **outcome})
                _end(tree.decode, event, failed=_failed(event))
            case event_id if event_id in _REQUEST_TERMINALS:
                self._finish(key, tree, event, evicted=False)
            case _:
                pass

    def _finish(self, key: str, tree: _RequestTree, event: Event, *, evicted: bool) -> None:
        failed = _failed(event) and not evicted
        for span in tree.children:
            _end(span, event, failed=failed)
        attributes: dict[str, AttributeValue] = {}
        if evicted:
            attributes["skippy.span.evicted"] = True
        else:
            if event.outcome is not None:
                attributes["outcome"] = event.outcome.value
            if event.reason_code is not None:
                attributes["reason_code"] = event.reason_code.value
            if event.duration_ms is not None:
                attributes["duration_ms"] = event.duration_ms
            attributes["terminal_event"] = event.id.value
        tree.root.set_attributes(attributes)
        _end(tree.root, event, failed=failed)
        del self._open[key]
        with self._lock:
            if evicted:
                self._evicted += 1
            else:
                self._ended += 1

    def discard(self) -> None:
        """Shutdown: forget the open trees (never ended, so never exported), counted."""
        with self._lock:
            self._discarded += len(self._open)
        self._open.clear()

    def stats(self) -> SpanStats:
        with self._lock:
            return SpanStats(
                open_requests=self._started - self._ended - self._evicted - self._discarded,
                started=self._started,
                ended=self._ended,
                evicted=self._evicted,
                discarded_at_shutdown=self._discarded,
                unmatched_events=self._unmatched,
            )


# -- metrics -------------------------------------------------------------------------------------
def _observe(pairs: Iterable[tuple[dict[str, str], float]]) -> list[Observation]:
    return [Observation(value, attributes) for attributes, value in pairs]


def install_instruments(
    meter: Meter,
    collector: MetricsCollector,
    state: Callable[[], RuntimeView],
    health: Callable[[], EventSystemHealth],
    stats: Callable[[], OtlpStats],
) -> None:
    """The counters `/metrics` shows, as observable instruments read at each collection (on the
    metric reader's thread; reading them takes the collector's lock briefly, nothing else)."""

    def counter(
        name: str, unit: str, description: str, read: Callable[[], list[Observation]]
    ) -> None:
        meter.create_observable_counter(
            name, callbacks=[lambda _o: read()], unit=unit, description=description
        )

    def gauge(
        name: str, unit: str, description: str, read: Callable[[], list[Observation]]
    ) -> None:
        meter.create_observable_gauge(
            name, callbacks=[lambda _o: read()], unit=unit, description=description
        )

    def requests_read() -> list[Observation]:
        snapshot = collector.snapshot()
        return _observe(
            ({"model_id": m, "outcome": o, "reason_code": r}, float(n))
            for (m, o, r), n in snapshot.requests.items()
        )

    counter(
        "skippy.requests", "{request}", "Requests by model, outcome and reason code.", requests_read
    )
    counter(
        "skippy.prompt_tokens",
        "{token}",
        "Prompt tokens processed.",
        lambda: _observe(
            ({"model_id": m}, float(n)) for m, n in collector.snapshot().prompt_tokens.items()
        ),
    )
    counter(
        "skippy.generated_tokens",
        "{token}",
        "Tokens generated.",
        lambda: _observe(
            ({"model_id": m}, float(n)) for m, n in collector.snapshot().generated_tokens.items()
        ),
    )
    counter(
        "skippy.events",
        "{event}",
        "Events dispatched, by category.",
        lambda: _observe(
            ({"category": c}, float(n)) for c, n in collector.snapshot().events.items()
        ),
    )

    def dropped_read() -> list[Observation]:
        current = health()
        pairs = [
            ({"class": cls.value}, float(lane.dropped))
            for cls, lane in current.host_ingress.lanes.items()
        ]
        pairs.append(({"class": "native"}, float(current.native_dropped)))
        return _observe(pairs)

    counter("skippy.events.dropped", "{event}", "Events dropped, by delivery class.", dropped_read)
    counter(
        "skippy.events.coalesced",
        "{event}",
        "Progress values coalesced.",
        lambda: _observe(
            [({}, float(health().host_ingress.total("coalesced") + health().native_coalesced))]
        ),
    )

    def models() -> list[tuple[LogicalId, Any]]:
        view = state()
        return [(m.model_id, m) for m in view.models.values()]

    gauge(
        "skippy.model.up",
        "1",
        "1 when the model serves (available or degraded).",
        lambda: _observe(
            (
                {"model_id": i, "state": m.state.value},
                1.0 if m.state.value in ("available", "degraded") else 0.0,
            )
            for i, m in models()
        ),
    )
    gauge(
        "skippy.queue.depth",
        "{request}",
        "Requests waiting for a lane.",
        lambda: _observe(({"model_id": i}, float(queue_depth(state(), i))) for i, _m in models()),
    )
    gauge(
        "skippy.lanes.in_use",
        "{lane}",
        "Lanes decoding or prefilling.",
        lambda: _observe(({"model_id": i}, float(lanes_in_use(state(), i))) for i, _m in models()),
    )
    gauge(
        "skippy.kv.cells_used",
        "{cell}",
        "KV cells in use at the last report.",
        lambda: _observe(
            ({"model_id": i}, float(m.kv.cells_used))
            for i, m in models()
            if m.kv.cells_used is not None
        ),
    )
    counter(
        "skippy.telemetry.exported",
        "{item}",
        "Items this exporter delivered, by signal.",
        lambda: _observe(({"signal": s.signal.value}, float(s.exported)) for s in stats().signals),
    )
    counter(
        "skippy.telemetry.dropped",
        "{item}",
        "Items this exporter dropped, by signal and reason.",
        lambda: _observe(
            ({"signal": s.signal.value, "reason": r.value}, float(n))
            for s in stats().signals
            for r, n in s.dropped.items()
        ),
    )
    counter(
        "skippy.telemetry.export_failures",
        "{export}",
        "Failed export attempts, by signal and kind.",
        lambda: _observe(
            ({"signal": s.signal.value, "kind": k.value}, float(n))
            for s in stats().signals
            for k, n in s.failures.items()
        ),
    )


# -- the exporter --------------------------------------------------------------------------------
def build_resource(instance_id: str) -> Resource:
    """`service.name=skippyctl`, version and instance, overridden by OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES (the SDK's own detectors read those)."""
    detected = Resource.create()
    resource = Resource(
        {
            "service.name": DEFAULT_SERVICE_NAME,
            "service.version": __version__,
            "service.instance.id": instance_id,
        }
    ).merge(detected)
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


class OtlpTelemetry:
    """Events → OTLP logs, requests → spans, counters → metrics. `start(dispatcher)` once,
    `shutdown()` when done. `submit` is the host ingress (nonblocking) for health events."""

    def __init__(
        self,
        config: OtlpConfig,
        submit: Callable[[Event], object],
        collector: MetricsCollector | None = None,
        state: Callable[[], RuntimeView] | None = None,
        health: Callable[[], EventSystemHealth] | None = None,
        instance_id: str = "",
    ) -> None:
        for name in _SDK_LOGGERS:
            # Failures are counted and reported as events; the SDK's messages can name the URL.
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.config = config
        self._health = HealthTracker(submit)
        self._ledgers: dict[Signal, SignalLedger] = {}
        self._lock = threading.Lock()
        self._skipped_debug = 0
        self._shutdown_started = False
        self._stoppers: list[threading.Thread] = []
        self._dispatcher: Dispatcher | None = None
        self._subscription: Subscription | None = None
        self._intake: threading.Thread | None = None
        resource = build_resource(instance_id)

        self._logger_provider: LoggerProvider | None = None
        self._logger: Any = None
        logs = config.signal(Signal.LOGS)
        if logs is not None:
            ledger = self._ledger(Signal.LOGS, logs.display, config.logs.max_queue_size)
            knobs = config.logs
            processor = BatchLogRecordProcessor(
                _LogExporter(ledger, logs),
                schedule_delay_millis=knobs.schedule_delay_millis,
                max_export_batch_size=knobs.max_export_batch_size,
                export_timeout_millis=knobs.export_timeout_millis,
                max_queue_size=knobs.max_queue_size,
            )
            self._logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logger_provider.add_log_record_processor(_GatedLogProcessor(ledger, processor))
            self._logger = self._logger_provider.get_logger(INSTRUMENTATION_SCOPE, __version__)

        self._tracer_provider: TracerProvider | None = None
        self._spans: RequestSpans | None = None
        traces = config.signal(Signal.TRACES)
        if traces is not None:
            ledger = self._ledger(Signal.TRACES, traces.display, config.traces.max_queue_size)
            knobs = config.traces
            span_processor = BatchSpanProcessor(
                _SpanExporter(ledger, traces),
                schedule_delay_millis=knobs.schedule_delay_millis,
                max_export_batch_size=knobs.max_export_batch_size,
                export_timeout_millis=knobs.export_timeout_millis,
                max_queue_size=knobs.max_queue_size,
            )
            self._tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            self._tracer_provider.add_span_processor(_GatedSpanProcessor(ledger, span_processor))
            tracer = self._tracer_provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)
            self._spans = RequestSpans(tracer, config.max_open_requests)

        self._meter_provider: MeterProvider | None = None
        metrics = config.signal(Signal.METRICS)
        if (
            metrics is not None
            and collector is not None
            and state is not None
            and health is not None
        ):
            ledger = SignalLedger(Signal.METRICS, metrics.display, 0, self._health.on_result)
            self._ledgers[Signal.METRICS] = ledger
            reader = PeriodicExportingMetricReader(
                _MetricExporter(ledger, metrics),
                export_interval_millis=config.metric_export_interval_millis,
                export_timeout_millis=config.metric_export_timeout_millis,
            )
            self._meter_provider = MeterProvider(
                metric_readers=[reader], resource=resource, shutdown_on_exit=False
            )
            meter = self._meter_provider.get_meter(INSTRUMENTATION_SCOPE, __version__)
            install_instruments(meter, collector, state, health, self.stats)

    def _ledger(self, signal: Signal, display: str, max_queue_size: int) -> SignalLedger:
        ledger = SignalLedger(signal, display, max_queue_size, self._health.on_result)
        self._ledgers[signal] = ledger
        return ledger

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, dispatcher: Dispatcher, replay: bool = True) -> OtlpTelemetry:
        """Subscribe (with `replay`, from what the dispatcher retained) and follow."""
        if self._logger_provider is None and self._tracer_provider is None:
            return self  # metrics only: the reader thread is already running
        self._dispatcher = dispatcher
        self._subscription = dispatcher.subscribe(
            "otlp-exporter", max_queue_size=SUBSCRIPTION_QUEUE_SIZE, replay=replay
        )
        self._intake = run_callback_subscriber(dispatcher, self._subscription, self.accept, "otlp")
        return self

    def shutdown(self, timeout_millis: int = DEFAULT_SHUTDOWN_TIMEOUT_MILLIS) -> bool:
        """Stop taking events, export what is queued while time remains (not when degraded: a
        dead collector would only hold shutdown up), stop. Idempotent; returns within about
        `timeout_millis`; True when every SDK component finished in time. What was not
        exported is counted `shutting_down`."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            first = not self._shutdown_started
            self._shutdown_started = True
        if not first:  # idempotent: wait (bounded) for what the first call started
            for thread in self._stoppers:
                thread.join(max(0.0, deadline - time.monotonic()))
            return not any(thread.is_alive() for thread in self._stoppers)
        if self._dispatcher is not None and self._subscription is not None:
            self._dispatcher.unsubscribe(self._subscription)
        if self._intake is not None:
            self._intake.join(max(0.0, deadline - time.monotonic()))
        self._health.quiet = True  # the host has stopped: nothing to report to
        if self._spans is not None:
            self._spans.discard()
        if self._health.degraded:
            for ledger in self._ledgers.values():
                ledger.close()
        remaining_ms = max(0.0, (deadline - time.monotonic()) * 1000)
        stoppers: list[Callable[[], object]] = []
        if self._logger_provider is not None:
            stoppers.append(self._logger_provider.shutdown)
        if self._tracer_provider is not None:
            stoppers.append(self._tracer_provider.shutdown)
        if self._meter_provider is not None:
            provider = self._meter_provider
            stoppers.append(lambda: provider.shutdown(timeout_millis=remaining_ms))
        # The SDK's batch processors wait up to 30 s on shutdown: each runs on its own thread,
        # joined against this deadline (they are daemon threads; a stalled one is abandoned).
        self._stoppers = [
            threading.Thread(target=stop, name=f"skippy-otlp-shutdown-{i}", daemon=True)
            for i, stop in enumerate(stoppers)
        ]
        for thread in self._stoppers:
            thread.start()
        for thread in self._stoppers:
            thread.join(max(0.0, deadline - time.monotonic()))
        for ledger in self._ledgers.values():
            ledger.close()
        return not any(thread.is_alive() for thread in self._stoppers)

    # -- intake (subscriber thread) -------------------------------------------------------------
    def accept(self, item: Dispatched) -> None:
        """One dispatched event: span bookkeeping, then a log record (both only enqueue)."""
        event = item.event
        if event.delivery is DeliveryClass.DEBUG:
            with self._lock:
                self._skipped_debug += 1
            return
        span: Span | None = None
        if self._spans is not None:
            span = self._spans.observe(event)
        if self._logger is not None:
            context: Context | None = None
            if span is not None:
                context = trace_api.set_span_in_context(span)
            self._logger.emit(
                timestamp=event.wall_ns,
                observed_timestamp=time.time_ns(),
                context=context,
                severity_number=SEVERITY_NUMBERS[event.severity],
                severity_text=event.severity.value.upper(),
                body=event.id.value,
                event_name=event.id.value,
                attributes=log_attributes(item, self._dispatcher),
            )

    # -- counters -------------------------------------------------------------------------------
    def stats(self) -> OtlpStats:
        spans = self._spans.stats() if self._spans is not None else SpanStats(0, 0, 0, 0, 0, 0)
        with self._lock:
            skipped = self._skipped_debug
        return OtlpStats(
            degraded=self._health.degraded,
            signals=tuple(ledger.stats() for ledger in self._ledgers.values()),
            spans=spans,
            skipped_debug=skipped,
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{s.signal.value}={s.display}" for s in self.config.signals)
        return f"OtlpTelemetry({shown})"
