"""The SDK's OTLP/HTTP exporters and batch processors, bracketed by the ledger.

The SDK's batch processors drop silently when full and ignore export results, so each signal's
`otlp.SignalLedger` sits on both sides of them: a gate in front of the processor admits an item
only while the queue has room (a refused one is counted `queue_full`), and the exporter reports
each batch's start and result, with the `FailureKind` its HTTP session saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import requests
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LogRecordProcessor, ReadableLogRecord, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from skippyctl.telemetry.otlp import FailureKind, SignalConfig, SignalLedger


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


class LedgerLogExporter(OTLPLogExporter):
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


class LedgerSpanExporter(OTLPSpanExporter):
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


class LedgerMetricExporter(OTLPMetricExporter):
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
class GatedLogProcessor(LogRecordProcessor):
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


class GatedSpanProcessor(SpanProcessor):
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
