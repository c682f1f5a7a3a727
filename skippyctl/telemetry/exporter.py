"""Optional push telemetry: batches of event records POSTed as NDJSON to an HTTP(S) collector.

Contract and invariants:

- **Never in the way.** The exporter is a pipeline subscriber. Its intake thread moves each
  dispatched item into the exporter's own bounded buffer (O(1), no I/O) so the subscription
  never lags; when the buffer is full the oldest event is dropped and counted (`queue_full`).
  Serialisation and HTTP happen on one named daemon thread (`skippy-telemetry-exporter`). Startup,
  loading and serving never wait for it; a dead, slow or refusing collector costs counters only.
- **Bounded everything.** `max_queue_size` events buffered, `max_export_batch_size` events per
  POST, one POST at a time with a wall deadline of `export_timeout_millis` (a collector that
  accepts the connection and never answers times out), `shutdown(timeout_millis)` idempotent and
  bounded. A failed batch (refused, timed out, non-2xx) is dropped and counted (`export_failed`)
  and the next attempt waits an exponential backoff (`export_interval_millis` doubling up to
  `max_backoff_millis`) while the buffer keeps filling (bounded, oldest dropped).
- **Conservation.** `received == exported + sum(dropped) + pending + in_flight` at every
  snapshot. Debug-class events (opt-in evidence) are never exported; they are counted as
  `skipped_debug`, not received.
- **Health on transitions only.** The first failure after a start or a success submits
  `telemetry_exporter_degraded` (reason `timeout` or `unknown_failure`) through host ingress;
  the next success submits `telemetry_exporter_recovered`. Those events are exported like any
  other (once each); they cannot storm, since each needs a success/failure flip and attempts are
  paced by the interval and the backoff.
- **Privacy.** The wire record is `skippyctl.output.codec.event_record` — the exact record
  `skippyctl events --json` prints — so the exporter adds no fields and no second serializer.
  The endpoint URL may carry credentials (userinfo is sent as HTTP Basic auth, the query as
  given): it never appears in an event, a metric, an error message or a repr; `Endpoint.display`
  is only scheme, host and port.
"""

from __future__ import annotations

import base64
import functools
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, make_event, summaries
from skippyctl.events.reasons import DeliveryClass, Outcome, ReasonCode
from skippyctl.output.codec import dumps_line, event_record
from skippyctl.pipeline.dispatch import (
    Dispatched,
    Dispatcher,
    Subscription,
    run_callback_subscriber,
)

ENDPOINT_ENV: Final = "SKIPPY_TELEMETRY_ENDPOINT"
CONTENT_TYPE: Final = "application/x-ndjson"

DEFAULT_MAX_QUEUE_SIZE: Final = 4096
DEFAULT_MAX_EXPORT_BATCH_SIZE: Final = 512
DEFAULT_EXPORT_INTERVAL_MILLIS: Final = 1000
DEFAULT_EXPORT_TIMEOUT_MILLIS: Final = 2000
DEFAULT_MAX_BACKOFF_MILLIS: Final = 30_000
DEFAULT_SHUTDOWN_TIMEOUT_MILLIS: Final = 2000
SUBSCRIPTION_QUEUE_SIZE: Final = 8192
"""The dispatcher-side bound; the intake thread empties it as fast as events arrive."""
MAX_RESPONSE_BYTES: Final = 64 * 1024
"""A collector's answer is read up to this much and discarded."""

# Tuning knobs from the environment (OpenTelemetry's OTEL_BSP_* in this project's names).
_KNOB_ENV: Final = {
    "max_queue_size": "SKIPPY_TELEMETRY_MAX_QUEUE_SIZE",
    "max_export_batch_size": "SKIPPY_TELEMETRY_MAX_EXPORT_BATCH_SIZE",
    "export_interval_millis": "SKIPPY_TELEMETRY_EXPORT_INTERVAL_MILLIS",
    "export_timeout_millis": "SKIPPY_TELEMETRY_EXPORT_TIMEOUT_MILLIS",
    "max_backoff_millis": "SKIPPY_TELEMETRY_MAX_BACKOFF_MILLIS",
}


class DropReason(StrEnum):
    """Why an event that entered the buffer was not exported (metric label values)."""

    QUEUE_FULL = "queue_full"
    """The buffer was full: the oldest event made room for a new one."""
    EXPORT_FAILED = "export_failed"
    """It was in a batch the collector refused, or that failed or timed out."""
    SHUTTING_DOWN = "shutting_down"
    """It was still buffered when shutdown's time ran out (or the exporter was degraded)."""


