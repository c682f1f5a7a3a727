"""Greedy chat under seven of llama.cpp's vendored chat templates equals llama-server's.

The real model's weights and vocabulary (SmolLM2-135M-Instruct, Q4_1) are loaded once per
template with `load --chat-template` (Llama 3.1 and Hermes 2 Pro with a tool in the request, Gemma
2, Phi 3.5, Mistral Nemo, Granite 3.3, Qwen 2.5), and each chat goes through the official `openai`
client. tests/golden/chat_greedy.json holds llama-server's answers to the same bodies with the same
template (`--jinja --chat-template-file`), made by `python -m scripts.golden_chat_greedy`: the
text must be byte-identical and the prompt must be the same number of tokens.

Twice: llama-server `-fa off` on the ggml CPU library that skippyctl's engines without flash
attention compute with (batch-invariant products, skippyctl/engine/kernels.py;
tests/golden/chat_greedy_fa_off.json) against the default load (`--flash-attn auto`: off on a
CPU), and llama-server with flash attention (`-fa on`, its own choice on a CPU) against a load
with `--flash-attn on`. The kernels round differently, and a greedy text can part on that
(the two goldens differ in 5 of the 16 chats: near ties of this small model); with the same
kernels the texts are byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import (
    REAL_MODEL,
    VENDORED_TEMPLATES,
    Server,
    openai_client,
    start_server,
    stop_server,
)
from tests.goldens import golden

GOLDENS = {
    # The load's --flash-attn (None: the default, off on a CPU) → llama-server's answers with
    # that kernel.
    None: json.loads(golden("chat_greedy_fa_off.json").read_text()),
    "on": json.loads(golden("chat_greedy.json").read_text()),
}
GOLDEN = GOLDENS[None]
CASES = [(template, case) for template, cases in GOLDEN["templates"].items() for case in cases]


def test_the_golden_covers_five_templates_and_one_with_tools() -> None:
    assert len(GOLDEN["templates"]) >= 5
    assert any(case["request"].get("tools") for _, case in CASES)


def test_both_goldens_ask_the_same_chats() -> None:
    def asked(golden: dict[str, Any]) -> list[Any]:
        return [(t, c["request"]) for t, cases in golden["templates"].items() for c in cases]

    assert asked(GOLDENS[None]) == asked(GOLDENS["on"])


@pytest.fixture(scope="module", params=list(GOLDENS), ids=["default", "fa-on"])
def flash_attn(request: pytest.FixtureRequest) -> str | None:
    """The load's --flash-attn; its golden is GOLDENS[flash_attn]."""
    return request.param  # type: ignore[no-any-return]


def _expected(flash_attn: str | None, template: str, case: dict[str, Any]) -> dict[str, Any]:
    """llama-server's answer with the load's attention kernel to the chat `case` asks."""
    answers = GOLDENS[flash_attn]["templates"][template]
    (answer,) = [a for a in answers if a["name"] == case["name"]]
    assert answer["request"] == case["request"]
    return answer  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, flash_attn: str | None) -> Iterator[Server]:
    if not REAL_MODEL.exists():
        pytest.fail("the real model is not in fixtures/real: run `make fixtures`")
    # Templates that print today's date print the day llama-server answered the goldens.
    running = start_server(
        tmp_path_factory.mktemp("runtime"),
        env={"SKIPPY_TEST_TEMPLATE_DATE": GOLDENS[flash_attn]["rendered_on"]},
    )
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def serving(runtime: Server) -> Iterator[dict[str, str]]:
    """Template file name → the alias serving the real model with it (loaded on first use)."""
    aliases: dict[str, str] = {}
    yield aliases
    with runtime.http() as http:
        for alias in aliases.values():
            http.post(f"/api/runtime/models/{alias}/unload", json={"force": True})


def _alias_for(
    runtime: Server,
    serving: dict[str, str],
    template: str,
    flash_attn: str | None,
    use: str = "",
) -> str:
    """The alias serving `template`; another `use` is another load, with no prompt cached (a
    repeated prompt served from the cache is a different computation: llama-server's second
    answer to the same greedy request can differ from its first too)."""
    key = template + use
    if key not in serving:
        alias = f"t{len(serving)}"
        answer = runtime.load(
            REAL_MODEL,
            alias=alias,
            ctx=2048,
            lanes=1,
            threads=1,  # as the golden's llama-server: a near tie may fall the other way on 2
            chat_template=str(VENDORED_TEMPLATES / template),
            **({} if flash_attn is None else {"flash_attn": flash_attn}),
        )
        assert answer["state"] == "available", answer
        serving[key] = alias
    return serving[key]


@pytest.mark.parametrize(
    ("template", "case"), CASES, ids=[f"{t.removesuffix('.jinja')}-{c['name']}" for t, c in CASES]
)
def test_greedy_chat_equals_llama_server_s_under_the_template(
    runtime: Server,
    serving: dict[str, str],
    flash_attn: str | None,
    template: str,
    case: dict[str, Any],
) -> None:
    alias = _alias_for(runtime, serving, template, flash_attn)
    case = _expected(flash_attn, template, case)
    completion = openai_client(runtime).chat.completions.create(model=alias, **case["request"])
    choice = completion.choices[0]
    assert completion.usage is not None
    content = choice.message.content or ""
    assert content == case["content"]
    assert completion.usage.prompt_tokens == case["prompt_tokens"]
    assert choice.finish_reason == case["finish_reason"]
    # llama-server counts the end-of-generation token it sampled; skippyctl counts the reply's.
    eos = 1 if case["finish_reason"] == "stop" else 0
    assert completion.usage.completion_tokens == case["completion_tokens"] - eos
    assert [c.function.name for c in choice.message.tool_calls or ()] == [
        c["name"] for c in case["tool_calls"]
    ]


TOOL_CASES = [(t, c) for t, c in CASES if c["request"].get("tools")]


@pytest.mark.parametrize(
    ("template", "case"), TOOL_CASES, ids=[t.removesuffix(".jinja") for t, _ in TOOL_CASES]
)
def test_a_streamed_chat_with_tools_equals_llama_server_s_whole_reply(
    runtime: Server,
    serving: dict[str, str],
    flash_attn: str | None,
    template: str,
    case: dict[str, Any],
) -> None:
    alias = _alias_for(runtime, serving, template, flash_attn, "stream")
    case = _expected(flash_attn, template, case)
    chunks = list(
        openai_client(runtime).chat.completions.create(model=alias, stream=True, **case["request"])
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == case["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == case["finish_reason"]
