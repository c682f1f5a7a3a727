"""Operating the runtime: SSE resume and gaps, admission limits, unload, engine crashes, health,
metrics, privacy — against a real server process."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skippyctl.client.http import Frame
from tests.api.conftest import BAN_TINY_END, Server, start_server, stop_server

CANARY = "CANARY-q7Zx"


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("ops"),
        "--replay-records",
        "64",
        "--max-queue",
        "1",
        env={"SKIPPY_TEST_DECODE_DELAY_MS": "5"},  # requests stay in flight long enough to act on
    )
    try:
        yield running
    finally:
        stop_server(running)


def _generate(server: Server, model: str, **body: Any) -> httpx.Response:
    with server.http(timeout=120) as http:
        return http.post("/v1/completions", json={"model": model, "prompt": "x", **body})


def _long(server: Server, model: str) -> httpx.Response:
    return _generate(server, model, max_tokens=1500, logit_bias=BAN_TINY_END, timeout=60)


def _wait_until_model(
    server: Server,
    model: str,
    predicate: Any,
    timeout_s: float = 30.0,
    running: concurrent.futures.Future[httpx.Response] | None = None,
) -> None:
    """Poll the reduced state until the model's document satisfies `predicate`. With
    `running` (the request the state should show), a request that ended first fails at once
    with its answer, instead of a timeout that says nothing."""
    deadline = time.monotonic() + timeout_s
    last: list[dict[str, Any]] = []
    with server.http() as http:
        while time.monotonic() < deadline:
            last = list(http.get("/api/runtime/state").json()["models"])
            if any(m["model_id"] == model and predicate(m) for m in last):
                return
            if running is not None and running.done():
                answer = running.result()
                raise AssertionError(
                    f"the request ended ({answer.status_code}: {answer.text[:300]}) before "
                    f"{model}'s state showed it: {[m for m in last if m['model_id'] == model]}"
                )
            time.sleep(0.05)
    raise AssertionError(
        f"{model} never reached the expected state: {[m for m in last if m['model_id'] == model]}"
    )


def _wait_for(server: Server, predicate: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = server.events()
        if predicate(events):
            return events
        time.sleep(1.0)  # each look is a stream reconnect, and those are rate-limited per peer
    raise AssertionError("condition never held")


def test_health_says_idle_then_ready(ops: Server, fixture_dir: Path) -> None:
    with ops.http() as http:
        first = http.get("/health")
        assert (first.status_code, first.json()["status"]) in {(200, "idle"), (200, "ready")}
    assert ops.load(fixture_dir / "tiny.gguf", alias="queue", lanes=1)["state"] == "available"
    with ops.http() as http:
        ready = http.get("/health")
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")


def test_full_queue_is_a_429_with_retry_after(ops: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(_long, ops, "queue")
        _wait_until_model(ops, "queue", lambda m: m["lanes_in_use"] == 1, running=running)
        queued = pool.submit(_long, ops, "queue")
        _wait_until_model(ops, "queue", lambda m: m["queue_depth"] == 1)
        rejected = _generate(ops, "queue", max_tokens=2)
        assert rejected.status_code == 429, rejected.text
        assert rejected.headers["Retry-After"] == "1"
        assert rejected.json()["error"]["reason_code"] == "reservation_exhausted"
        with ops.http() as http:
            http.post("/api/runtime/models/queue/unload", json={"force": True})
        codes = {running.result().status_code, queued.result().status_code}
    assert codes <= {499, 503, 500, 200}
    events = _wait_for(ops, lambda ev: any(e["kind"] == "unload_completed" for e in ev))
    kinds = [e["kind"] for e in events]
    assert "request_rejected" in kinds
    forced = next(e for e in events if e["kind"] == "forced_unload")
    cancelled = next(
        s["value"] for s in forced["numeric_summaries"] if s["key"] == "cancelled_requests"
    )
    assert cancelled == 2


def test_unload_drains_running_requests_first(ops: Server, fixture_dir: Path) -> None:
    assert ops.load(fixture_dir / "tiny.gguf", alias="drain", lanes=2)["state"] == "available"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            _generate, ops, "drain", max_tokens=200, logit_bias=BAN_TINY_END, user="drain-chat"
        )
        _wait_until_model(ops, "drain", lambda m: m["lanes_in_use"] == 1, running=running)
        with ops.http() as http:
            answer = http.post("/api/runtime/models/drain/unload", json={"drain_timeout_s": 30})
            assert answer.status_code == 202
        assert running.result().status_code == 200  # it finished: draining waited for it
    events = _wait_for(
        ops,
        lambda ev: any(
            e["kind"] == "unload_completed" and e["scope"].get("model_id") == "drain" for e in ev
        ),
    )
    kinds = [e["kind"] for e in events if e["scope"].get("model_id") == "drain"]
    for expected in (
        "unload_requested",
        "unload_started",
        "session_draining_started",
        "session_draining_completed",
        "unload_completed",
    ):
        assert expected in kinds
    assert "forced_unload" not in kinds
    # Its one session drains with the model, then closes.
    session = [e for e in events if e["kind"] in ("session_draining", "session_closed")]
    assert [e["kind"] for e in session if e["scope"].get("model_id") == "drain"] == [
        "session_draining",
        "session_closed",
    ]
    with ops.http() as http:
        assert http.post("/api/runtime/models/drain/unload", json={}).status_code == 404


def test_killed_engine_fails_its_requests_and_others_keep_serving(
    ops: Server, fixture_dir: Path
) -> None:
    assert ops.load(fixture_dir / "tiny.gguf", alias="victim")["state"] == "available"
    assert ops.load(fixture_dir / "tiny.gguf", alias="bystander")["state"] == "available"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(_long, ops, "victim")
        _wait_until_model(ops, "victim", lambda m: m["lanes_in_use"] == 1, running=streaming)
        with ops.http() as http:
            engines = http.get("/api/runtime/state").json()["engines"]
        victim = next(e["pid"] for e in engines if e["model_id"] == "victim")
        os.kill(victim, signal.SIGKILL)
        response = streaming.result()
    assert response.status_code == 503
    assert response.json()["error"]["reason_code"] == "process_crash"
    assert _generate(ops, "bystander", max_tokens=3).status_code == 200
    with ops.http() as http:
        assert http.get("/health").json()["models"]["victim"] == "unavailable"
    events = ops.events()
    failed = [
        e
        for e in events
        if e["kind"] == "request_failed" and e["scope"].get("model_id") == "victim"
    ]
    assert failed and failed[-1]["reason_code"] == "process_crash"
    assert any(
        e["kind"] == "model_unavailable" and e["scope"].get("model_id") == "victim" for e in events
    )
    assert ops.load(fixture_dir / "tiny.gguf", alias="victim")["state"] == "available"


def test_sse_resumes_from_a_cursor_and_reports_gaps(ops: Server) -> None:
    client = ops.client()
    try:
        frames = []
        for frame in client.frames():
            frames.append(frame)
            if len(frames) == 1:
                break
        state = frames[0]
        assert state.name == "runtime_state"
        assert state.data["version"] == 1 and state.data["process_instance_id"]
        assert state.cursor == state.data["cursor"]
        # Generate more than the 64 retained frames, then resume from the old cursor: a gap.
        with ops.http() as http:  # each refused request is one event: 80 > the 64 retained
            for _ in range(80):
                http.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"})
        resumed = []
        for frame in client.frames(state.cursor):
            resumed.append(frame)
            if len(resumed) == 3:
                break
        assert [f.name for f in resumed[:2]] == ["runtime_state", "runtime_replay_gap"]
        gap = resumed[1].data["gap"]
        assert gap["reason"] == "evicted"
        assert gap["oldest_available"].startswith("rt1:")
        frames = []
        for frame in client.frames("rt1:00000000-0000-0000-0000-000000000000:5"):
            frames.append(frame)
            if len(frames) == 2:
                break
        assert frames[1].data["gap"]["reason"] == "stale_instance"

        # The runtime heard of both gaps: they are events, counted in its health.
        def gaps_counted() -> int:
            with ops.http() as http:
                return int(http.get("/api/runtime/state").json()["event_system"]["replay_gaps"])

        assert _wait_for_value(gaps_counted, lambda n: n >= 2) >= 2
        # A retained cursor resumes exactly after it. One from the middle of the retained
        # window: the oldest one may be evicted by any event before the stream resumes.
        events_seen: list[Frame] = []

        def middle_reached(frame: Frame) -> bool:
            if frame.name == "runtime_state":
                events_seen.clear()  # a replay (again, after a 429) starts here
            elif frame.name == "runtime_event":
                events_seen.append(frame)
            return len(events_seen) == 32  # of the 64 retained

        ops.frames_since_start(middle_reached)
        retained = events_seen[-1:]
        cursor = retained[0].cursor
        assert cursor is not None
        after = None
        for frame in client.frames(cursor):
            if frame.name == "runtime_event":
                after = frame
                break
        assert after is not None
        assert after.data["sequence"] == retained[0].data["sequence"] + 1
    finally:
        client.close()


def test_privacy_canary_never_leaves_the_completion(ops: Server) -> None:
    with ops.http() as http:
        prompt = f"{CANARY} secret words {CANARY}"
        ok = http.post(
            "/v1/completions",
            json={"model": "bystander", "prompt": prompt, "max_tokens": 4, "user": CANARY},
        )
        assert ok.status_code == 200
        chat = http.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": CANARY},
            json={
                "model": "bystander",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        assert chat.status_code == 200
        unknown = http.post("/v1/completions", json={"model": CANARY, "prompt": prompt})
        assert unknown.status_code == 404
        surfaces = [
            http.get("/api/runtime/state?recent=128").text,
            http.get("/api/runtime/events/recent").text,
            http.get("/metrics").text,
        ]
    frames = ops.frames_since_start(
        lambda f: f.name == "runtime_event" and f.data["event"]["kind"] == "request_rejected"
    )
    surfaces.append(repr([f.data for f in frames]))
    surfaces.append((ops.directory / "serve.log").read_text(errors="replace"))
    for text in surfaces:
        assert CANARY not in text
        assert "secret words" not in text


def test_metrics_expose_counters_without_private_labels(ops: Server) -> None:
    with ops.http() as http:
        text = http.get("/metrics").text
    assert 'skippy_requests_total{model="bystander",outcome="completed",reason="none"}' in text
    assert "skippy_generated_tokens_total" in text
    assert "skippy_queue_depth" in text and "skippy_events_dropped_total" in text
    assert "skippy_metrics_collector_up 1.0" in text


def test_the_node_announces_its_capacity_as_models_come_and_go(
    ops: Server, fixture_dir: Path
) -> None:
    def changes() -> list[tuple[int, int]]:
        """(previous, current) lanes of every retained node_capacity_changed."""
        return [
            (int(e["state"]["previous"].split()[0]), int(e["state"]["current"].split()[0]))
            for e in ops.events()
            if e["kind"] == "node_capacity_changed"
        ]

    def shrank_after_growing(seen: list[tuple[int, int]]) -> bool:
        grew = [i for i, (a, b) in enumerate(seen) if b - a == 2]
        return bool(grew) and any(a - b == 2 for a, b in seen[grew[-1] + 1 :])

    assert ops.load(fixture_dir / "tiny.gguf", alias="cap", lanes=2)["state"] == "available"
    _wait_for_value(changes, lambda seen: any(b - a == 2 for a, b in seen))
    with ops.http() as http:
        assert http.post("/api/runtime/models/cap/unload", json={}).status_code == 202
    # Its two lanes go again: a change of -2 after the +2.
    assert shrank_after_growing(_wait_for_value(changes, shrank_after_growing))


def _wait_for_value(read: Any, done: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = read()
        if done(value):
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")
