"""Streams whose text the engine writes to the client's connection itself, against a real runtime
(tiny.gguf; texts compared across requests come from the successor model): byte for byte what
the host would have written, said by the receipt (``written_by``), and kept to the streams it
may serve — plain text over HTTP/1.1 — while log-probabilities and tool-call reading stay on
the host's path. A stream the host ends itself while the engine holds its connection (the
engine stopped with SIGSTOP, a real stall) gets its end only after the engine let go, or is
cut."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from skippyctl.api.openai import ENGINE_STREAM_GRACE_S
from tests.api.conftest import BAN_TINY_END, Server


@pytest.fixture
def successor(server: Server, fixture_dir: Path) -> Iterator[str]:
    """The successor model on ``server`` for this test, as its alias; unloaded after it.

    Texts compared across requests come from it: tiny.gguf's logits are flat, so a long greedy
    reply flips with the computation's shape (a prompt served from the prefix cache, another
    request in the same step), as llama-server's does. The successor model's margin is wide.
    Without speculation: windows would give the stream several tokens a step."""
    assert (
        server.load(fixture_dir / "tiny-successor.gguf", alias="successor", lanes=4, spec="off")[
            "state"
        ]
        == "available"
    )
    try:
        yield "successor"
    finally:
        with server.http() as http:
            http.post("/api/runtime/models/successor/unload", json={"force": True})
            deadline = time.monotonic() + 30
            # Gone from the runtime, its engine process too: the SIGSTOP tests stop tiny's.
            while (
                http.get("/health").json()["models"]["successor"] != "unloaded"
                or len(_engine_pids(server)) > 1
            ):
                assert time.monotonic() < deadline, "successor never unloaded"
                time.sleep(0.05)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


def _stream_lines(server: Server, path: str, body: dict[str, Any]) -> tuple[str, list[str]]:
    """The request id and the SSE data lines of a streamed request, read as they come."""
    with server.http() as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        return response.headers["x-request-id"], lines


def test_a_streamed_completion_is_written_by_the_engine_as_the_host_would(
    server: Server, successor: str
) -> None:
    # Long enough (≥ 1 ms a step here) that the engine holds the connection for most of it even
    # on a loaded machine: the tokens made before the hand-over reach the client in the host's
    # own chunks, as many tokens to a chunk as it had at hand (timing, not a contract).
    tokens = 200
    body = {"model": successor, "prompt": "the quick brown", "max_tokens": tokens, "temperature": 0}
    with server.http() as http:
        whole = http.post("/v1/completions", json=body).json()
    request_id, lines = _stream_lines(server, "/v1/completions", {**body, "stream": True})
    assert lines[-1] == "data: [DONE]"
    chunks = [httpx.Response(200, content=line[6:]).json() for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == whole["choices"][0]["text"]
    # After the hand-over a chunk per token, each with the stream's own id and model; the
    # last chunk carries only the finish reason.
    assert tokens // 2 < len(chunks) <= tokens + 1
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert {c["model"] for c in chunks} == {successor}
    receipt = server.receipt(request_id)
    assert receipt["written_by"] == "engine"
    assert receipt["generated_tokens"] == tokens


def test_a_streamed_chat_through_the_official_client_is_written_by_the_engine(
    server: Server,
) -> None:
    client = _client(server)
    messages = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=20, temperature=0, logit_bias=BAN_TINY_END
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,
        max_tokens=20,
        temperature=0,
        logit_bias=BAN_TINY_END,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert server.receipt(raw.headers["x-request-id"])["written_by"] == "engine"


def test_log_probabilities_and_replies_without_streaming_stay_on_the_hosts_path(
    server: Server,
) -> None:
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 6, "temperature": 0}
    request_id, lines = _stream_lines(
        server, "/v1/completions", {**body, "stream": True, "logprobs": 2}
    )
    assert lines[-1] == "data: [DONE]"
    first = httpx.Response(200, content=lines[0][6:]).json()
    assert first["choices"][0]["logprobs"] is not None
    assert server.receipt(request_id)["written_by"] == "host"
    with server.http() as http:
        answer = http.post("/v1/completions", json=body)
    assert server.receipt(answer.headers["x-request-id"])["written_by"] == "host"


def _engine_pids(server: Server) -> list[int]:
    """The pids of the server's engine processes (its children running the engine worker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server.process.pid and b"skippyctl.engine.engine_worker" in command:
            pids.append(int(entry.name))
    return pids


