"""Serving event modes of a real runtime: per-token debug observations (`--debug-token-events`)
and the events-off benchmark baseline (`SKIPPY_SERVING_EVENTS=off`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.api.conftest import Server, start_server

PROMPT = "zeppelin marmalade quixotic pelican"
TOKEN_EVENT = "generation_token_observed"
SERVING_PREFIXES = ("request_", "prefill_", "generation_", "session_", "first_token", "cache_")


def _stop(server: Server) -> None:
    # conftest's stop_server polls the pid with kill(0), which a zombie child passes: it always
    # waits its full 15 s. Terminating and reaping the child is the same SIGTERM shutdown.
    server.process.terminate()
    try:
        server.process.wait(20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def _serve(directory: Path, fixture_dir: Path, *extra: str, **env: str) -> Server:
    server = start_server(directory, "--replay-records", "4096", *extra, env=env)
    try:
        answer = server.load(fixture_dir / "tiny.gguf", lanes=2)
        assert answer["state"] == "available", answer
    except BaseException:
        _stop(server)
        raise
    return server


@pytest.fixture(scope="module")
def debug_server(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    server = _serve(tmp_path_factory.mktemp("debug"), fixture_dir, "--debug-token-events")
    yield server
    _stop(server)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    server = _serve(tmp_path_factory.mktemp("plain"), fixture_dir)
    yield server
    _stop(server)


def _complete(server: Server, max_tokens: int) -> tuple[str, dict[str, Any]]:
    with server.http() as http:
        response = http.post(
            "/v1/completions",
            json={
                "model": "tiny",
                "prompt": PROMPT,
                "max_tokens": max_tokens,
                "temperature": 0,
                "seed": 7,
            },
        )
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"], response.json()


def _debug_lane(server: Server) -> dict[str, int]:
    with server.http() as http:
        state = http.get("/api/runtime/state").json()
    lane: dict[str, int] = state["health"]["host_ingress"]["debug"]
    return lane


def _sampled(body: dict[str, Any]) -> int:
    """Tokens the engine sampled: the completion, plus an end-of-generation token if one ended
    it (no stop strings here, so finish_reason "stop" means end of generation)."""
    choice = body["choices"][0]
    ended_by_eog = int(choice["finish_reason"] == "stop")
    return int(body["usage"]["completion_tokens"]) + ended_by_eog


def test_debug_token_events_count_every_sampled_token_or_its_counted_drop(
    debug_server: Server,
) -> None:
    before = _debug_lane(debug_server)
    request_id, body = _complete(debug_server, 48)
    sampled = _sampled(body)
    assert sampled >= 2
    events = debug_server.events()
    observed = [
        e for e in events if e["kind"] == TOKEN_EVENT and e["scope"].get("request_id") == request_id
    ]
    after = _debug_lane(debug_server)
    dropped = after["dropped"] - before["dropped"]
    assert after["submitted"] - before["submitted"] == sampled
    assert len(observed) + dropped == sampled
    ordinals = [
        next(s["value"] for s in e["numeric_summaries"] if s["key"] == "generated_tokens")
        for e in observed
    ]
    assert ordinals == sorted(ordinals) and set(ordinals) <= set(range(1, sampled + 1))
    text = body["choices"][0]["text"]
    for event in observed:
        assert event["category"] == "generation"
        assert {s["key"] for s in event["numeric_summaries"]} == {"generated_tokens"}
        assert event["duration_ms"] >= 0
        encoded = orjson.dumps(event).decode()
        assert "token_id" not in encoded
        assert not any(word in encoded for word in PROMPT.split())
        if len(text.strip()) >= 4:
            assert text.strip() not in encoded


def test_without_the_flag_no_token_event_is_produced(plain_server: Server) -> None:
    request_id, body = _complete(plain_server, 16)
    assert body["usage"]["completion_tokens"] >= 1
    events = plain_server.events()
    assert [e for e in events if e["kind"] == TOKEN_EVENT] == []
    assert any(
        e["kind"] == "request_completed" and e["scope"].get("request_id") == request_id
        for e in events
    )
    assert _debug_lane(plain_server)["submitted"] == 0


def test_serving_events_off_still_loads_and_serves_without_serving_events(
    tmp_path: Path, fixture_dir: Path
) -> None:
    server = _serve(
        tmp_path / "off",
        fixture_dir,
        "--debug-token-events",
        SKIPPY_SERVING_EVENTS="off",
        SKIPPY_NATIVE_DISABLE="1",
    )
    try:
        _request_id, body = _complete(server, 16)
        assert body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["text"]
        kinds = {e["kind"] for e in server.events()}
        assert "model_available" in kinds  # readiness is still decided by the reducer
        assert not [k for k in kinds if k.startswith(SERVING_PREFIXES) or "kv_" in k], kinds
        assert _debug_lane(server)["submitted"] == 0
    finally:
        _stop(server)
