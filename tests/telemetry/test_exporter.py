"""The exporter in-process: buffer bounds and exact conservation, health transitions, endpoint
validation and redaction. Threads are synchronised with threading.Event / conditions."""

from __future__ import annotations

import base64
import ssl
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, make_event
from skippyctl.pipeline.dispatch import Dispatched, Dispatcher
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.telemetry.exporter import (
    DropReason,
    Endpoint,
    ExporterConfig,
    ExporterStats,
    FailureKind,
    TelemetryConfigError,
    TelemetryExporter,
    _tls_context,
    exporter_config,
    parse_endpoint,
    post_ndjson,
)
from skippyctl.telemetry.metrics import MetricsCollector
from tests.telemetry.conftest import Collector, closed_port, has_event


def _conserved(stats: ExporterStats) -> bool:
    return stats.received == (
        stats.exported + sum(stats.dropped.values()) + stats.pending + stats.in_flight
    )


def _item(sequence: int) -> Dispatched:
    return Dispatched(sequence, make_event(EventId.WARNING_RAISED))


def test_full_buffer_drops_the_oldest_and_counts_every_event_exactly() -> None:
    entered = threading.Event()
    release = threading.Event()
    bodies: list[bytes] = []

    def poster(_endpoint: Endpoint, body: bytes, _timeout_s: float) -> None:
        bodies.append(body)
        entered.set()
        release.wait(10)

    config = ExporterConfig(
        parse_endpoint("http://127.0.0.1:9/x"),
        max_queue_size=8,
        max_export_batch_size=4,
        export_interval_millis=1,
    )
    exporter = TelemetryExporter(config, submit=lambda _e: None, poster=poster)
    exporter.start(Dispatcher(), replay=False)
    try:
        exporter.accept(_item(1))
        assert entered.wait(10)  # the first batch (one event) is stuck in flight
        for sequence in range(2, 22):
            exporter.accept(_item(sequence))
        stats = exporter.stats()
        assert (stats.received, stats.in_flight, stats.pending) == (21, 1, 8)
        assert stats.dropped[DropReason.QUEUE_FULL] == 12
        assert _conserved(stats)
        release.set()
    finally:
        assert exporter.shutdown(timeout_millis=5000)
    stats = exporter.stats()
    assert stats.exported == 9 and stats.pending == 0 and stats.in_flight == 0
    assert stats.dropped == {
        DropReason.QUEUE_FULL: 12,
        DropReason.EXPORT_FAILED: 0,
        DropReason.SHUTTING_DOWN: 0,
    }
    assert _conserved(stats)
    sequences = [orjson.loads(line)["seq"] for body in bodies for line in body.splitlines()]
    assert sequences == [1, *range(14, 22)]  # the oldest were dropped, order kept


def test_shutdown_is_idempotent_bounded_and_counts_what_it_could_not_send() -> None:
    stuck = threading.Event()

    def poster(_endpoint: Endpoint, _body: bytes, _timeout_s: float) -> None:
        stuck.wait(10)

    config = ExporterConfig(parse_endpoint("http://127.0.0.1:9/x"), export_interval_millis=1)
    exporter = TelemetryExporter(config, submit=lambda _e: None, poster=poster)
    exporter.start(Dispatcher(), replay=False)
    for sequence in range(1, 6):
        exporter.accept(_item(sequence))
    started = time.monotonic()
    assert not exporter.shutdown(timeout_millis=200)  # the POST is still blocked
    assert time.monotonic() - started < 2
    assert not exporter.shutdown(timeout_millis=0)  # again: no error, no second teardown
    stuck.set()
    assert exporter.shutdown(timeout_millis=5000)
    stats = exporter.stats()
    assert _conserved(stats)
    assert stats.pending == 0 and stats.in_flight == 0


