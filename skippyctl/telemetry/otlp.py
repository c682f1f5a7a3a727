"""OTLP/HTTP telemetry: configuration from the standard `OTEL_*` variables, and the exact local
accounting of what the OpenTelemetry SDK was given, exported, failed or dropped.

This module imports nothing from OpenTelemetry: a runtime decides here, at no import cost,
whether OTLP is on. The SDK wiring (providers, processors, the event → log / span / metric
mapping) is `skippyctl.telemetry.otlp_export`, imported only when `otlp_config` returns a
configuration.

Configuration (the OpenTelemetry SDK environment specification; nothing project-specific):

- OTLP is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (base URL; `/v1/logs`, `/v1/traces`,
  `/v1/metrics` appended) or a per-signal `OTEL_EXPORTER_OTLP_{LOGS,TRACES,METRICS}_ENDPOINT`
  (used as given) is set, unless `OTEL_SDK_DISABLED=true`. A signal whose
  `OTEL_{LOGS,TRACES,METRICS}_EXPORTER` is `none` is off.
- Headers (`OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS`), compression and certificates are read by the
  SDK's exporter itself: header values never pass through this project's code, so they cannot
  reach an event, a metric, a stats record or a repr.
- Timeout: `OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT` in seconds (as the Python SDK reads it; the
  spec says milliseconds), capped by the batch/reader export timeout in milliseconds.
- Batching: `OTEL_BLRP_*` (logs) and `OTEL_BSP_*` (spans): `SCHEDULE_DELAY`, `MAX_QUEUE_SIZE`,
  `MAX_EXPORT_BATCH_SIZE`, `EXPORT_TIMEOUT` (milliseconds); metrics: `OTEL_METRIC_EXPORT_INTERVAL`
  and `OTEL_METRIC_EXPORT_TIMEOUT`. Parsed here (an invalid value is `invalid_configuration`
  at startup, naming the variable, never echoing a value) and passed to the SDK explicitly.
- Resource: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` (default `service.name=skippyctl`).
- Only `http/protobuf` is spoken; `OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL` set to anything else is
  `invalid_configuration` rather than a silent change of protocol.

Accounting (`SignalLedger`), per signal, exact at every snapshot:
`received == exported + sum(dropped) + pending + in_flight`. The SDK's batch processors drop
silently when full and ignore export results, so the ledger sits on both sides of them: a gate
in front admits an item only while fewer than `max_queue_size` admitted items have not yet been
handed to the exporter (the SDK queue therefore never overflows; a refused item is counted
`queue_full` — the newest is refused, the SDK's queue keeps what it holds), and the exporter
reports each batch's start and result (`export_failed` with a `FailureKind`).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, make_event, summaries
from skippyctl.events.reasons import Outcome, ReasonCode

SDK_DISABLED_ENV: Final = "OTEL_SDK_DISABLED"
ENDPOINT_ENV: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOL_ENV: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
TIMEOUT_ENV: Final = "OTEL_EXPORTER_OTLP_TIMEOUT"
DEFAULT_TIMEOUT_S: Final = 10.0
SUPPORTED_PROTOCOL: Final = "http/protobuf"

DEFAULT_SERVICE_NAME: Final = "skippyctl"
DEFAULT_SHUTDOWN_TIMEOUT_MILLIS: Final = 2000
DEFAULT_MAX_OPEN_REQUESTS: Final = 1024
"""Requests with an open span tree; beyond it the oldest is ended early and counted."""


class TelemetryConfigError(ValueError):
    """The telemetry configuration is invalid (`invalid_configuration`). The message names the
    variable, never its value: an endpoint may carry credentials."""


class DropReason(StrEnum):
    """Why an item the exporter was given was not exported (metric label values)."""

    QUEUE_FULL = "queue_full"
    """The signal's queue was full: the newest item was refused."""
    EXPORT_FAILED = "export_failed"
    """It was in a batch the collector refused, or that failed or timed out."""
    SHUTTING_DOWN = "shutting_down"
    """It was still queued when shutdown's time ran out (or the exporter was degraded)."""