class FailureKind(StrEnum):
    """What went wrong with one POST (metric label values)."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    """Refused, reset, unresolvable host, TLS failure, malformed answer."""
    HTTP_STATUS = "http_status"
    """The collector answered, but not with 2xx."""


_FAILURE_REASONS: Final = {
    FailureKind.TIMEOUT: ReasonCode.TIMEOUT,
    FailureKind.CONNECTION: ReasonCode.UNKNOWN_FAILURE,
    FailureKind.HTTP_STATUS: ReasonCode.UNKNOWN_FAILURE,
}


class TelemetryConfigError(ValueError):
    """The telemetry configuration is invalid (`invalid_configuration`). The message never
    repeats the URL: it may carry credentials."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A validated collector URL, split for `http.client`. Only `display` is safe to show."""

    scheme: str
    host: str
    port: int
    target: str = field(repr=False)
    """Path and query as given (the query may hold a token): sent, never shown."""
    authorization: str | None = field(default=None, repr=False)
    """`Basic …` from the URL's userinfo, if any."""

    @property
    def display(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """Validate an http(s) collector URL; raises TelemetryConfigError (without the URL)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise TelemetryConfigError(
            "--telemetry-endpoint is not a valid URL (bad port or address)"
        ) from error
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TelemetryConfigError("--telemetry-endpoint must be an http:// or https:// URL")
    host = parts.hostname
    if not host:
        raise TelemetryConfigError("--telemetry-endpoint has no host")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return Endpoint(
        scheme=scheme,
        host=host,
        port=port if port is not None else (443 if scheme == "https" else 80),
        target=target,
        authorization=authorization,
    )


@dataclass(frozen=True, slots=True)
class ExporterConfig:
    endpoint: Endpoint
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE
    export_interval_millis: int = DEFAULT_EXPORT_INTERVAL_MILLIS
    export_timeout_millis: int = DEFAULT_EXPORT_TIMEOUT_MILLIS
    max_backoff_millis: int = DEFAULT_MAX_BACKOFF_MILLIS

    def __post_init__(self) -> None:
        if self.max_queue_size < 1 or self.max_export_batch_size < 1:
            raise TelemetryConfigError("telemetry queue and batch sizes must be at least 1")
        if self.max_export_batch_size > self.max_queue_size:
            raise TelemetryConfigError("the telemetry batch size must not exceed the queue size")
        if min(self.export_interval_millis, self.export_timeout_millis) < 1:
            raise TelemetryConfigError("telemetry interval and timeout must be at least 1 ms")
        if self.max_backoff_millis < self.export_interval_millis:
            raise TelemetryConfigError("the telemetry max backoff must be ≥ the export interval")


def exporter_config(url: str, environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """The configuration for `url`, with knobs from `SKIPPY_TELEMETRY_*` variables in
    `environ` when set. Raises TelemetryConfigError."""
    knobs: dict[str, int] = {}
    for name, variable in _KNOB_ENV.items():
        value = (environ or {}).get(variable)
        if value is None or value == "":
            continue
        try:
            knobs[name] = int(value)
        except ValueError as error:
            raise TelemetryConfigError(f"{variable} must be an integer") from error
    return ExporterConfig(parse_endpoint(url), **knobs)


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """A consistent snapshot of the local counters (`received == exported + sum(dropped) +
    pending + in_flight`)."""

    received: int
    exported: int
    batches: int
    failures: dict[FailureKind, int]
    dropped: dict[DropReason, int]
    pending: int
    in_flight: int
    skipped_debug: int
    degraded: bool
    endpoint: str
    """scheme://host:port only."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "degraded": self.degraded,
            "received": self.received,
            "exported": self.exported,
            "batches": self.batches,
            "failures": {kind.value: n for kind, n in self.failures.items()},
            "dropped": {reason.value: n for reason, n in self.dropped.items()},
            "pending": self.pending,
            "in_flight": self.in_flight,
            "skipped_debug": self.skipped_debug,
        }


