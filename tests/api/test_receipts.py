"""Generation receipts over HTTP (GET /api/runtime/requests/{id}/receipt) from a real runtime."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import Server, assert_openai_error

PROMPT = "one two three four five six seven eight nine ten"


def _complete(
    server: Server, headers: dict[str, str] | None = None, **extra: object
) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    with server.http() as http:
        return http.post("/v1/completions", json=body, headers=headers)


def _receipt(server: Server, request_id: str) -> httpx.Response:
    with server.http() as http:
        return http.get(f"/api/runtime/requests/{request_id}/receipt")


def test_a_completed_request_has_a_receipt_with_its_counts_and_timings(server: Server) -> None:
    response = _complete(server)
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    usage = response.json()["usage"]
    found = _receipt(server, request_id)
    assert found.status_code == 200
    receipt = found.json()
    assert receipt["request_id"] == request_id and receipt["model_id"] == "tiny"
    assert receipt["outcome"] == "completed" and receipt["reason_code"] is None
    assert receipt["stop_reason"] in ("length", "eos")
    assert receipt["prompt_tokens"] == usage["prompt_tokens"]
    assert receipt["generated_tokens"] == usage["completion_tokens"]
    assert receipt["session_id"] is None
    assert 0 <= receipt["queue_ms"] <= receipt["total_ms"]
    assert receipt["ttft_ms"] is not None and receipt["ttft_ms"] <= receipt["total_ms"]
    assert receipt["prefill_ms"] is not None and receipt["decode_ms"] is not None
    speculative = receipt["speculative"]
    assert speculative["mode"] == "auto"  # the default: verified only where it pays
    assert speculative["accepted"] + speculative["rejected"] == speculative["proposed"]
    assert speculative["late"] == 0 and speculative["discarded"] == 0
    # Privacy: neither the prompt nor any text of the completion is in the receipt.
    assert "three" not in found.text and response.json()["choices"][0]["text"] not in found.text


def test_a_session_s_second_request_shows_the_prompt_tokens_it_reused(server: Server) -> None:
    headers = {"X-Session-Id": "receipt-session"}
    first = _complete(server, headers=headers)
    second = _complete(server, headers=headers)
    one = _receipt(server, first.headers["x-request-id"]).json()
    two = _receipt(server, second.headers["x-request-id"]).json()
    assert one["session_id"] is not None and one["session_id"] == two["session_id"]
    assert one["session_id"] != "receipt-session"  # an opaque id, not the client's key
    assert two["reused_tokens"] > 0 and two["reused_tokens"] <= two["prompt_tokens"]
    # Each request's KV lookup is an event of its own: the second one hit.
    lookups = {
        e["scope"]["request_id"]: e["kind"]
        for e in server.events()
        if e["kind"] in ("cache_lookup_hit", "cache_lookup_miss")
    }
    assert lookups[two["request_id"]] == "cache_lookup_hit"


def test_a_rejected_request_has_a_receipt_too(server: Server) -> None:
    response = _complete(server, model="not-loaded")
    assert_openai_error(response, 404)
    receipt = _receipt(server, response.headers["x-request-id"]).json()
    assert receipt["outcome"] == "rejected" and receipt["reason_code"] == "missing_artifact"
    assert receipt["generated_tokens"] == 0 and receipt["ttft_ms"] is None
    assert receipt["queue_ms"] == receipt["total_ms"]  # it never reached an engine


@pytest.mark.parametrize("request_id", ["req-does-not-exist", "not..an..id..............."])
def test_an_unknown_request_has_no_receipt(server: Server, request_id: str) -> None:
    error = assert_openai_error(_receipt(server, request_id), 404)
    assert error["reason_code"] == "missing_artifact"


def test_a_string_that_cannot_be_a_request_id_is_refused(server: Server) -> None:
    response = _receipt(server, "%20spaces%20")
    assert response.status_code in (400, 404)