def _watch(pipeline: Pipeline) -> tuple[list[Event], threading.Condition]:
    seen: list[Event] = []
    changed = threading.Condition()
    subscription = pipeline.subscribe("test-watch", max_queue_size=100_000)

    def loop() -> None:
        from skippyctl.pipeline.dispatch import SubscriptionClosed

        while True:
            try:
                item = subscription.get(0.2)
            except SubscriptionClosed:
                return
            if item is not None:
                with changed:
                    seen.append(item.event)
                    changed.notify_all()

    threading.Thread(target=loop, name="test-watch", daemon=True).start()
    return seen, changed


def _ids(events: list[Event], event_id: EventId) -> list[Event]:
    return [e for e in events if e.id is event_id]


def test_failing_then_healthy_collector_degrades_once_then_recovers() -> None:
    collector = Collector("fail")
    pipeline = Pipeline().start()
    seen, changed = _watch(pipeline)
    config = exporter_config(
        collector.url,
        {
            "SKIPPY_TELEMETRY_EXPORT_INTERVAL_MILLIS": "10",
            "SKIPPY_TELEMETRY_MAX_BACKOFF_MILLIS": "40",
        },
    )
    exporter = TelemetryExporter(config, submit=pipeline.submit).start(pipeline.dispatcher)
    try:
        for count in range(1, 6):  # five failed batches, one event at a time
            pipeline.submit(make_event(EventId.WARNING_RAISED))
            collector.wait_for(lambda posts, count=count: len(posts) >= count)
        with changed:
            assert changed.wait_for(
                lambda: _ids(seen, EventId.TELEMETRY_EXPORTER_DEGRADED), timeout=10
            )
        assert pipeline.wait_state(lambda s: s.event_system.exporter_degraded, 10) is not None
        pipeline.submit(make_event(EventId.WARNING_RAISED))
        collector.set_mode("ok")
        with changed:
            assert changed.wait_for(
                lambda: _ids(seen, EventId.TELEMETRY_EXPORTER_RECOVERED), timeout=10
            )
        assert pipeline.wait_state(lambda s: not s.event_system.exporter_degraded, 10) is not None
        # The recovery is exported (once), and nothing storms afterwards.
        collector.wait_for(has_event("telemetry_exporter_recovered"))
        stats = exporter.stats()
        assert stats.failures[FailureKind.HTTP_STATUS] >= 4
        assert stats.dropped[DropReason.EXPORT_FAILED] >= 4
        assert not stats.degraded and stats.exported >= 1
        assert _conserved(stats)
    finally:
        exporter.shutdown()
        pipeline.shutdown()
        collector.close()
    degraded = _ids(seen, EventId.TELEMETRY_EXPORTER_DEGRADED)
    recovered = _ids(seen, EventId.TELEMETRY_EXPORTER_RECOVERED)
    assert len(degraded) == 1 and len(recovered) == 1
    assert degraded[0].reason_code is not None and degraded[0].reason_code.value == (
        "unknown_failure"
    )
    exported = [r["event"] for r in collector.records()]
    assert exported.count("telemetry_exporter_recovered") == 1


def test_metrics_render_exporter_counters_with_bounded_labels() -> None:
    config = ExporterConfig(parse_endpoint(f"http://u:pw-secret@127.0.0.1:{closed_port()}/x?k=q"))
    exporter = TelemetryExporter(config, submit=lambda _e: None)
    metrics = MetricsCollector()
    metrics.exporter = exporter
    pipeline = Pipeline()
    text = metrics.render(pipeline.state, pipeline.health())
    assert "skippy_telemetry_exported_events_total 0.0" in text
    for reason in ("queue_full", "export_failed", "shutting_down"):
        assert f'skippy_telemetry_dropped_events_total{{reason="{reason}"}} 0.0' in text
    for kind in ("timeout", "connection", "http_status"):
        assert f'skippy_telemetry_export_failures_total{{kind="{kind}"}} 0.0' in text
    assert "pw-secret" not in text and "k=q" not in text
    assert "skippy_telemetry" not in MetricsCollector().render(pipeline.state, pipeline.health())