class FailureKind(StrEnum):
    """What went wrong with one export request (metric label values)."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    """Refused, reset, unresolvable host, TLS failure, malformed answer."""
    HTTP_STATUS = "http_status"
    """The collector answered, but not with 2xx."""


class Signal(StrEnum):
    LOGS = "logs"
    TRACES = "traces"
    METRICS = "metrics"


_SIGNAL_ENV_NAME: Final = {Signal.LOGS: "LOGS", Signal.TRACES: "TRACES", Signal.METRICS: "METRICS"}

_FAILURE_REASONS: Final = {
    FailureKind.TIMEOUT: ReasonCode.TIMEOUT,
    FailureKind.CONNECTION: ReasonCode.UNKNOWN_FAILURE,
    FailureKind.HTTP_STATUS: ReasonCode.UNKNOWN_FAILURE,
}


@dataclass(frozen=True, slots=True)
class BatchKnobs:
    """One batch processor's bounds (the SDK's names and units)."""

    schedule_delay_millis: int = 5000
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    export_timeout_millis: int = 30_000


@dataclass(frozen=True, slots=True)
class SignalConfig:
    signal: Signal
    endpoint: str
    """The full signal URL handed to the SDK exporter (may carry credentials: never shown)."""
    display: str
    """scheme://host:port only: what stats and messages show."""
    timeout_s: float = 10.0
    """One export's bound: OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT (seconds, as the Python SDK reads
    it), capped by the processor's / reader's export timeout (milliseconds, the spec's unit), which
    the SDK itself does not enforce."""

    def __repr__(self) -> str:
        return f"SignalConfig({self.signal.value}, {self.display})"


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    signals: tuple[SignalConfig, ...]
    logs: BatchKnobs = BatchKnobs()
    traces: BatchKnobs = BatchKnobs()
    metric_export_interval_millis: int = 60_000
    metric_export_timeout_millis: int = 30_000
    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS

    def signal(self, signal: Signal) -> SignalConfig | None:
        return next((s for s in self.signals if s.signal is signal), None)


