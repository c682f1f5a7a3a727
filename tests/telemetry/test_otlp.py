"""OTLP in-process: configuration from the standard variables, exact ledger conservation, no
import cost when off, and the event → log / span mapping against a real OTLP/HTTP receiver fed
by a real dispatcher. Threads are synchronised on the receiver's condition, never on a sleep."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Final

import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    LogicalId,
    NumericSummary,
    Scope,
    StopReason,
    make_event,
    summaries,
)
from skippyctl.events.figures import SUMMARY_KEYS
from skippyctl.events.reasons import Outcome, ReasonCode, Severity
from skippyctl.pipeline.dispatch import Dispatcher
from skippyctl.telemetry.otlp import (
    BatchKnobs,
    DropReason,
    FailureKind,
    HealthTracker,
    OtlpConfig,
    Signal,
    SignalConfig,
    SignalLedger,
    TelemetryConfigError,
    otlp_config,
)
from tests.telemetry.otlp_receiver import Receiver, attributes, log_bodies

HEADER_SECRET = "hdr-secret-5c1e"


# -- configuration -------------------------------------------------------------------------------
def test_no_otlp_variable_means_no_otlp() -> None:
    assert otlp_config({}) is None
    assert otlp_config({"OTEL_SERVICE_NAME": "x", "OTEL_BLRP_SCHEDULE_DELAY": "5"}) is None


def test_sdk_disabled_wins_over_an_endpoint() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}
    assert otlp_config(environ) is None


def test_base_endpoint_turns_on_every_signal_with_the_standard_paths() -> None:
    config = otlp_config({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert config is not None
    assert [(s.signal, s.endpoint) for s in config.signals] == [
        (Signal.LOGS, "http://collector:4318/v1/logs"),
        (Signal.TRACES, "http://collector:4318/v1/traces"),
        (Signal.METRICS, "http://collector:4318/v1/metrics"),
    ]
    assert {s.display for s in config.signals} == {"http://collector:4318"}


def test_per_signal_endpoints_are_used_as_given_and_none_turns_a_signal_off() -> None:
    config = otlp_config(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t.example/custom",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
            "OTEL_METRICS_EXPORTER": "none",
        }
    )
    assert config is not None
    assert [(s.signal, s.endpoint) for s in config.signals] == [
        (Signal.LOGS, "http://base:4318/v1/logs"),
        (Signal.TRACES, "https://t.example/custom"),
    ]
    assert config.signal(Signal.TRACES) is not None
    assert config.signal(Signal.METRICS) is None


def test_batch_knobs_and_timeouts_come_from_the_standard_variables() -> None:
    config = otlp_config(
        {
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:1/v1/logs",
            "OTEL_BLRP_SCHEDULE_DELAY": "50",
            "OTEL_BLRP_MAX_QUEUE_SIZE": "64",
            "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE": "8",
            "OTEL_BLRP_EXPORT_TIMEOUT": "700",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
            "OTEL_METRIC_EXPORT_INTERVAL": "250",
        }
    )
    assert config is not None
    assert config.logs == BatchKnobs(50, 64, 8, 700)
    assert config.metric_export_interval_millis == 250
    logs = config.signal(Signal.LOGS)
    assert logs is not None and logs.timeout_s == pytest.approx(0.7)  # capped by the batch's


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://u:pw-secret@c/x"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://u:pw-secret@c:99999/x"},
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_QUEUE_SIZE": "pw-secret"},
            "OTEL_BSP_MAX_QUEUE_SIZE",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE": "9999"},
            "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "-1"},
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
    ],
)
def test_bad_configuration_names_the_variable_never_the_value(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(TelemetryConfigError) as raised:
        otlp_config(environ)
    assert named in str(raised.value)
    assert "pw-secret" not in str(raised.value)


def test_signal_config_repr_shows_no_path_or_credentials() -> None:
    signal = SignalConfig(Signal.LOGS, "https://u:pw-secret@c:4318/v1/logs?k=q", "https://c:4318")
    assert "pw-secret" not in repr(signal) and "/v1/logs" not in repr(signal)


def test_importing_the_telemetry_and_daemon_modules_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, skippyctl.telemetry.otlp, skippyctl.telemetry.metrics, "
        "skippyctl.telemetry.metric_table, skippyctl.daemon.serve; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- the ledger ----------------------------------------------------------------------------------
def _conserved(stats: Any) -> bool:
    return bool(
        stats.received
        == stats.exported + sum(stats.dropped.values()) + stats.pending + stats.in_flight
    )


def test_ledger_refuses_beyond_the_queue_bound_and_counts_every_item_exactly() -> None:
    results: list[tuple[Signal, FailureKind | None]] = []
    ledger = SignalLedger(Signal.LOGS, "http://c:1", 4, lambda s, f: results.append((s, f)))
    admitted = [ledger.admit() for _ in range(6)]
    assert admitted == [True] * 4 + [False] * 2
    stats = ledger.stats()
    assert stats.dropped[DropReason.QUEUE_FULL] == 2 and stats.pending == 4
    assert ledger.begin(3)
    assert ledger.admit() and ledger.admit() and ledger.admit()  # room again: 1 + 3 queued
    assert not ledger.admit()
    assert _conserved(ledger.stats()) and ledger.stats().in_flight == 3
    ledger.end(3, FailureKind.TIMEOUT)
    stats = ledger.stats()
    assert stats.dropped[DropReason.EXPORT_FAILED] == 3 and stats.failures[FailureKind.TIMEOUT] == 1
    assert stats.last_failed and results == [(Signal.LOGS, FailureKind.TIMEOUT)]
    assert ledger.begin(2)
    ledger.end(2, None)
    assert ledger.stats().exported == 2 and ledger.stats().batches == 1
    ledger.close()
    ledger.close()  # idempotent
    stats = ledger.stats()
    assert stats.pending == 0 and stats.dropped[DropReason.SHUTTING_DOWN] == 2
    assert not ledger.begin(2)  # handed over after closing: not sent, already counted
    assert not ledger.admit()
    assert ledger.stats().dropped[DropReason.SHUTTING_DOWN] == 3
    assert _conserved(ledger.stats())


def test_metric_points_are_received_when_handed_to_the_exporter() -> None:
    ledger = SignalLedger(Signal.METRICS, "http://c:1", 0)
    assert ledger.begin(10, admitted=False)
    ledger.end(10, None)
    ledger.close()
    assert not ledger.begin(5, admitted=False)
    stats = ledger.stats()
    assert (stats.received, stats.exported, stats.dropped[DropReason.SHUTTING_DOWN]) == (15, 10, 5)
    assert _conserved(stats)


def test_health_reports_transitions_only() -> None:
    submitted: list[Any] = []
    health = HealthTracker(submitted.append)
    health.on_result(Signal.LOGS, None)
    health.on_result(Signal.LOGS, FailureKind.TIMEOUT)
    health.on_result(Signal.TRACES, FailureKind.CONNECTION)
    health.on_result(Signal.LOGS, None)  # traces still failing: still degraded
    assert health.degraded
    health.on_result(Signal.TRACES, None)
    health.on_result(Signal.TRACES, None)
    assert [e.id for e in submitted] == [
        EventId.TELEMETRY_EXPORTER_DEGRADED,
        EventId.TELEMETRY_EXPORTER_RECOVERED,
    ]
    assert submitted[0].reason_code is ReasonCode.TIMEOUT
    assert submitted[1].summary_value(submitted[1].summaries[0].key) == 2


# -- against a real receiver ---------------------------------------------------------------------
def _config(url: str, **knobs: Any) -> OtlpConfig:
    fast = BatchKnobs(schedule_delay_millis=20, max_queue_size=256, max_export_batch_size=64)
    signals = tuple(
        SignalConfig(s, f"{url}/v1/{s.value}", url, timeout_s=1.0)
        for s in (Signal.LOGS, Signal.TRACES)
    )
    return OtlpConfig(signals=signals, logs=fast, traces=fast, **knobs)


EVERY_FIGURE: Final = tuple(
    NumericSummary(key, {"prompt_tokens": 5, "generated_tokens": 6}.get(key.value, 100 + index))
    for index, key in enumerate(SUMMARY_KEYS)
)
"""A generation terminal's summaries with every figure of events/figures.py, each distinct."""


