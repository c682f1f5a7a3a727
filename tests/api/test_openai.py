"""The OpenAI-compatible API against a real runtime, with the official `openai` client."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import BAN_TINY_END, Server


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


def _by_request(events: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["scope"].get("request_id") == request_id]


def _summary(event: dict[str, Any], key: str) -> Any:
    return next((s["value"] for s in event.get("numeric_summaries", []) if s["key"] == key), None)


def test_official_client_lists_models_and_completes(server: Server) -> None:
    client = _client(server)
    assert [m.id for m in client.models.list()] == ["tiny"]
    completion = client.completions.create(
        model="tiny", prompt="the quick brown", max_tokens=8, temperature=0, seed=1
    )
    assert completion.choices[0].finish_reason in ("length", "stop")
    assert completion.usage is not None and completion.usage.completion_tokens >= 1
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=6
    )
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)


def test_official_client_streams_a_chat_completion(server: Server) -> None:
    client = _client(server)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=12,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text


def test_same_seed_and_zero_temperature_are_deterministic(server: Server) -> None:
    client = _client(server)
    texts = {
        client.completions.create(
            model="tiny", prompt="over the lazy", max_tokens=10, temperature=0
        )
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_concurrent_sessions_share_decode_steps(server: Server) -> None:
    client = _client(server)

    def one(n: int) -> str:
        # 160 tokens with the end tokens banned: each request decodes for ≥ 160 ms here, so the
        # four overlap even when a loaded machine starts them tens of milliseconds apart.
        completion = client.completions.create(
            model="tiny",
            prompt=f"the dog {n} and the fox",
            max_tokens=160,
            temperature=0,
            user=f"user-{n}",
            logit_bias=BAN_TINY_END,
        )
        return completion.id

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    completed = [e for e in server.events() if e["kind"] == "generation_completed"]
    recent = completed[-4:]
    assert len(recent) == 4
    assert all(_summary(e, "shared_decode_steps") > 0 for e in recent)
    assert max(_summary(e, "batch_size") for e in recent) >= 2
    assert {e.get("batching") for e in recent} == {"continuous"}


def test_session_reuses_its_kv_prefix(server: Server) -> None:
    client = _client(server)
    first = client.completions.create(
        model="tiny",
        prompt="the quick brown fox jumps",
        max_tokens=4,
        temperature=0,
        user="kv-session",
    )
    follow_up = "the quick brown fox jumps" + first.choices[0].text + " over the lazy dog"
    client.completions.create(
        model="tiny", prompt=follow_up, max_tokens=4, temperature=0, user="kv-session"
    )
    events = server.events()
    restores = [e for e in events if e["kind"].startswith("prompt_cache_restore_")]
    last = restores[-1]
    assert last["kind"] in ("prompt_cache_restore_partial", "prompt_cache_restore_hit")
    reused = _summary(last, "reused_tokens")
    prompt = _summary(last, "prompt_tokens")
    assert reused > 0
    request_id = last["scope"]["request_id"]
    prefill = next(e for e in _by_request(events, request_id) if e["kind"] == "prefill_completed")
    assert _summary(prefill, "prompt_tokens") == prompt - reused
    assert last["scope"]["session_id"].startswith("s-")


def test_bad_requests_get_openai_errors_with_reason_codes(server: Server) -> None:
    with server.http() as http:
        cases = [
            (b"{not json", 400),
            (b'{"model":"tiny","prompt":"x","max_tokens":-5}', 400),
            (b'{"model":"tiny","prompt":"x","max_tokens":1e12}', 400),
            (b'{"model":"tiny","prompt":"x","temperature":99}', 400),
            (b'{"model":"tiny","prompt":12}', 400),
            (b'{"model":"tiny","prompt":"x","max_tokens":"many"}', 400),
            (b'{"model":"nope","prompt":"x"}', 404),
            (b'{"model":"tiny","prompt":"\xff\xfe"}', 400),
            (b"[]", 400),
        ]
        for body, status in cases:
            response = http.post("/v1/completions", content=body)
            assert response.status_code == status, (body, response.text)
            error = response.json()["error"]
            assert error["message"] and error["type"] and error["reason_code"]
        assert http.get("/health").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "x"}])
def test_control_and_generation_need_the_token(server: Server, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=server.url, headers=headers) as http:
        for method, path in [
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("GET", "/api/runtime/state"),
            ("POST", "/api/runtime/shutdown"),
        ]:
            response = http.request(method, path, json={})
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200


def test_prompt_longer_than_the_context_fails_cleanly_and_serving_goes_on(
    server: Server, fixture_dir: Any
) -> None:
    answer = server.load(fixture_dir / "tiny.gguf", alias="tiny-small", ctx=64, lanes=1)
    assert answer["state"] == "available"
    with server.http() as http:
        models = http.get("/api/runtime/state").json()["models"]
        context = next(m["context_tokens"] for m in models if m["model_id"] == "tiny-small")
        long_prompt = " ".join(["the quick brown fox"] * context)  # ~4 tokens per repetition
        response = http.post("/v1/completions", json={"model": "tiny-small", "prompt": long_prompt})
        assert response.status_code == 400
        assert response.json()["error"]["reason_code"] == "context_exhausted"
        ok = http.post(
            "/v1/completions", json={"model": "tiny-small", "prompt": "hi", "max_tokens": 3}
        )
        assert ok.status_code == 200
    kinds = [e["kind"] for e in server.events() if e["scope"].get("model_id") == "tiny-small"]
    assert "context_exhausted" in kinds


def test_timeout_and_client_disconnect_end_requests(server: Server) -> None:
    with server.http() as http:
        response = http.post(
            "/v1/completions",
            json={
                "model": "tiny",
                "prompt": "a b c",
                "max_tokens": 100000,
                "timeout": 0.005,
                "temperature": 1.0,
                "logit_bias": BAN_TINY_END,
            },
        )
        assert response.status_code == 504
        assert response.json()["error"]["reason_code"] == "timeout"
        with http.stream(
            "POST",
            "/v1/completions",
            json={
                "model": "tiny",
                "prompt": "x",
                "max_tokens": 100000,
                "stream": True,
                "logit_bias": BAN_TINY_END,
            },
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    break  # one chunk arrived: now hang up
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        kinds = [e["kind"] for e in server.events()]
        if "request_cancelled" in kinds and "request_timed_out" in kinds:
            return
        time.sleep(1.0)  # each look is a stream reconnect, which the runtime rate-limits
    raise AssertionError("timed-out and cancelled requests were not reported")


def test_many_concurrent_connections_leave_the_runtime_serving(server: Server) -> None:
    def one(n: int) -> int:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http:
            return http.post(
                "/v1/completions", json={"model": "tiny", "prompt": f"n {n}", "max_tokens": 2}
            ).status_code

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(one, range(200)))
    assert set(codes) <= {200, 429}
    assert codes.count(200) >= 8
    with server.http() as http:
        assert (
            http.post(
                "/v1/completions", json={"model": "tiny", "prompt": "after", "max_tokens": 2}
            ).status_code
            == 200
        )
    if 429 in codes:
        assert "request_rejected" in [e["kind"] for e in server.events()]
