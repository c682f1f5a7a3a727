"""Streams whose text the engine writes to the client's connection itself, against a real runtime
(tiny.gguf): byte for byte what the host would have written, said by the receipt
(``written_by``), and kept to the streams it may serve — plain text over HTTP/1.1 — while
log-probabilities and tool-call reading stay on the host's path."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from tests.api.conftest import Server

BAN_END = {"2": -100, "1023": -100}  # tiny.gguf's end tokens: replies run to max_tokens


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


def _receipt(server: Server, request_id: str) -> dict[str, Any]:
    with server.http() as http:
        answer = http.get(f"/api/runtime/requests/{request_id}/receipt")
    assert answer.status_code == 200, answer.text
    document: dict[str, Any] = answer.json()
    return document


def _stream_lines(server: Server, path: str, body: dict[str, Any]) -> tuple[str, list[str]]:
    """The request id and the SSE data lines of a streamed request, read as they come."""
    with server.http() as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        return response.headers["x-request-id"], lines


def test_a_streamed_completion_is_written_by_the_engine_as_the_host_would(
    server: Server,
) -> None:
    body = {"model": "tiny", "prompt": "the quick brown", "max_tokens": 40, "temperature": 0}
    with server.http() as http:
        whole = http.post("/v1/completions", json={**body, "logit_bias": BAN_END}).json()
    request_id, lines = _stream_lines(
        server, "/v1/completions", {**body, "logit_bias": BAN_END, "stream": True}
    )
    assert lines[-1] == "data: [DONE]"
    chunks = [httpx.Response(200, content=line[6:]).json() for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == whole["choices"][0]["text"]
    # A chunk per token (tiny.gguf's tokens are whole characters), each with the stream's
    # own id and model.
    assert len(chunks) == 41
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert {c["model"] for c in chunks} == {"tiny"}
    receipt = _receipt(server, request_id)
    assert receipt["written_by"] == "engine"
    assert receipt["generated_tokens"] == 40


def test_a_streamed_chat_through_the_official_client_is_written_by_the_engine(
    server: Server,
) -> None:
    client = _client(server)
    messages = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=20, temperature=0, logit_bias=BAN_END
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,
        max_tokens=20,
        temperature=0,
        logit_bias=BAN_END,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert _receipt(server, raw.headers["x-request-id"])["written_by"] == "engine"


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
    assert _receipt(server, request_id)["written_by"] == "host"
    with server.http() as http:
        answer = http.post("/v1/completions", json=body)
    assert _receipt(server, answer.headers["x-request-id"])["written_by"] == "host"
