"""A real runtime (`skippyctl runtime serve`) exporting OTLP/HTTP, configured only by the
standard OTEL_* variables, to a real receiver on 127.0.0.1 that decodes every request with the
collector protos: load events and request events arrive as log records, the request as a span
tree, the counters as metrics, and no private byte leaves. A dead or stalled receiver costs
counters and one `telemetry_exporter_degraded`, never loading or serving."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from skippyctl.telemetry.metric_table import METRICS
from tests.api.conftest import Server, start_server, stop_server
from tests.telemetry.conftest import closed_port
from tests.telemetry.otlp_receiver import Receiver, attributes, log_bodies
from tests.telemetry.prometheus_text import families

CANARY = "okapi-canary-31d7c2"
HEADER_SECRET = "otlp-hdr-secret-9b2f"

FAST = {
    "OTEL_BLRP_SCHEDULE_DELAY": "50",
    "OTEL_BSP_SCHEDULE_DELAY": "50",
    "OTEL_METRIC_EXPORT_INTERVAL": "200",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5",  # seconds, as the Python SDK reads it
    "OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={HEADER_SECRET}",
    "OTEL_SERVICE_NAME": "skippy-otlp-test",
}


def _start(directory: Path, endpoint: str) -> Server:
    return start_server(directory, env={**FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})


def _counters(server: Server) -> dict[str, Any]:
    with server.http() as http:
        counters: dict[str, Any] = http.get("/api/runtime/state").json()["health"][
            "telemetry_exporter"
        ]
    return counters


def _wait_counters(server: Server, predicate: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the runtime's own counters (another process: there is no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counters = _counters(server)
        if predicate(counters):
            return counters
        assert time.monotonic() < deadline, counters
        time.sleep(0.05)


def _conserved(c: dict[str, Any]) -> bool:
    accounted = c["exported"] + sum(c["dropped"].values()) + c["pending"] + c["in_flight"]
    return bool(c["received"] == accounted)


def _complete(server: Server, prompt: str) -> httpx.Response:
    with server.http() as http:
        return http.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0},
        )


def _stop_in_order(server: Server) -> None:
    client = server.client()
    try:
        client.shutdown()
    finally:
        client.close()
    assert server.process.wait(30) == 0


def test_runtime_exports_logs_spans_and_metrics_without_private_data(
    tmp_path: Path, receiver: Receiver, fixture_dir: Path
) -> None:
    port = receiver.server.server_address[1]
    # Credentials in the endpoint (sent as Basic auth by the SDK's HTTP session) never show.
    server = _start(tmp_path / "runtime", f"http://otlp-user:pa55-secret@127.0.0.1:{port}")
    try:
        assert server.load(fixture_dir / "tiny.gguf")["state"] == "available"
        answer = _complete(server, f"{CANARY} tell nobody {CANARY}")
        assert answer.status_code == 200, answer.text
        receiver.wait_for(
            lambda r: (
                "request_completed" in log_bodies(r)
                and len([s for s in r.spans() if s.name == "skippy.request"]) == 1
                and len(r.spans()) == 4
                and any(
                    o.get("outcome") == "completed" for o, _ in r.metric_points("skippy.requests")
                )
            )
        )
        counters = _wait_counters(server, lambda c: c["signals"]["logs"]["exported"] > 0)
        with server.http() as http:
            surfaces = [
                http.get("/metrics").text,
                http.get("/api/runtime/state?recent=128").text,
                http.get("/health").text,
            ]
        surfaces.append(repr(server.events()))
        # The metric table: /metrics has every row; OTLP gets every row that has a sample.
        prometheus = families(surfaces[0])
        assert list(prometheus) == [m.prometheus for m in METRICS]
        sampled = {m.otlp for m in METRICS if prometheus[m.prometheus].samples}
        # all but KV cells used (no pressure) and the serving plugin rows (no plugin here)
        unsampled = {m.otlp for m in METRICS} - sampled
        assert unsampled <= {"skippy.kv.cells_used"} | {
            m.otlp for m in METRICS if m.otlp.startswith("skippy.plugin.")
        }, unsampled
        receiver.wait_for(lambda r: sampled <= r.metric_names())
        _stop_in_order(server)
    finally:
        stop_server(server)
    surfaces.append((server.directory / "serve.log").read_text(errors="replace"))

    # Logs: the load and the request, with their ids and severities, from the runtime's stream.
    records = receiver.log_records()
    bodies = [r.body.string_value for r in records]
    for event in ("runtime_initialized", "model_load_started", "model_available"):
        assert event in bodies
    for event in ("request_received", "prefill_completed", "generation_completed"):
        assert event in bodies
    by_body = {r.body.string_value: r for r in records}
    assert by_body["model_available"].severity_number == 9  # INFO
    assert by_body["model_available"].severity_text == "INFO"
    completed = attributes(by_body["request_completed"].attributes)
    assert completed["event"] == "request_completed" and completed["model_id"] == "tiny"
    assert completed["outcome"] == "success" and completed["schema_version"] == 1
    generated = attributes(by_body["generation_completed"].attributes)
    assert generated["summaries.generated_tokens"] >= 1
    assert "runtime_stopped" in bodies  # the orderly shutdown flushed the tail
    resource = attributes(
        receiver.accepted("/v1/logs")[0].request.resource_logs[0].resource.attributes
    )
    assert resource["service.name"] == "skippy-otlp-test"

    # Traces: one request, three children under it, ordered in time.
    spans = {s.name: s for s in receiver.spans()}
    root = spans["skippy.request"]
    fields = attributes(root.attributes)
    assert fields["model_id"] == "tiny" and fields["outcome"] == "success"
    assert fields["request_id"] == completed["request_id"]
    assert fields["prompt_tokens"] >= 1 and fields["generated_tokens"] >= 1
    assert fields["stop_reason"] in ("length", "eos", "stop")
    for name in ("queue", "prefill", "decode"):
        child = spans[name]
        assert child.trace_id == root.trace_id and child.parent_span_id == root.span_id
        assert root.start_time_unix_nano <= child.start_time_unix_nano
        assert child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= root.end_time_unix_nano
    assert spans["queue"].end_time_unix_nano <= spans["prefill"].start_time_unix_nano
    assert spans["prefill"].end_time_unix_nano <= spans["decode"].start_time_unix_nano
    assert by_body["request_completed"].trace_id == root.trace_id

    # Metrics: the table's rows, with the request counted.
    assert receiver.metric_names() <= {m.otlp for m in METRICS}
    assert any(
        o == {"model_id": "tiny", "outcome": "completed", "reason_code": "none"}
        for o, _ in receiver.metric_points("skippy.requests")
    )
    assert all(e.headers.get("x-api-key") == HEADER_SECRET for e in receiver.exports)
    basic = base64.b64encode(b"otlp-user:pa55-secret").decode()
    assert all(e.headers.get("Authorization") == f"Basic {basic}" for e in receiver.exports)

    # Local counters (`health.telemetry_exporter`): the sums, and each signal's.
    assert counters["protocol"] == "otlp" and counters["degraded"] is False
    assert counters["endpoint"] == receiver.url  # scheme://host:port only
    assert _conserved(counters)
    for signal in ("logs", "traces", "metrics"):
        assert _conserved(counters["signals"][signal])
    assert any(
        line.startswith('skippy_otlp_exported_total{signal="logs"}')
        for line in surfaces[0].splitlines()
    )

    # Privacy: no prompt, path or credential in any byte received, nor header anywhere local.
    raw = receiver.raw()
    assert CANARY.encode() not in raw and b"tell nobody" not in raw
    assert str(fixture_dir).encode() not in raw
    assert server.discovery.token.encode() not in raw
    assert HEADER_SECRET.encode() not in raw  # a header, not a body
    for text in surfaces:
        assert HEADER_SECRET not in text and CANARY not in text
        assert "pa55-secret" not in text and "otlp-user" not in text


class _Stalled:
    def __init__(self) -> None:
        self.receiver = Receiver("stall")
        self.url = self.receiver.url

    def stalled(self) -> bool:
        with self.receiver.changed:
            return any(e.status is None for e in self.receiver.exports)

    def close(self) -> None:
        self.receiver.close()


class _Closed:
    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{closed_port()}"

    def stalled(self) -> bool:
        return True

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("make", "kind", "reason"),
    [
        pytest.param(_Stalled, "timeout", "timeout", id="stalled"),
        pytest.param(_Closed, "connection", "unknown_failure", id="closed-port"),
    ],
)
def test_dead_or_stalled_receiver_never_stops_loading_or_serving(
    make: Any, kind: str, reason: str, tmp_path: Path, fixture_dir: Path
) -> None:
    endpoint = make()
    server = _start(tmp_path / "runtime", endpoint.url)
    try:
        assert server.load(fixture_dir / "tiny.gguf")["state"] == "available"
        deadline = time.monotonic() + 30
        while not endpoint.stalled():  # an export is hanging on the receiver right now
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Serving goes on while an export hangs, and keeps events flowing until several failed.
        while _counters(server)["signals"]["logs"]["failures"][kind] < 2:
            assert time.monotonic() < deadline, _counters(server)
            assert _complete(server, "hello there").status_code == 200
        counters = _counters(server)
        assert counters["degraded"] is True
        assert counters["signals"]["logs"]["dropped"]["export_failed"] >= 2
        assert counters["signals"]["logs"]["exported"] == 0
        assert _conserved(counters) and _conserved(counters["signals"]["logs"])
        events = server.events()
        kinds = [e["kind"] for e in events]
        degraded = [e for e in events if e["kind"] == "telemetry_exporter_degraded"]
        assert len(degraded) == 1, kinds
        assert degraded[0]["reason_code"] == reason
        assert "telemetry_exporter_recovered" not in kinds
        # The same condition as a structured warning and a degraded mode, once each.
        warnings = [e for e in events if e["kind"] == "warning_raised"]
        assert [w["state"]["current"] for w in warnings] == ["exporter_failing"], kinds
        assert warnings[0]["reason_code"] == reason
        entered = [e for e in events if e["kind"] == "degraded_operation_entered"]
        assert [e["state"]["current"] for e in entered] == ["telemetry_export_down"]
        with server.http() as http:
            metrics = http.get("/metrics").text
            state = http.get("/api/runtime/state").json()
        assert [w["code"] for w in state["warnings"]] == ["exporter_failing"]
        assert state["degraded_modes"] == ["telemetry_export_down"]
        assert 'skippy_otlp_export_failures_total{signal="logs",kind="' + kind + '"}' in metrics
        assert "skippy_otlp_exporter_degraded 1.0" in metrics
        assert state["event_system"]["exporter_degraded"] is True
        started = time.monotonic()
        _stop_in_order(server)
        assert time.monotonic() - started < 15  # shutdown is bounded, stalled or not
    finally:
        stop_server(server)
        endpoint.close()


def test_failing_receiver_degrades_then_recovers_once_it_answers(
    tmp_path: Path, receiver: Receiver, fixture_dir: Path
) -> None:
    receiver.set_mode("fail")
    server = _start(tmp_path / "runtime", receiver.url)
    try:
        _wait_counters(server, lambda c: c["degraded"] and c["failures"]["http_status"] >= 1)
        receiver.set_mode("ok")
        assert server.load(fixture_dir / "tiny.gguf")["state"] == "available"
        counters = _wait_counters(server, lambda c: not c["degraded"])
        assert _conserved(counters)
        receiver.wait_for(lambda r: "telemetry_exporter_recovered" in log_bodies(r))
        events = server.events()
        kinds = [e["kind"] for e in events]
        assert kinds.count("telemetry_exporter_degraded") == 1
        assert kinds.count("telemetry_exporter_recovered") == 1
        pair = [e for e in events if e["kind"] in ("warning_raised", "warning_cleared")]
        assert [e["kind"] for e in pair] == ["warning_raised", "warning_cleared"], kinds
        assert pair[0]["operation"]["root"] == pair[1]["operation"]["root"]
        assert kinds.count("degraded_operation_entered") == 1
        assert kinds.count("degraded_operation_exited") == 1
        records = {r.body.string_value: r for r in receiver.log_records()}
        assert records["telemetry_exporter_recovered"].severity_number == 9  # INFO
        # The degraded record itself travels like any event: exported if a later batch got
        # through, else counted in export_failed (it was queued while the receiver failed).
        if "telemetry_exporter_degraded" in records:
            assert records["telemetry_exporter_degraded"].severity_number >= 13  # WARN+
    finally:
        stop_server(server)
