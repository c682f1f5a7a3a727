"""A real runtime (`skippyctl runtime serve`) pushing to real collectors on 127.0.0.1: a healthy
one receives privacy-safe NDJSON; a stalled, failing or absent one costs counters and one
`telemetry_exporter_degraded`, never loading or serving."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skippyctl.events.catalog import EventId
from tests.api.conftest import Server, start_server, stop_server
from tests.telemetry.conftest import FAST_KNOBS, Collector, closed_port, has_event

CANARY = "zebra-canary-7f3a91"


def _exporter_counters(server: Server) -> dict[str, Any]:
    with server.http() as http:
        counters: dict[str, Any] = http.get("/api/runtime/state").json()["health"][
            "telemetry_exporter"
        ]
    return counters


def _wait_counters(server: Server, predicate: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the runtime's own counters until `predicate` holds (the runtime is another process:
    there is no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counters = _exporter_counters(server)
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


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _stop_in_order(server: Server) -> None:
    """`skippyctl runtime stop`'s path (the shutdown API): the host's orderly shutdown runs,
    exporter flush included. (SIGTERM does not reach it: uvicorn re-raises the signal after its
    own graceful shutdown, which ends the process before `serve`'s `finally`.)"""
    client = server.client()
    try:
        client.shutdown()
    finally:
        client.close()
    assert server.process.wait(30) == 0


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    return tmp_path / "runtime"


def _start(directory: Path, endpoint: str, *, via_env: bool = False) -> Server:
    env = dict(FAST_KNOBS)
    extra: list[str] = []
    if via_env:
        env["SKIPPY_TELEMETRY_ENDPOINT"] = endpoint
    else:
        extra = ["--telemetry-endpoint", endpoint]
    return start_server(directory, *extra, env=env)


@pytest.fixture
def healthy(
    runtime_dir: Path, collector: Collector, fixture_dir: Path
) -> Iterator[tuple[Server, Collector]]:
    port = collector.server.server_address[1]
    endpoint = f"http://tele-user:pa55-secret@127.0.0.1:{port}/ingest?token=q-secret"
    server = _start(runtime_dir, endpoint)
    try:
        assert server.load(fixture_dir / "tiny.gguf")["state"] == "available"
        yield server, collector
    finally:
        stop_server(server)


def test_healthy_collector_receives_event_records_without_private_data(
    healthy: tuple[Server, Collector], fixture_dir: Path
) -> None:
    server, collector = healthy
    answer = _complete(server, f"{CANARY} the secret words {CANARY}")
    assert answer.status_code == 200, answer.text
    collector.wait_for(has_event(EventId.REQUEST_COMPLETED.value))

    with collector.changed:
        posts = list(collector.posts)
    assert posts and all(p.status == 204 for p in posts)
    for post in posts:
        assert post.headers["Content-Type"] == "application/x-ndjson"
        assert post.path == "/ingest?token=q-secret"
        expected = base64.b64encode(b"tele-user:pa55-secret").decode()
        assert post.headers["Authorization"] == f"Basic {expected}"
        assert CANARY.encode() not in post.body and b"secret words" not in post.body
        assert str(fixture_dir).encode() not in post.body  # no absolute paths
        assert server.discovery.token.encode() not in post.body
    records = collector.records()
    known = {e.value for e in EventId}
    for record in records:  # the `skippyctl events --json` record: same fields, same names
        assert record["schema_version"] == 1 and record["event"] in known
        assert record["cursor"] == (f"rt1:{server.discovery.process_instance_id}:{record['seq']}")
    sequences = [r["seq"] for r in records]
    assert sequences == sorted(set(sequences))
    kinds = [r["event"] for r in records]
    assert "runtime_initialized" in kinds  # replayed from before the exporter subscribed
    assert "model_available" in kinds and "generation_completed" in kinds

    counters = _wait_counters(server, lambda c: c["exported"] >= len(records))
    assert counters["endpoint"] == f"http://127.0.0.1:{collector.server.server_address[1]}"
    assert counters["degraded"] is False
    assert set(counters["failures"].values()) == {0}
    assert _conserved(counters)
    with server.http() as http:
        metrics = http.get("/metrics").text
        surfaces = [
            metrics,
            http.get("/api/runtime/state?recent=128").text,
            http.get("/health").text,
            repr(server.events()),
        ]
    assert _metric(metrics, "skippy_telemetry_exported_events_total") >= len(records)
    assert _metric(metrics, "skippy_telemetry_export_batches_total") >= 1
    _stop_in_order(server)
    surfaces.append((server.directory / "serve.log").read_text(errors="replace"))
    for text in surfaces:  # the endpoint's credentials never show anywhere
        assert "pa55-secret" not in text and "q-secret" not in text and "tele-user" not in text
        assert CANARY not in text
    # The orderly shutdown flushed the tail: the collector already saw the runtime stop.
    assert EventId.RUNTIME_STOPPED.value in [r["event"] for r in collector.records()]


class _Stalled:
    def __init__(self) -> None:
        self.collector = Collector("stall")
        self.url = self.collector.url

    def close(self) -> None:
        self.collector.close()


class _Failing(_Stalled):
    def __init__(self) -> None:
        self.collector = Collector("fail")
        self.url = self.collector.url


class _Closed:
    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{closed_port()}/ingest"

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("make", "kind", "reason"),
    [
        pytest.param(_Stalled, "timeout", "timeout", id="stalled"),
        pytest.param(_Failing, "http_status", "unknown_failure", id="failing-500"),
        pytest.param(_Closed, "connection", "unknown_failure", id="closed-port"),
    ],
)
def test_broken_collector_never_stops_loading_or_serving(
    make: Any, kind: str, reason: str, runtime_dir: Path, fixture_dir: Path
) -> None:
    endpoint = make()
    server = _start(runtime_dir, endpoint.url, via_env=kind == "connection")
    try:
        assert server.load(fixture_dir / "tiny.gguf")["state"] == "available"
        answer = _complete(server, "hello there")
        assert answer.status_code == 200, answer.text
        # Keep events flowing until several batches have failed.
        deadline = time.monotonic() + 30
        while _exporter_counters(server)["failures"][kind] < 3:
            assert time.monotonic() < deadline
            assert _complete(server, "and again").status_code == 200
        counters = _exporter_counters(server)
        assert counters["degraded"] is True
        assert counters["exported"] == 0
        assert counters["dropped"]["export_failed"] >= 3
        assert _conserved(counters)
        events = server.events()
        degraded = [e for e in events if e["kind"] == "telemetry_exporter_degraded"]
        assert len(degraded) == 1, [e["kind"] for e in events]
        assert degraded[0]["reason_code"] == reason
        assert "telemetry_exporter_recovered" not in [e["kind"] for e in events]
        with server.http() as http:
            metrics = http.get("/metrics").text
            state = http.get("/api/runtime/state").json()
        assert _metric(metrics, f'skippy_telemetry_export_failures_total{{kind="{kind}"}}') >= 3
        assert (
            _metric(metrics, 'skippy_telemetry_dropped_events_total{reason="export_failed"}') >= 3
        )
        assert _metric(metrics, "skippy_telemetry_exporter_degraded") == 1.0
        assert state["event_system"]["exporter_degraded"] is True
        started = time.monotonic()
        _stop_in_order(server)
        assert time.monotonic() - started < 15  # shutdown is bounded, stalled or not
    finally:
        stop_server(server)
        endpoint.close()