def _engine_pid(server: Server) -> int:
    """The pid of the server's one engine process (tiny's)."""
    pids = _engine_pids(server)
    assert len(pids) == 1, pids
    return pids[0]


def _stalled_stream(server: Server, stalled_s: float) -> tuple[list[str], BaseException | None]:
    """A stream whose engine is stopped (SIGSTOP) right after its first chunk, past the
    request's deadline, for `stalled_s`: the data lines the client read, and what ended the
    read if not the stream's own end."""
    pid = _engine_pid(server)
    body = {
        "model": "tiny",
        "prompt": "a b c",
        "max_tokens": 100000,
        "stream": True,
        "timeout": 1.0,
        "logit_bias": BAN_TINY_END,
    }
    lines: list[str] = []
    error: BaseException | None = None
    stopped = False
    resume = threading.Timer(stalled_s, os.kill, (pid, signal.SIGCONT))
    try:
        with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
            try:
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    lines.append(line)
                    if not stopped:
                        os.kill(pid, signal.SIGSTOP)
                        stopped = True
                        resume.start()
            except httpx.HTTPError as ended:
                error = ended
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    return lines, error


def test_a_stream_the_host_ended_gets_its_end_after_the_engine_let_go(
    server: Server,
) -> None:
    # The host ends the request at its deadline (the engine is stopped); the engine, resumed
    # 1 s later, may still write a chunk before it lets go: the host's end comes after it.
    lines, error = _stalled_stream(server, stalled_s=2.2)
    assert error is None
    assert lines[-1] == "data: [DONE]"
    failure = httpx.Response(200, content=lines[-2][6:]).json()
    assert failure["error"]["reason_code"] == "timeout"
    for line in lines[:-2]:  # every chunk before the end is whole text
        assert "text" in httpx.Response(200, content=line[6:]).json()["choices"][0]
    with server.http() as http:
        after = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert after.status_code == 200


def test_a_stream_whose_engine_never_lets_go_is_cut_not_corrupted(server: Server) -> None:
    # Stopped past the host's grace (1.2 s to its deadline, 5 s more): the connection is shut,
    # with no end of the stream the engine's late write could follow.
    started = time.monotonic()
    lines, error = _stalled_stream(server, stalled_s=ENGINE_STREAM_GRACE_S + 3.0)
    assert "data: [DONE]" not in lines
    assert isinstance(error, httpx.RemoteProtocolError)  # the body ended before its last chunk
    assert time.monotonic() - started < ENGINE_STREAM_GRACE_S + 3.0  # cut, not waited out
    with server.http() as http:
        after = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert after.status_code == 200


def test_streams_queued_on_the_host_are_handed_over_when_they_start(
    server: Server, successor: str
) -> None:
    # Six streams on four lanes: two wait in the host's queue, their connections handed over
    # right after their Generate.
    def one(index: int) -> tuple[str, str]:
        body = {
            "model": successor,
            "prompt": f"queue {index}",
            "max_tokens": 60,
            "temperature": 0,
            "stream": True,
        }
        request_id, lines = _stream_lines(server, "/v1/completions", body)
        assert lines[-1] == "data: [DONE]"
        chunks = [httpx.Response(200, content=line[6:]).json() for line in lines[:-1]]
        return request_id, "".join(c["choices"][0]["text"] for c in chunks)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    receipts = [server.receipt(request_id) for request_id, _ in results]
    # At least one waited for a lane (a running request takes 60 steps of >= 1 ms).
    assert any(r["queue_ms"] >= 30 for r in receipts), [r["queue_ms"] for r in receipts]
    assert [r["written_by"] for r in receipts] == ["engine"] * 6
    assert [r["generated_tokens"] for r in receipts] == [60] * 6
    with server.http() as http:
        for index, (_, text) in enumerate(results):
            whole = http.post(
                "/v1/completions",
                json={
                    "model": successor,
                    "prompt": f"queue {index}",
                    "max_tokens": 60,
                    "temperature": 0,
                },
            ).json()
            assert text == whole["choices"][0]["text"]
