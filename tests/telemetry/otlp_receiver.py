"""A real OTLP/HTTP receiver on 127.0.0.1 (http.server in a thread): accepts POST /v1/logs,
/v1/metrics, /v1/traces and decodes each body with the collector protos. Its behaviour is set by
a test: `ok` (200 + an empty Export*ServiceResponse), `fail` (500), `stall` (reads the request,
never answers until closed). Tests wait on its condition variable, never on a sleep."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

_REQUESTS: dict[str, Any] = {
    "/v1/logs": (
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
    "/v1/metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "/v1/traces": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
}


@dataclass(frozen=True)
class Export:
    path: str
    headers: dict[str, str]
    body: bytes
    request: Any
    """The decoded Export*ServiceRequest."""
    status: int | None
    """What the receiver answered (None: it stalled)."""


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: value(pair.value) for pair in pairs}


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.exports: list[Export] = []
        self.changed = threading.Condition()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                kinds = _REQUESTS.get(self.path)
                if kinds is None:
                    self.send_error(404)
                    return
                request = kinds[0]()
                request.ParseFromString(body)
                status = {"ok": 200, "fail": 500}.get(receiver.mode)
                export = Export(self.path, dict(self.headers.items()), body, request, status)
                with receiver.changed:
                    receiver.exports.append(export)
                    receiver.changed.notify_all()
                if status is None:
                    receiver.release.wait()  # accepted, read, never answered
                    self.close_connection = True  # on release: hang up instead of keep-alive
                    return
                answer = kinds[1]().SerializeToString() if status == 200 else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="test-otlp-receiver", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def set_mode(self, mode: str) -> None:
        with self.changed:
            self.mode = mode

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout_s: float = 30.0) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: predicate(self), timeout_s)
        assert ok, f"receiver never saw it; {len(self.exports)} export(s)"

    def accepted(self, path: str) -> list[Export]:
        with self.changed:
            return [e for e in self.exports if e.path == path and e.status == 200]

    def log_records(self) -> list[LogRecord]:
        return [
            record
            for export in self.accepted("/v1/logs")
            for resource in export.request.resource_logs
            for scope in resource.scope_logs
            for record in scope.log_records
        ]

    def spans(self) -> list[Span]:
        return [
            span
            for export in self.accepted("/v1/traces")
            for resource in export.request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def metrics(self) -> list[Metric]:
        """Every metric of every accepted export, in order (one per instrument and export)."""
        return [
            metric
            for export in self.accepted("/v1/metrics")
            for resource in export.request.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        ]

    def metric_names(self) -> set[str]:
        return {metric.name for metric in self.metrics()}

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """Every data point of metric `name` (sum or gauge) with its attributes, in order."""
        return [
            point for metric in self.metrics() if metric.name == name for point in points(metric)
        ]

    def raw(self) -> bytes:
        with self.changed:
            return b"".join(e.body for e in self.exports)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def points(metric: Metric) -> list[tuple[dict[str, Any], float]]:
    """One metric's data points (sum or gauge) as (attributes, value)."""
    data = metric.sum if metric.HasField("sum") else metric.gauge
    return [
        (
            attributes(point.attributes),
            point.as_double if point.HasField("as_double") else float(point.as_int),
        )
        for point in data.data_points
    ]


def log_bodies(receiver: Receiver) -> list[str]:
    return [record.body.string_value for record in receiver.log_records()]
