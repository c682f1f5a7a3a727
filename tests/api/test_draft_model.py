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
            "/api/runtime/models/load",
            json={"model": str(model), "draft": str(draft), "spec": "ngram"},
        ).json()
    assert alone["model_id"] is None and "--draft" in alone["problem"]
    reasons = [
        e["reason_code"]
        for e in server.events()
        if e["kind"] == "model_load_failed" and e["scope"].get("model_id") == "d1"
    ]
    assert reasons == ["missing_artifact"]


def test_a_draft_model_s_load_and_memory_are_in_the_load_s_events(
    server: Server, fixture_dir: Path, draft: Path
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    assert server.load(model, alias="plain-memory")["state"] == "available"
    loaded = server.load(model, alias="drafted-memory", spec="draft", draft=str(draft))
    assert loaded["state"] == "available", loaded
    events = server.events()

    def of(model_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in events if e["kind"] == kind and e["scope"].get("model_id") == model_id]

    phases = [e["state"]["current"] for e in of("drafted-memory", "model_load_phase_changed")]
    assert "draft loaded" in phases
    assert phases.index("draft loaded") < phases.index("allocating ctx")  # before the plan
    assert "draft loaded" not in [
        e["state"]["current"] for e in of("plain-memory", "model_load_phase_changed")
    ]

    def held(model_id: str, figure: str) -> int:
        return sum(
            int(s["value"])
            for e in of(model_id, "model_memory_allocation_summary")
            for s in e.get("numeric_summaries", [])
            if s["key"] == figure
        )

    # The draft's weights and its KV cache count with the model's.
    draft_bytes = draft.stat().st_size
    assert held("drafted-memory", "weights_bytes") >= held("plain-memory", "weights_bytes") + (
        draft_bytes // 2
    )
    assert held("drafted-memory", "kv_bytes") > held("plain-memory", "kv_bytes")


def test_a_draft_model_counts_in_the_load_s_memory_estimate(fixture_dir: Path, draft: Path) -> None:
    from skippyctl.config.load_options import LoadOptions, SpecMode
    from skippyctl.runtime.memory_estimate import estimate_load

    model = str(fixture_dir / "tiny-successor.gguf")
    plain = estimate_load(LoadOptions(model, lanes=1, ctx=512))
    drafted = estimate_load(
        LoadOptions(model, lanes=1, ctx=512, spec=SpecMode.DRAFT, draft=str(draft))
    )
    assert drafted.weights_bytes == plain.weights_bytes + draft.stat().st_size
    assert drafted.kv_bytes > plain.kv_bytes  # its KV cache holds the same 512 tokens
    assert drafted.context_tokens == plain.context_tokens == 512