def _request_events(request: str, model: str = "tiny") -> list[Any]:
    scope = Scope(
        model_id=LogicalId(model), session_id=LogicalId("s-1"), request_id=LogicalId(request)
    )
    t0 = 1_700_000_000_000_000_000
    ms = 1_000_000

    def at(step: int, event_id: EventId, **fields: Any) -> Any:
        return make_event(event_id, scope=scope, wall_ns=t0 + step * ms, **fields)

    return [
        at(0, EventId.REQUEST_RECEIVED),
        at(1, EventId.REQUEST_QUEUED, summaries=summaries(queue_depth=1)),
        at(2, EventId.REQUEST_ADMITTED, summaries=summaries(queue_wait_ms=2.0)),
        at(3, EventId.REQUEST_EXECUTION_STARTED),
        at(4, EventId.PROMPT_PROCESSING_STARTED),
        at(5, EventId.PREFILL_STARTED, summaries=summaries(prompt_tokens=5)),
        at(6, EventId.PREFILL_PROGRESS),
        at(7, EventId.PREFILL_COMPLETED, summaries=summaries(prompt_tokens=5), duration_ms=2.0),
        at(8, EventId.GENERATION_STARTED),
        at(9, EventId.FIRST_TOKEN_PRODUCED, summaries=summaries(time_to_first_token_ms=9.0)),
        at(
            12,
            EventId.GENERATION_COMPLETED,
            summaries=EVERY_FIGURE,
            outcome=Outcome.SUCCESS,
            stop_reason=StopReason.LENGTH,
        ),
        at(13, EventId.REQUEST_COMPLETED, outcome=Outcome.SUCCESS, duration_ms=13.0),
    ]


