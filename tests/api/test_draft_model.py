"""`load --draft` over the API: a one-layer draft of the successor model proposes from the first
token; the text is the plain model's; a missing draft or one without its partner flag is refused
before any engine starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.fixtures import TINY_SUCCESSOR_DRAFT, make_model
from tests.api.conftest import Server, start_server, stop_server

PROMPT = "the quick brown fox"
TOKENS = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("draft-serve"))
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("draft") / "succ-draft.gguf", TINY_SUCCESSOR_DRAFT)


def _complete(server: Server, model: str) -> dict[str, Any]:
    with server.http(timeout=120) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0},
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        receipt = http.get(f"/api/runtime/requests/{answer.headers['x-request-id']}/receipt")
        body["receipt"] = receipt.json()
    return body


def test_a_draft_model_proposes_from_the_first_token(
    server: Server, fixture_dir: Path, draft: Path
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    assert server.load(model, alias="plain")["state"] == "available"
    loaded = server.load(model, alias="drafted", spec="draft", draft=str(draft))
    assert loaded["state"] == "available"
    plain, drafted = _complete(server, "plain"), _complete(server, "drafted")
    assert drafted["choices"][0]["text"] == plain["choices"][0]["text"]
    figures = drafted["receipt"]["speculative"]
    assert figures["mode"] == "draft"
    # Prompt lookup needs a whole cycle (48 words) first; the draft knows the cycle at once.
    assert figures["accepted"] == figures["proposed"] > TOKENS - 48, figures


def test_a_draft_that_is_missing_or_alone_is_refused(
    server: Server, fixture_dir: Path, draft: Path
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    missing = server.load(model, alias="d1", spec="draft", draft=str(draft) + ".nope")
    assert missing["state"] == "failed"
    assert "not found" in missing["problem"] and str(draft.parent) not in missing["problem"]
    with server.http() as http:  # refused before a model id exists: the answer says why
        alone = http.post(
            "/api/runtime/models/load", json={"model": str(model), "draft": str(draft)}
        ).json()
    assert alone["model_id"] is None and "--draft" in alone["problem"]
    reasons = [
        e["reason_code"]
        for e in server.events()
        if e["kind"] == "model_load_failed" and e["scope"].get("model_id") == "d1"
    ]
    assert reasons == ["missing_artifact"]
