"""Without flash attention a greedy text does not depend on what is decoded beside it.

The real model (SmolLM2-135M-Instruct, Q4_1) asked to repeat, copy or rewrite a passage of over
512 tokens (past 512 cells llama.cpp's flash-attention kernel takes another path for a row
decoded alone), greedily, three ways: alone with `--spec off`, alone with `--spec ngram` (the
text verified in windows of proposals), and beside three other requests in one batch. Both
loads say `--flash-attn off`, so their engines compute on the ggml CPU library with
batch-invariant products (skippyctl/engine/kernels.py) and report `batch_invariant` 1. The three
texts must be byte-identical; with the stock kernels they are not (:data:`PROMPTS`).
tests/engine/test_engine_worker.py shows the load's probe, and that the stock kernels fail it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import REAL_MODEL, Server, start_server, stop_server
from tests.api.log_coverage.evidence import summary_value

WORDS = ("north", "east", "south", "west", "river", "harbour", "lamp", "ledger")
ASKS = (
    "Copy this text exactly:",
    "Rewrite this text in your own words:",
    "Summarise this text:",
    "Repeat the following:",
)


def _passage(k: int) -> str:
    """A log of 20 + k lines to copy, rewrite, summarise or repeat (over 512 tokens as a chat)."""
    lines = (
        f"Station {n} logs the tide at {(n * k) % 12 + 1} o'clock near the {WORDS[(n + k) % 8]}, "
        f"checks the {WORDS[(n * 3 + k) % 8]}, and notes the wind."
        for n in range(20 + k)
    )
    return f"{ASKS[k % 4]}\n\n{' '.join(lines)}"


PROMPTS = [_passage(k) for k in (3, 4, 5)]
"""Where the stock kernels part (an ad hoc run of these loads, 160 tokens): without flash
attention the 1st and 3rd under speculation; with it (the default) the 1st and 2nd under
speculation and all three beside other requests."""
OTHERS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List five fruits and their colours.",
)
TOKENS = 160


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not REAL_MODEL.exists():
        pytest.fail("the real model is not in fixtures/real: run `make fixtures`")
    running = start_server(tmp_path_factory.mktemp("runtime"))
    try:
        for alias, spec in (("plain", "off"), ("spec", "ngram")):
            answer = running.load(
                REAL_MODEL,
                alias=alias,
                ctx=4 * 1024,
                lanes=4,
                threads=2,
                flash_attn="off",
                spec=spec,
            )
            assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


def _chat(server: Server, model: str, content: str) -> tuple[str, dict[str, Any]]:
    """The reply's text and its receipt."""
    with server.http(timeout=300) as http:
        answer = http.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": TOKENS,
                "temperature": 0,
            },
        )
        assert answer.status_code == 200, answer.text
        receipt = http.get(f"/api/runtime/requests/{answer.headers['x-request-id']}/receipt")
        assert receipt.status_code == 200, receipt.text
    text: str = answer.json()["choices"][0]["message"]["content"]
    return text, receipt.json()


def test_both_loads_say_their_contexts_are_batch_invariant_in_events_and_state(
    server: Server,
) -> None:
    completed = [
        e for e in server.events() if e["kind"] == "serving_backend_initialization_completed"
    ]
    assert len(completed) == 2, completed
    assert [summary_value(e, "batch_invariant") for e in completed] == [1, 1]
    assert [summary_value(e, "flash_attention") for e in completed] == [0, 0]
    with server.http() as http:
        models = http.get("/api/runtime/state").json()["models"]
    assert {m["model_id"]: m.get("batch_invariant") for m in models} == {
        "plain": True,
        "spec": True,
    }


@pytest.mark.parametrize("prompt", PROMPTS, ids=["repeat", "copy", "rewrite"])
def test_a_text_is_the_same_alone_under_speculation_and_beside_other_requests(
    server: Server, prompt: str
) -> None:
    alone, receipt = _chat(server, "plain", prompt)
    assert receipt["prompt_tokens"] > 512, receipt["prompt_tokens"]
    speculated, spec_receipt = _chat(server, "spec", prompt)
    assert spec_receipt["speculative"]["accepted"] > 0, spec_receipt["speculative"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_chat, server, "plain", c) for c in (prompt, *OTHERS)]
        (beside, beside_receipt), *_ = [f.result() for f in futures]
    assert beside_receipt["max_batch"] >= 2, beside_receipt
    assert speculated == alone
    assert beside == alone