def test_post_to_a_closed_port_or_stalled_server_fails_within_the_timeout() -> None:
    with pytest.raises(Exception, match="connection"):
        post_ndjson(parse_endpoint(f"http://127.0.0.1:{closed_port()}/"), b"{}\n", 1.0)
    stalled = Collector("stall")
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match="timeout"):
            post_ndjson(parse_endpoint(stalled.url), b"{}\n", 0.3)
        assert time.monotonic() - started < 2.0
    finally:
        stalled.close()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://user:pw-secret@example.com/x",
        "http://",
        "https:///path-only",
        "example.com:4318",
        "http://example.com:99999/x",
        "",
        "  ",
    ],
)
def test_invalid_endpoints_are_refused_without_repeating_the_url(url: str) -> None:
    with pytest.raises(TelemetryConfigError) as refused:
        exporter_config(url)
    assert "pw-secret" not in str(refused.value) and "example" not in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SKIPPY_TELEMETRY_EXPORT_TIMEOUT_MILLIS", "soon"),
        ("SKIPPY_TELEMETRY_MAX_QUEUE_SIZE", "0"),
        ("SKIPPY_TELEMETRY_MAX_EXPORT_BATCH_SIZE", "9999"),
    ],
)
def test_invalid_knobs_are_refused(variable: str, value: str) -> None:
    with pytest.raises(TelemetryConfigError):
        exporter_config("http://127.0.0.1:4318/", {variable: value})


def test_endpoint_credentials_become_basic_auth_and_never_show() -> None:
    endpoint = parse_endpoint("HTTPS://us%40er:pw-secret@collector.local/v1/ingest?token=q-secret")
    assert (endpoint.scheme, endpoint.host, endpoint.port) == ("https", "collector.local", 443)
    assert endpoint.target == "/v1/ingest?token=q-secret"
    assert endpoint.authorization == "Basic " + base64.b64encode(b"us@er:pw-secret").decode()
    assert endpoint.display == "https://collector.local:443"
    for shown in (repr(endpoint), repr(ExporterConfig(endpoint)), endpoint.display):
        assert "secret" not in shown
    assert parse_endpoint("http://[::1]:4318").display == "http://[::1]:4318"


def test_debug_evidence_is_never_exported_but_is_counted() -> None:
    posted = threading.Event()
    bodies: list[bytes] = []

    def poster(_endpoint: Endpoint, body: bytes, _timeout_s: float) -> None:
        bodies.append(body)
        posted.set()

    config = ExporterConfig(parse_endpoint("http://127.0.0.1:9/x"), export_interval_millis=1)
    exporter = TelemetryExporter(config, submit=lambda _e: None, poster=poster)
    exporter.start(Dispatcher(), replay=False)
    try:
        exporter.accept(Dispatched(1, make_event(EventId.GENERATION_TOKEN_OBSERVED)))
        exporter.accept(_item(2))
        assert posted.wait(10)
    finally:
        assert exporter.shutdown(timeout_millis=5000)
    stats = exporter.stats()
    assert (stats.skipped_debug, stats.received, stats.exported) == (1, 1, 1)
    assert [orjson.loads(line)["seq"] for b in bodies for line in b.splitlines()] == [2]


def test_https_collector_is_verified_against_the_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    collector = Collector("ok", tls=tls)
    endpoint = parse_endpoint(collector.url)
    try:
        _tls_context.cache_clear()
        with pytest.raises(Exception, match="connection"):  # self-signed: not trusted
            post_ndjson(endpoint, b'{"event":"x"}\n', 5.0)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        _tls_context.cache_clear()
        post_ndjson(endpoint, b'{"event":"x"}\n', 5.0)
        collector.wait_for(lambda posts: any(p.status == 204 for p in posts))
    finally:
        _tls_context.cache_clear()
        collector.close()
