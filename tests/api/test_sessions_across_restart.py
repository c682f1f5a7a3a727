"""A session outlives its runtime: an orderly stop saves the sessions' KV state (within the
store's cap), the next runtime in the same directory restores them when the model is loaded
again, and the client's next request with the same session key reuses that KV under the same
opaque id. A file changed in between is refused with a reason, never loaded. Real runtimes
(`runtime serve` processes) on tiny.gguf, stopped as an operator stops them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import Server, start_server, stop_server

PROMPT = "The quick brown fox jumps over the lazy dog and runs far away into the woods"
KEY = {"X-Session-Id": "a-conversation"}


def _complete(server: Server, prompt: str, max_tokens: int) -> httpx.Response:
    with server.http() as http:
        response = http.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
            headers=KEY,
        )
    assert response.status_code == 200, response.text
    return response


def _first_runtime(directory: Path, fixture_dir: Path) -> tuple[str, dict[str, Any]]:
    """Serve one turn of the conversation, then stop the runtime: its text and receipt."""
    first = start_server(directory)
    try:
        first.load(fixture_dir / "tiny.gguf", alias="tiny")
        response = _complete(first, PROMPT, 12)
        receipt = first.receipt(response.headers["x-request-id"])
    finally:
        stop_server(first)
    return response.json()["choices"][0]["text"], receipt


def test_a_session_continues_in_the_next_runtime(tmp_path: Path, fixture_dir: Path) -> None:
    directory = tmp_path / "runtime"
    text, first = _first_runtime(directory, fixture_dir)
    session = first["session_id"]
    assert session is not None

    second = start_server(directory)
    try:
        second.load(fixture_dir / "tiny.gguf", alias="tiny")
        response = _complete(second, PROMPT + text + " and then the fox sleeps", 8)
        receipt = second.receipt(response.headers["x-request-id"])
        events = second.events()
    finally:
        stop_server(second)
    assert receipt["session_id"] == session  # the same opaque id, not a new session
    # The whole first turn but what the second prompt re-tokenizes differently was in KV.
    assert receipt["reused_tokens"] >= first["prompt_tokens"]
    restored = [e for e in events if e["kind"] == "session_restored"]
    assert [e["scope"]["session_id"] for e in restored] == [session]
    imported = [e for e in events if e["kind"] == "cache_state_import_completed"]
    assert len(imported) == 1 and imported[0]["outcome"] == "success"
    # The client's key is nowhere in the directory the runtimes share, nor in any event.
    for path in directory.rglob("*"):
        if path.is_file() and path.name != "serve.log":
            assert b"a-conversation" not in path.read_bytes(), path
    assert "a-conversation" not in str(events)


def test_a_session_file_changed_between_runtimes_is_refused_with_a_reason(
    tmp_path: Path, fixture_dir: Path
) -> None:
    directory = tmp_path / "runtime"
    _, first = _first_runtime(directory, fixture_dir)
    (saved,) = (directory / "sessions").glob("*.kvs")
    data = bytearray(saved.read_bytes())
    data[-1] ^= 0xFF  # one bit of the KV bytes: the file's digest no longer matches
    saved.write_bytes(bytes(data))

    second = start_server(directory)
    try:
        second.load(fixture_dir / "tiny.gguf", alias="tiny")
        response = _complete(second, PROMPT, 4)
        receipt = second.receipt(response.headers["x-request-id"])
        events = second.events()
    finally:
        stop_server(second)
    refused = [e for e in events if e["kind"] == "cache_state_import_failed"]
    assert len(refused) == 1 and refused[0]["reason_code"] is not None
    assert "session_restored" not in [e["kind"] for e in events]
    assert receipt["reused_tokens"] == 0  # it started afresh, as a new session
    assert receipt["session_id"] not in (None, first["session_id"])
