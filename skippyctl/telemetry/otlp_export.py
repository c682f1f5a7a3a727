"""Events as OTLP logs, requests as OTLP traces, the metric table as OTLP metrics — through the
OpenTelemetry SDK and its OTLP/HTTP exporters. Imported only when `otlp.otlp_config` says OTLP
is on (this module and the `otlp_*` modules it wires import the SDK at the top).

`OtlpTelemetry` is the pipeline subscriber that wires them: the log mapping
(`otlp_logs`), the request span trees (`otlp_spans`), the metric instruments (`otlp_metrics`,
from `metric_table.METRICS`) and the SDK's exporters and batch processors behind the ledger
(`otlp_exporters`). Contract and invariants:

- **Never in the way.** The pipeline thread only appends to the exporter's bounded subscription
  (O(1)). Its intake thread (`skippy-subscriber-otlp`) maps each event to a log record and to
  span starts/ends, and hands them to the SDK's `BatchLogRecordProcessor` /
  `BatchSpanProcessor` (a deque append). Serialisation, HTTP, retries and backoff run on the
  SDK's own worker threads; metrics are read by a `PeriodicExportingMetricReader` from the
  sources `/metrics` reads. A dead, stalled or refusing collector costs counters only.
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
- **Privacy.** Log records are the `events --json` records (`otlp_logs`); span attributes are
  ids, counts, durations and closed vocabularies from the same typed events. OTLP headers are
  read by the SDK exporter from the environment and never pass through this project's code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span

from skippyctl import __version__
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import DeliveryClass
from skippyctl.pipeline.dispatch import (
    Dispatched,
    Dispatcher,
    Subscription,
    run_callback_subscriber,
)
from skippyctl.pipeline.pipeline import EventSystemHealth
from skippyctl.reducer.state import RuntimeView
from skippyctl.telemetry.metric_table import Source
from skippyctl.telemetry.metrics import MetricsCollector
from skippyctl.telemetry.otlp import (
    DEFAULT_SERVICE_NAME,
    DEFAULT_SHUTDOWN_TIMEOUT_MILLIS,
    HealthTracker,
    OtlpConfig,
    OtlpStats,
    Signal,
    SignalLedger,
    SpanStats,
)
from skippyctl.telemetry.otlp_exporters import (
    GatedLogProcessor,
    GatedSpanProcessor,
    LedgerLogExporter,
    LedgerMetricExporter,
    LedgerSpanExporter,
)
from skippyctl.telemetry.otlp_logs import SEVERITY_NUMBERS, log_attributes
from skippyctl.telemetry.otlp_metrics import install_instruments
from skippyctl.telemetry.otlp_spans import RequestSpans

SUBSCRIPTION_QUEUE_SIZE: Final = 8192
INSTRUMENTATION_SCOPE: Final = "skippyctl"
_SDK_LOGGERS: Final = ("opentelemetry.sdk", "opentelemetry.exporter")


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
                LedgerLogExporter(ledger, logs),
                schedule_delay_millis=knobs.schedule_delay_millis,
                max_export_batch_size=knobs.max_export_batch_size,
                export_timeout_millis=knobs.export_timeout_millis,
                max_queue_size=knobs.max_queue_size,
            )
            self._logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logger_provider.add_log_record_processor(GatedLogProcessor(ledger, processor))
            self._logger = self._logger_provider.get_logger(INSTRUMENTATION_SCOPE, __version__)

        self._tracer_provider: TracerProvider | None = None
        self._spans: RequestSpans | None = None
        traces = config.signal(Signal.TRACES)
        if traces is not None:
            ledger = self._ledger(Signal.TRACES, traces.display, config.traces.max_queue_size)
            knobs = config.traces
            span_processor = BatchSpanProcessor(
                LedgerSpanExporter(ledger, traces),
                schedule_delay_millis=knobs.schedule_delay_millis,
                max_export_batch_size=knobs.max_export_batch_size,
                export_timeout_millis=knobs.export_timeout_millis,
                max_queue_size=knobs.max_queue_size,
            )
            self._tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            self._tracer_provider.add_span_processor(GatedSpanProcessor(ledger, span_processor))
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
                LedgerMetricExporter(ledger, metrics),
                export_interval_millis=config.metric_export_interval_millis,
                export_timeout_millis=config.metric_export_timeout_millis,
            )
            self._meter_provider = MeterProvider(
                metric_readers=[reader], resource=resource, shutdown_on_exit=False
            )
            meter = self._meter_provider.get_meter(INSTRUMENTATION_SCOPE, __version__)
            sources: dict[Source, Callable[[], object]] = {
                Source.COLLECTOR: collector.snapshot,
                Source.STATE: state,
                Source.PIPELINE: health,
                Source.EXPORTER: self.stats,
            }
            install_instruments(meter, sources)

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