def test_events_become_log_records_and_a_request_becomes_a_span_tree(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {HEADER_SECRET}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "skippy-under-test")
    dispatcher = Dispatcher()
    submitted: list[Any] = []
    telemetry = OtlpTelemetry(_config(receiver.url), submit=submitted.append).start(dispatcher)
    try:
        dispatcher.publish_many(_request_events("r-1"))
        dispatcher.publish(make_event(EventId.WARNING_RAISED, severity=Severity.WARNING))
        receiver.wait_for(lambda r: len(r.spans()) == 4 and len(r.log_records()) == 13)
    finally:
        assert telemetry.shutdown(5000)

    # Headers are sent (the SDK read them) and never shown locally.
    assert all(
        e.headers.get("authorization") == f"Bearer {HEADER_SECRET}" for e in receiver.exports
    )
    assert HEADER_SECRET not in repr(telemetry.stats().as_dict()) + repr(telemetry)

    records = receiver.log_records()
    assert log_bodies(receiver)[:2] == ["request_received", "request_queued"]
    by_body = {r.body.string_value: r for r in records}
    warning = by_body["warning_raised"]
    assert (warning.severity_number, warning.severity_text) == (13, "WARNING")
    completed = by_body["generation_completed"]
    assert completed.severity_number == 9
    assert completed.time_unix_nano == 1_700_000_000_000_000_000 + 12_000_000
    fields = attributes(completed.attributes)
    assert fields["event"] == "generation_completed" and fields["category"] == "generation"
    assert fields["summaries.generated_tokens"] == 6 and fields["stop_reason"] == "length"
    assert fields["request_id"] == "r-1" and fields["seq"] == 11
    assert fields["cursor"] == f"rt1:{dispatcher.instance_id}:11"
    resource = attributes(
        receiver.accepted("/v1/logs")[0].request.resource_logs[0].resource.attributes
    )
    assert resource["service.name"] == "skippy-under-test"

    spans = {s.name: s for s in receiver.spans()}
    assert set(spans) == {"skippy.request", "queue", "prefill", "decode"}
    root = spans["skippy.request"]
    assert root.parent_span_id == b""
    for name in ("queue", "prefill", "decode"):
        child = spans[name]
        assert child.trace_id == root.trace_id and child.parent_span_id == root.span_id
        assert root.start_time_unix_nano <= child.start_time_unix_nano
        assert child.start_time_unix_nano <= child.end_time_unix_nano <= root.end_time_unix_nano
    assert spans["queue"].end_time_unix_nano <= spans["prefill"].start_time_unix_nano
    assert spans["prefill"].end_time_unix_nano <= spans["decode"].start_time_unix_nano
    root_fields = attributes(root.attributes)
    assert root_fields["model_id"] == "tiny" and root_fields["session_id"] == "s-1"
    assert root_fields["prompt_tokens"] == 5 and root_fields["generated_tokens"] == 6
    assert root_fields["stop_reason"] == "length" and root_fields["outcome"] == "success"
    # Every generation figure reaches the request span (the figures table, not a hand list).
    assert {s.key.value: root_fields.get(s.key.value) for s in EVERY_FIGURE} == {
        s.key.value: s.value for s in EVERY_FIGURE
    }
    assert root.status.code != 2  # not ERROR
    assert [e.name for e in spans["decode"].events] == ["first_token_produced"]
    # Logs of a request carry its trace: they correlate with the span tree.
    assert completed.trace_id == root.trace_id

    stats = telemetry.stats()
    assert _conserved(stats) and stats.exported == 17 and not stats.degraded
    assert stats.spans.ended == 1 and stats.spans.open_requests == 0
    assert submitted == []


