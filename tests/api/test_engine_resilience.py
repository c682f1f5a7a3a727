"""Issue 10, engine resilience, end to end: a real runtime server (subprocess, loopback) with a
real engine on tiny.gguf. Nothing a client sends ends the engine; failed loads leave no engine
process; a bad path settles; deadlines hold while the engine is stopped.

Processes are found as children of the runtime this module started; the only process signalled
is that runtime's own engine (SIGSTOP/SIGCONT, always continued in a `finally`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Server, start_server, stop_server

MEGABYTE_PROMPT = "hello world " * 90_000  # ~1.08 MB: it used to tear the control channel
SETTLE_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("resilience"),
        # A stopped engine is reported after 1 s of silence (default 5 s).
        env={"SKIPPY_ENGINE_UNRESPONSIVE_S": "1"},
    )
    try:
        # Restart never: a stopped engine is waited for here, not killed (test_engine_recovery).
        answer = running.load(fixture_dir / "tiny.gguf", lanes=2, restart="never")
        assert answer["state"] == "available", answer
        yield running
    finally:
        for pid in engines(running):  # never leave a stopped engine behind, whatever failed
            os.kill(pid, signal.SIGCONT)
        stop_server(running)


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:  # the thread ended while we listed
            continue
    return found


def engines(server: Server) -> set[int]:
    """Engine processes of the runtime (a zombie, not yet reaped, counts too)."""
    found = set()
    for child in children(server.process.pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"skippyctl.engine.engine_worker" in cmdline or not cmdline:
            found.add(child)
    return found


def the_engine(server: Server) -> int:
    (pid,) = engines(server)
    return pid


def process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def until(predicate: Any, timeout_s: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def wait_event(server: Server, kind: str) -> dict[str, Any]:
    """The first event of `kind` since the runtime started: one stream, replayed then followed
    (polling would reconnect too often for the stream's reconnect limiter)."""

    def found(frame: Any) -> bool:
        return bool(frame.name == "runtime_event" and frame.data["event"]["kind"] == kind)

    frames = server.frames_since_start(found, timeout_s=SETTLE_S)
    matches = [f.data["event"] for f in frames if found(f)]
    assert matches, f"no {kind} event"
    return dict(matches[0])


def complete(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/completions", json={"model": "tiny", "max_tokens": 4, **body})


def test_a_megabyte_prompt_is_refused_with_context_exhausted_and_the_engine_serves_on(
    server: Server,
) -> None:
    engine = the_engine(server)
    with server.http() as http:
        refused = complete(http, prompt=MEGABYTE_PROMPT)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["reason_code"] == "context_exhausted"
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": MEGABYTE_PROMPT}]},
        )
        assert chat.status_code == 400, chat.text
        assert chat.json()["error"]["reason_code"] == "context_exhausted"
        assert complete(http, prompt="The quick brown fox").status_code == 200
        assert http.get("/health").json()["models"]["tiny"] == "available"
    assert the_engine(server) == engine  # the same process: it never restarted


def test_failed_loads_leave_no_engine_process_behind(server: Server, fixture_dir: Path) -> None:
    before = engines(server)
    assert len(before) == 1  # tiny's
    for alias in ("broken-1", "broken-2", "broken-3"):
        # truncated.gguf passes the header pre-check; llama.cpp returns NULL for it.
        answer = server.load(fixture_dir / "truncated.gguf", alias=alias)
        assert answer["state"] == "failed", answer
    assert until(lambda: engines(server) == before), engines(server)


def test_a_nul_byte_in_a_model_path_never_leaves_the_model_id_stuck(
    server: Server, fixture_dir: Path
) -> None:
    with server.http() as http:
        answer = http.post(
            "/api/runtime/models/load",
            json={"model": str(fixture_dir / "ti\x00ny.gguf"), "alias": "nul-path"},
        )
        assert answer.status_code in (400, 202), answer.text  # refused at the edge or settled
        assert until(lambda: http.get("/health").json()["models"].get("nul-path") != "requested")
        health = http.get("/health")
        assert health.status_code == 200, health.text  # not 503 `loading` forever
        again = server.load(fixture_dir / "tiny.gguf", alias="nul-path")
        assert again["state"] == "available", again
        assert http.post("/api/runtime/models/nul-path/unload", json={}).status_code == 202
    assert until(lambda: len(engines(server)) == 1)


def test_a_stopped_engine_cannot_hold_a_request_past_its_deadline(server: Server) -> None:
    engine = the_engine(server)
    answered = threading.Event()
    result: dict[str, Any] = {}

    def ask() -> None:
        try:
            with server.http() as http:
                result["response"] = complete(http, prompt="The quick brown fox", timeout=3)
                result["state_at_answer"] = process_state(engine)
        finally:
            answered.set()

    os.kill(engine, signal.SIGSTOP)
    try:
        assert until(lambda: process_state(engine) == "T")  # SIGSTOP lands asynchronously
        asker = threading.Thread(target=ask)
        asker.start()
        # Ordering, not timing: the answer comes while the engine is still stopped (a host that
        # waited for the engine would never answer before the SIGCONT below).
        assert answered.wait(SETTLE_S), "no answer while the engine was stopped"
        asker.join()
        assert result["state_at_answer"] == "T", result
        response = result["response"]
        assert response.status_code == 504, response.text
        assert response.json()["error"]["reason_code"] == "timeout"
        assert wait_event(server, "model_degraded")["reason_code"] == "timeout"
    finally:
        os.kill(engine, signal.SIGCONT)
    wait_event(server, "model_recovery_completed")
    with server.http() as http:
        assert complete(http, prompt="The quick brown fox", timeout=20).status_code == 200
    assert the_engine(server) == engine
    # Each episode is reported once and closed once (a loaded machine may add episodes).
    episodes = [
        e["kind"]
        for e in server.events()
        if e["kind"] in ("model_degraded", "model_recovery_completed")
    ]
    assert episodes and episodes == ["model_degraded", "model_recovery_completed"] * (
        len(episodes) // 2
    )