def display_url(url: str, variable: str) -> str:
    """scheme://host:port of an http(s) URL; TelemetryConfigError (naming `variable`, never
    the value) when it is not one."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise TelemetryConfigError(
            f"{variable} is not a valid URL (bad port or address)"
        ) from error
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TelemetryConfigError(f"{variable} must be an http:// or https:// URL")
    host = parts.hostname
    if not host:
        raise TelemetryConfigError(f"{variable} has no host")
    if port is None:
        port = 443 if scheme == "https" else 80
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _int_knob(environ: Mapping[str, str], variable: str, default: int, minimum: int = 1) -> int:
    value = environ.get(variable, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError as error:
        raise TelemetryConfigError(f"{variable} must be an integer") from error
    if number < minimum:
        raise TelemetryConfigError(f"{variable} must be at least {minimum}")
    return number


def _batch_knobs(environ: Mapping[str, str], prefix: str) -> BatchKnobs:
    defaults = BatchKnobs()
    knobs = BatchKnobs(
        schedule_delay_millis=_int_knob(
            environ, f"{prefix}_SCHEDULE_DELAY", defaults.schedule_delay_millis
        ),
        max_queue_size=_int_knob(environ, f"{prefix}_MAX_QUEUE_SIZE", defaults.max_queue_size),
        max_export_batch_size=_int_knob(
            environ, f"{prefix}_MAX_EXPORT_BATCH_SIZE", defaults.max_export_batch_size
        ),
        export_timeout_millis=_int_knob(
            environ, f"{prefix}_EXPORT_TIMEOUT", defaults.export_timeout_millis
        ),
    )
    if knobs.max_export_batch_size > knobs.max_queue_size:
        raise TelemetryConfigError(
            f"{prefix}_MAX_EXPORT_BATCH_SIZE must not exceed {prefix}_MAX_QUEUE_SIZE"
        )
    return knobs


def otlp_config(environ: Mapping[str, str]) -> OtlpConfig | None:
    """The OTLP configuration the environment asks for, or None (OTLP off: nothing of the SDK
    is imported). Raises TelemetryConfigError."""
    if environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true":
        return None
    base = environ.get(ENDPOINT_ENV, "").strip()
    signals: list[SignalConfig] = []
    for signal in Signal:
        name = _SIGNAL_ENV_NAME[signal]
        if environ.get(f"OTEL_{name}_EXPORTER", "").strip().lower() == "none":
            continue
        variable = f"OTEL_EXPORTER_OTLP_{name}_ENDPOINT"
        url = environ.get(variable, "").strip()
        if not url and base:
            variable = ENDPOINT_ENV
            url = f"{base.removesuffix('/')}/v1/{signal.value}"
        if not url:
            continue
        protocol_variable = f"OTEL_EXPORTER_OTLP_{name}_PROTOCOL"
        protocol = environ.get(protocol_variable, "").strip() or environ.get(PROTOCOL_ENV, "")
        if protocol.strip() not in ("", SUPPORTED_PROTOCOL):
            raise TelemetryConfigError(
                f"{protocol_variable} / {PROTOCOL_ENV}: only {SUPPORTED_PROTOCOL} is supported"
            )
        signals.append(SignalConfig(signal, url, display_url(url, variable)))
    if not signals:
        return None
    logs = _batch_knobs(environ, "OTEL_BLRP")
    traces = _batch_knobs(environ, "OTEL_BSP")
    interval = _int_knob(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60_000)
    metric_timeout = _int_knob(environ, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000)
    caps = {
        Signal.LOGS: logs.export_timeout_millis,
        Signal.TRACES: traces.export_timeout_millis,
        Signal.METRICS: metric_timeout,
    }
    bounded = tuple(
        SignalConfig(
            s.signal,
            s.endpoint,
            s.display,
            min(_timeout_s(environ, s.signal), caps[s.signal] / 1000),
        )
        for s in signals
    )
    return OtlpConfig(
        signals=bounded,
        logs=logs,
        traces=traces,
        metric_export_interval_millis=interval,
        metric_export_timeout_millis=metric_timeout,
    )


def _timeout_s(environ: Mapping[str, str], signal: Signal) -> float:
    """The exporter timeout the SDK would use (seconds), validated."""
    for variable in (f"OTEL_EXPORTER_OTLP_{_SIGNAL_ENV_NAME[signal]}_TIMEOUT", TIMEOUT_ENV):
        value = environ.get(variable, "").strip()
        if not value:
            continue
        try:
            seconds = float(value)
        except ValueError as error:
            raise TelemetryConfigError(f"{variable} must be a number of seconds") from error
        if not seconds > 0:
            raise TelemetryConfigError(f"{variable} must be positive")
        return seconds
    return DEFAULT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class SignalStats:
    """One signal's counters; `received == exported + sum(dropped) + pending + in_flight`.
    Items are log records (logs), spans (traces) or metric data points (metrics)."""

    signal: Signal
    endpoint: str
    received: int
    exported: int
    batches: int
    failures: dict[FailureKind, int]
    dropped: dict[DropReason, int]
    pending: int
    in_flight: int
    last_failed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "received": self.received,
            "exported": self.exported,
            "batches": self.batches,
            "failures": {kind.value: n for kind, n in self.failures.items()},
            "dropped": {reason.value: n for reason, n in self.dropped.items()},
            "pending": self.pending,
            "in_flight": self.in_flight,
            "last_failed": self.last_failed,
        }


@dataclass(frozen=True, slots=True)
class SpanStats:
    """The request span builder: bounded open trees, evictions counted."""

    open_requests: int
    started: int
    ended: int
    evicted: int
    discarded_at_shutdown: int
    unmatched_events: int

    def as_dict(self) -> dict[str, int]:
        return {
            "open_requests": self.open_requests,
            "started": self.started,
            "ended": self.ended,
            "evicted": self.evicted,
            "discarded_at_shutdown": self.discarded_at_shutdown,
            "unmatched_events": self.unmatched_events,
        }


@dataclass(frozen=True, slots=True)
class OtlpStats:
    """The OTLP exporter's local view, the state document's `health.telemetry_exporter`.
    Top-level counters are the sums over signals; `signals` has each one; `spans` the request
    span builder."""

    degraded: bool
    signals: tuple[SignalStats, ...]
    spans: SpanStats
    skipped_debug: int

    def _sum(self, name: str) -> int:
        return sum(int(getattr(s, name)) for s in self.signals)

    @property
    def received(self) -> int:
        return self._sum("received")

    @property
    def exported(self) -> int:
        return self._sum("exported")

    @property
    def pending(self) -> int:
        return self._sum("pending")

    @property
    def in_flight(self) -> int:
        return self._sum("in_flight")

    @property
    def failures(self) -> dict[FailureKind, int]:
        return {kind: sum(s.failures[kind] for s in self.signals) for kind in FailureKind}

    @property
    def dropped(self) -> dict[DropReason, int]:
        return {reason: sum(s.dropped[reason] for s in self.signals) for reason in DropReason}

    def as_dict(self) -> dict[str, Any]:
        endpoints = sorted({s.endpoint for s in self.signals})
        return {
            "protocol": "otlp",
            "endpoint": endpoints[0] if len(endpoints) == 1 else ", ".join(endpoints),
            "degraded": self.degraded,
            "received": self.received,
            "exported": self.exported,
            "batches": self._sum("batches"),
            "failures": {kind.value: n for kind, n in self.failures.items()},
            "dropped": {reason.value: n for reason, n in self.dropped.items()},
            "pending": self.pending,
            "in_flight": self.in_flight,
            "skipped_debug": self.skipped_debug,
            "signals": {s.signal.value: s.as_dict() for s in self.signals},
            "spans": self.spans.as_dict(),
        }


class SignalLedger:
    """Exact counters around one signal's SDK pipeline (thread-safe; every method O(1)).

    `admit` is the gate in front of the SDK batch processor (called on the intake thread);
    `begin`/`end` bracket each exporter call (on the SDK's worker thread); `close` ends the
    ledger at shutdown: what was admitted and not yet handed over is counted `shutting_down`,
    and a batch handed over later is refused (the exporter then sends nothing).
    """

    def __init__(
        self,
        signal: Signal,
        display: str,
        max_queue_size: int,
        on_result: Callable[[Signal, FailureKind | None], None] | None = None,
    ) -> None:
        self.signal = signal
        self.display = display
        self.max_queue_size = max_queue_size
        self._on_result = on_result
        self._lock = threading.Lock()
        self._received = 0
        self._admitted = 0
        self._handed = 0
        self._abandoned = 0
        """Admitted, never handed over, counted `shutting_down` at close."""
        self._exported = 0
        self._batches = 0
        self._failed_items = 0
        self._failures = dict.fromkeys(FailureKind, 0)
        self._dropped = dict.fromkeys(DropReason, 0)
        self._closed = False
        self._last_failed = False

    def admit(self) -> bool:
        """One item offered: True if it may enter the SDK queue (there is room for it)."""
        with self._lock:
            self._received += 1
            if self._closed:
                self._dropped[DropReason.SHUTTING_DOWN] += 1
                return False
            if self._admitted - self._handed - self._abandoned >= self.max_queue_size:
                self._dropped[DropReason.QUEUE_FULL] += 1
                return False
            self._admitted += 1
            return True

    def begin(self, count: int, admitted: bool = True) -> bool:
        """A batch of `count` items reaches the exporter; False: the ledger is closed, do not
        send (those items were counted `shutting_down`). `admitted=False` is for items that
        never passed `admit` (metric points: no queue): they are received here."""
        with self._lock:
            if self._closed:
                if not admitted:
                    self._received += count
                    self._dropped[DropReason.SHUTTING_DOWN] += count
                return False
            if not admitted:
                self._received += count
                self._admitted += count
            self._handed += count
            return True

    def end(self, count: int, failure: FailureKind | None) -> None:
        with self._lock:
            if failure is None:
                self._exported += count
                self._batches += 1
            else:
                self._failed_items += count
                self._failures[failure] += 1
                self._dropped[DropReason.EXPORT_FAILED] += count
            self._last_failed = failure is not None
        if self._on_result is not None:
            self._on_result(self.signal, failure)

    def close(self) -> None:
        """Idempotent: count what never reached the exporter as `shutting_down`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._abandoned = self._admitted - self._handed
            self._dropped[DropReason.SHUTTING_DOWN] += self._abandoned

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def stats(self) -> SignalStats:
        with self._lock:
            return SignalStats(
                signal=self.signal,
                endpoint=self.display,
                received=self._received,
                exported=self._exported,
                batches=self._batches,
                failures=dict(self._failures),
                dropped=dict(self._dropped),
                pending=self._admitted - self._handed - self._abandoned,
                in_flight=self._handed - self._exported - self._failed_items,
                last_failed=self._last_failed,
            )


class HealthTracker:
    """Degraded while the latest export of any signal failed. Submits
    `telemetry_exporter_degraded` on the first failure after a start or a recovery, and
    `telemetry_exporter_recovered` once every signal's latest export succeeded: transitions
    only, so it cannot storm (each needs a flip; exports are paced by the SDK schedules)."""

    def __init__(self, submit: Callable[[Event], object]) -> None:
        self._submit = submit
        self._lock = threading.Lock()
        self._failing: set[Signal] = set()
        self._degraded = False
        self._since = 0.0
        self._episode_failures = 0
        self.quiet = False
        """Set at shutdown: transitions are still tracked but no longer submitted."""

    @property
    def degraded(self) -> bool:
        with self._lock:
            return self._degraded

    def on_result(self, signal: Signal, failure: FailureKind | None) -> None:
        event: Event | None = None
        with self._lock:
            if failure is None:
                self._failing.discard(signal)
                if self._degraded and not self._failing:
                    self._degraded = False
                    event = make_event(
                        EventId.TELEMETRY_EXPORTER_RECOVERED,
                        outcome=Outcome.SUCCESS,
                        duration_ms=round((time.monotonic() - self._since) * 1000, 3),
                        summaries=summaries(count=self._episode_failures),
                    )
            else:
                self._failing.add(signal)
                if self._degraded:
                    self._episode_failures += 1
                else:
                    self._degraded = True
                    self._since = time.monotonic()
                    self._episode_failures = 1
                    event = make_event(
                        EventId.TELEMETRY_EXPORTER_DEGRADED,
                        outcome=Outcome.FAILURE,
                        reason_code=_FAILURE_REASONS[failure],
                    )
            quiet = self.quiet
        if event is not None and not quiet:
            self._submit(event)