def test_open_span_trees_are_bounded_and_evictions_counted(receiver: Receiver) -> None:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    dispatcher = Dispatcher()
    telemetry = OtlpTelemetry(
        _config(receiver.url, max_open_requests=2), submit=lambda _e: None
    ).start(dispatcher)
    try:
        for n in range(3):
            dispatcher.publish(_request_events(f"r-{n}")[0])  # received, never finished
        receiver.wait_for(lambda r: len(r.spans()) == 2)
        stats = telemetry.stats().spans
        assert (stats.started, stats.evicted, stats.open_requests) == (3, 1, 2)
    finally:
        telemetry.shutdown(5000)
    evicted = [s for s in receiver.spans() if attributes(s.attributes).get("skippy.span.evicted")]
    assert {s.name for s in evicted} == {"skippy.request"}
    assert telemetry.stats().spans.discarded_at_shutdown == 2


def test_a_failing_receiver_is_counted_and_reported_once_then_recovery(
    receiver: Receiver,
) -> None:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    receiver.set_mode("fail")
    dispatcher = Dispatcher()
    submitted: list[Any] = []
    seen = threading.Event()
    lock = threading.Lock()

    def submit(event: Any) -> None:
        with lock:
            submitted.append(event)
        seen.set()

    telemetry = OtlpTelemetry(_config(receiver.url), submit=submit).start(dispatcher)
    try:
        dispatcher.publish(make_event(EventId.WARNING_RAISED))
        assert seen.wait(30)
        seen.clear()
        stats = telemetry.stats()
        assert stats.degraded and stats.failures[FailureKind.HTTP_STATUS] >= 1
        assert stats.dropped[DropReason.EXPORT_FAILED] >= 1 and _conserved(stats)
        receiver.set_mode("ok")
        dispatcher.publish(make_event(EventId.WARNING_RAISED))
        assert seen.wait(30)
        assert not telemetry.stats().degraded
    finally:
        telemetry.shutdown(5000)
    with lock:
        ids = [e.id for e in submitted]
    assert ids == [EventId.TELEMETRY_EXPORTER_DEGRADED, EventId.TELEMETRY_EXPORTER_RECOVERED]
    assert submitted[0].reason_code is ReasonCode.UNKNOWN_FAILURE


def test_debug_evidence_is_never_exported_but_is_counted(receiver: Receiver) -> None:
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    dispatcher = Dispatcher()
    telemetry = OtlpTelemetry(_config(receiver.url), submit=lambda _e: None)
    try:
        debug, warning = dispatcher.publish_many(
            [make_event(EventId.GENERATION_TOKEN_OBSERVED), make_event(EventId.WARNING_RAISED)]
        )
        telemetry.accept(debug)  # called directly: this test is the intake thread
        telemetry.accept(warning)
        receiver.wait_for(lambda r: len(r.log_records()) == 1)
    finally:
        assert telemetry.shutdown(5000)
    assert log_bodies(receiver) == ["warning_raised"]
    stats = telemetry.stats()
    assert (stats.skipped_debug, stats.received, stats.exported) == (1, 1, 1)
    assert stats.as_dict()["skipped_debug"] == 1


def test_full_sdk_queue_refuses_the_newest_and_counts_every_item_exactly() -> None:
    """Through the real BatchLogRecordProcessor: while one export hangs on a stalled receiver,
    the gate keeps the SDK queue at its bound and counts each refused record; shutdown is
    bounded and counts what is left."""
    from skippyctl.telemetry.otlp_export import OtlpTelemetry

    stalled = Receiver("stall")
    knobs = BatchKnobs(schedule_delay_millis=20, max_queue_size=4, max_export_batch_size=2)
    logs = SignalConfig(Signal.LOGS, f"{stalled.url}/v1/logs", stalled.url, timeout_s=5.0)
    telemetry = OtlpTelemetry(OtlpConfig(signals=(logs,), logs=knobs), submit=lambda _e: None)
    dispatcher = Dispatcher()
    try:
        items = dispatcher.publish_many([make_event(EventId.WARNING_RAISED) for _ in range(11)])
        telemetry.accept(items[0])  # called directly: this test is the intake thread
        stalled.wait_for(lambda r: len(r.exports) == 1)  # that record's export now hangs
        for item in items[1:]:
            telemetry.accept(item)
        stats = telemetry.stats()
        assert stats.in_flight == 1 and stats.pending == 4
        assert stats.dropped[DropReason.QUEUE_FULL] == 6
        assert _conserved(stats)
        assert not telemetry.shutdown(300)  # the hanging export outlives it: bounded anyway
        stats = telemetry.stats()
        assert stats.dropped[DropReason.SHUTTING_DOWN] == 4 and stats.pending == 0
        assert stats.in_flight == 1 and _conserved(stats)
    finally:
        stalled.close()  # the hanging export gets its answer (a reset): the SDK can finish
    assert telemetry.shutdown(10_000)  # idempotent: the second call waits for the first's work
    assert _conserved(telemetry.stats()) and telemetry.stats().in_flight == 0