class _ExportFailed(Exception):
    def __init__(self, kind: FailureKind) -> None:
        super().__init__(kind.value)
        self.kind = kind


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One default (verifying) context: loading the CA store per batch would cost ~10 ms."""
    return ssl.create_default_context()


def post_ndjson(endpoint: Endpoint, body: bytes, timeout_s: float) -> None:
    """One POST on a fresh connection, finished within `timeout_s` of wall time per blocking
    step, the remaining budget recomputed before each. Raises _ExportFailed.

    A fresh connection per batch (at most about one a second) avoids the stale keep-alive
    failures a reused connection would report as collector outages.
    """
    import http.client

    deadline = time.monotonic() + timeout_s

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _ExportFailed(FailureKind.TIMEOUT)
        return left

    connection: http.client.HTTPConnection
    if endpoint.scheme == "https":
        connection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=remaining(), context=_tls_context()
        )
    else:
        connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=remaining())
    headers = {"Content-Type": CONTENT_TYPE, "Connection": "close"}
    if endpoint.authorization is not None:
        headers["Authorization"] = endpoint.authorization
    try:
        connection.request("POST", endpoint.target, body=body, headers=headers)
        if connection.sock is not None:
            connection.sock.settimeout(remaining())
        response = connection.getresponse()
        if connection.sock is not None:
            connection.sock.settimeout(remaining())
        response.read(MAX_RESPONSE_BYTES)
        status = response.status
    except _ExportFailed:
        raise
    except TimeoutError as error:
        raise _ExportFailed(FailureKind.TIMEOUT) from error
    except (OSError, http.client.HTTPException) as error:
        raise _ExportFailed(FailureKind.CONNECTION) from error
    finally:
        connection.close()
    if not 200 <= status < 300:
        raise _ExportFailed(FailureKind.HTTP_STATUS)


Poster = Callable[[Endpoint, bytes, float], None]


class TelemetryExporter:
    """Batch exporter of dispatched events. `start(dispatcher)` once; `shutdown()` when done.

    `submit` is how health facts enter the pipeline (the host ingress: `Pipeline.submit`); it
    must be nonblocking. `poster` is the HTTP call (a seam for tests of the batching logic).
    """

    def __init__(
        self,
        config: ExporterConfig,
        submit: Callable[[Event], object],
        poster: Poster = post_ndjson,
    ) -> None:
        self.config = config
        self._submit = submit
        self._poster = poster
        self._cond = threading.Condition()
        self._buffer: deque[Dispatched] = deque()
        self._received = 0
        self._exported = 0
        self._batches = 0
        self._failures = dict.fromkeys(FailureKind, 0)
        self._dropped = dict.fromkeys(DropReason, 0)
        self._skipped_debug = 0
        self._in_flight = 0
        self._degraded = False
        self._degraded_since = 0.0
        self._episode_failures = 0
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self._next_export_at = 0.0
        self._stopping = False
        self._flush_deadline = 0.0
        self._shutdown_started = False
        self._dispatcher: Dispatcher | None = None
        self._subscription: Subscription | None = None
        self._intake: threading.Thread | None = None
        self._worker = threading.Thread(
            target=self._run, name="skippy-telemetry-exporter", daemon=True
        )

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, dispatcher: Dispatcher, replay: bool = True) -> TelemetryExporter:
        """Subscribe (with `replay`, starting from what the dispatcher retained) and start the
        export thread."""
        self._dispatcher = dispatcher
        self._subscription = dispatcher.subscribe(
            "telemetry-exporter", max_queue_size=SUBSCRIPTION_QUEUE_SIZE, replay=replay
        )
        self._intake = run_callback_subscriber(
            dispatcher, self._subscription, self.accept, "telemetry-exporter"
        )
        self._worker.start()
        return self

    def shutdown(self, timeout_millis: int = DEFAULT_SHUTDOWN_TIMEOUT_MILLIS) -> bool:
        """Stop taking events, try to export what is buffered, stop the thread. Idempotent;
        returns within about `timeout_millis`. True when the export thread has ended. Whatever
        could not be exported in time is counted as `shutting_down`."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._cond:
            first = not self._shutdown_started
            self._shutdown_started = True
        if first:
            if self._dispatcher is not None and self._subscription is not None:
                self._dispatcher.unsubscribe(self._subscription)
            if self._intake is not None:
                self._intake.join(max(0.0, deadline - time.monotonic()))
            with self._cond:
                self._stopping = True
                self._flush_deadline = deadline
                self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(max(0.0, deadline - time.monotonic()))
        return not self._worker.is_alive()

    # -- intake (subscriber thread) -------------------------------------------------------------
    def accept(self, item: Dispatched) -> None:
        """Take one dispatched item into the buffer: O(1), never blocks on the collector."""
        if item.event.delivery is DeliveryClass.DEBUG:
            with self._cond:
                self._skipped_debug += 1
            return
        with self._cond:
            self._received += 1
            if self._stopping:
                self._dropped[DropReason.SHUTTING_DOWN] += 1
                return
            if len(self._buffer) >= self.config.max_queue_size:
                self._buffer.popleft()
                self._dropped[DropReason.QUEUE_FULL] += 1
            self._buffer.append(item)
            size = len(self._buffer)
            if size == 1 or size == self.config.max_export_batch_size:
                self._cond.notify()

    # -- export (worker thread) -----------------------------------------------------------------
    def _take_batch(self) -> list[Dispatched] | None:
        """Wait until a batch is due (full, or the interval since the last export passed, and
        not backing off); None once stopping."""
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                if now < self._backoff_until:
                    self._cond.wait(self._backoff_until - now)
                    continue
                if not self._buffer:
                    self._cond.wait()
                    if self._buffer:
                        self._next_export_at = max(self._next_export_at, time.monotonic())
                    continue
                full = len(self._buffer) >= self.config.max_export_batch_size
                if full or now >= self._next_export_at:
                    return self._pop_batch_locked()
                self._cond.wait(self._next_export_at - now)
            return None

    def _pop_batch_locked(self) -> list[Dispatched]:
        count = min(self.config.max_export_batch_size, len(self._buffer))
        batch = [self._buffer.popleft() for _ in range(count)]
        self._in_flight = count
        return batch

    def _run(self) -> None:
        interval_s = self.config.export_interval_millis / 1000
        self._next_export_at = time.monotonic() + interval_s
        while True:
            batch = self._take_batch()
            if batch is None:
                break
            self._export(batch, self.config.export_timeout_millis / 1000, report=True)
            with self._cond:
                self._next_export_at = time.monotonic() + interval_s
        self._flush()

    def _flush(self) -> None:
        """Shutdown: export what is buffered while time remains (not when degraded: a dead
        collector would only hold shutdown up); count the rest as `shutting_down`."""
        while True:
            with self._cond:
                left = self._flush_deadline - time.monotonic()
                if not self._buffer or self._degraded or left <= 0:
                    self._dropped[DropReason.SHUTTING_DOWN] += len(self._buffer)
                    self._buffer.clear()
                    return
                batch = self._pop_batch_locked()
            timeout_s = min(self.config.export_timeout_millis / 1000, left)
            self._export(batch, timeout_s, report=False)

    def _export(self, batch: list[Dispatched], timeout_s: float, report: bool) -> None:
        failure: FailureKind | None = None
        try:
            body = self._encode(batch)
            self._poster(self.config.endpoint, body, timeout_s)
        except _ExportFailed as error:
            failure = error.kind
        except Exception:  # noqa: BLE001 - the exporter must never die; count it as a failure
            failure = FailureKind.CONNECTION
        event: Event | None = None
        with self._cond:
            self._in_flight = 0
            if failure is None:
                self._exported += len(batch)
                self._batches += 1
                self._consecutive_failures = 0
                self._backoff_until = 0.0
                if self._degraded:
                    self._degraded = False
                    event = make_event(
                        EventId.TELEMETRY_EXPORTER_RECOVERED,
                        outcome=Outcome.SUCCESS,
                        duration_ms=(time.monotonic() - self._degraded_since) * 1000,
                        summaries=summaries(count=self._episode_failures),
                    )
            else:
                self._failures[failure] += 1
                self._dropped[DropReason.EXPORT_FAILED] += len(batch)
                self._consecutive_failures += 1
                backoff_ms = min(
                    self.config.max_backoff_millis,
                    self.config.export_interval_millis
                    * 2 ** min(self._consecutive_failures - 1, 30),
                )
                self._backoff_until = time.monotonic() + backoff_ms / 1000
                if self._degraded:
                    self._episode_failures += 1
                else:
                    self._degraded = True
                    self._degraded_since = time.monotonic()
                    self._episode_failures = 1
                    event = make_event(
                        EventId.TELEMETRY_EXPORTER_DEGRADED,
                        outcome=Outcome.FAILURE,
                        reason_code=_FAILURE_REASONS[failure],
                    )
        if event is not None and report:
            self._submit(event)

    def _encode(self, batch: list[Dispatched]) -> bytes:
        dispatcher = self._dispatcher
        return b"".join(
            dumps_line(
                event_record(
                    item.event,
                    item.sequence,
                    dispatcher.cursor(item.sequence) if dispatcher is not None else None,
                )
            )
            for item in batch
        )

    # -- counters -------------------------------------------------------------------------------
    def stats(self) -> ExporterStats:
        with self._cond:
            return ExporterStats(
                received=self._received,
                exported=self._exported,
                batches=self._batches,
                failures=dict(self._failures),
                dropped=dict(self._dropped),
                pending=len(self._buffer),
                in_flight=self._in_flight,
                skipped_debug=self._skipped_debug,
                degraded=self._degraded,
                endpoint=self.config.endpoint.display,
            )
