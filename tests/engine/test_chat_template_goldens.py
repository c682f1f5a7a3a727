"""Our chat renders against llama-server's, for every chat template llama.cpp vendors.

tests/golden/chat_renders.json holds llama-server's `POST /apply-template` answers (`--jinja
--chat-template-file`, on the real model for its BOS/EOS; made by scripts/golden_chat_renders.py)
for each `fixtures/vendor/templates/*.jinja` and three chats: plain, multi-turn, and one with
tools, an assistant tool call and the tool's result. skippyctl's renderer
(skippyctl/engine/chat_template.py) must give the same text, or fail where llama-server failed.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import llama_cpp
import pytest

from skippyctl.engine import chat_template
from skippyctl.engine.chat_template import ChatMessage, ChatTemplate, ChatTemplateError, ToolCall
from skippyctl.engine.text import token_text

ROOT: Final = Path(__file__).resolve().parents[2]
GOLDEN: Final = json.loads((ROOT / "tests" / "golden" / "chat_renders.json").read_text())
TEMPLATES: Final = ROOT / "fixtures" / "vendor" / "templates"
KNOWN_DIFFERENCES: Final = {
    # llama-server renders Gemma 4 tool turns with its own code, not the template's Jinja.
    ("google-gemma-4-31B-it-interleaved.jinja", "tools"),
    # llama-server gives an earlier assistant turn an empty reasoning block (`<think></think>`)
    # on these two templates; skippyctl renders the turn as the client sent it.
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "multi_turn"),
    ("deepseek-ai-DeepSeek-V4.jinja", "multi_turn"),
}
CASES: Final = [
    (template, chat)
    for template, answers in sorted(GOLDEN["renders"].items())
    for chat in sorted(answers)
    if chat in GOLDEN["chats"]
]


def _messages(chat: dict[str, Any]) -> tuple[ChatMessage, ...]:
    return tuple(
        ChatMessage(
            m["role"],
            m.get("content"),
            tool_calls=tuple(
                ToolCall(c["function"]["name"], c["function"]["arguments"], c.get("id"))
                for c in m.get("tool_calls", ())
            ),
            name=m.get("name"),
            tool_call_id=m.get("tool_call_id"),
        )
        for m in chat["messages"]
    )


@pytest.fixture(autouse=True)
def _on_the_render_day() -> Iterator[None]:
    """Templates that print today's date print the day llama-server rendered the goldens."""
    chat_template.pin_today(datetime.date.fromisoformat(GOLDEN["rendered_on"]))
    yield
    chat_template.pin_today(None)


@pytest.fixture(scope="module")
def special_tokens() -> Iterator[dict[str, Any]]:
    """The real model's BOS/EOS texts and flags, as llama-server gave them to its templates."""
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(ROOT / "fixtures" / "real" / GOLDEN["model"]), params
    )
    assert model
    vocab = llama_cpp.llama_model_get_vocab(model)
    yield {
        "bos_token": token_text(llama_cpp, vocab, int(llama_cpp.llama_vocab_bos(vocab))),
        "eos_token": token_text(llama_cpp, vocab, int(llama_cpp.llama_vocab_eos(vocab))),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
    }
    llama_cpp.llama_model_free(model)


def test_the_goldens_cover_every_vendored_template_and_chat() -> None:
    assert set(GOLDEN["renders"]) == {p.name for p in TEMPLATES.glob("*.jinja")}
    assert len(CASES) == 3 * len(GOLDEN["renders"])


@pytest.mark.parametrize(("template", "chat"), CASES)
def test_render_equals_llama_server_s(
    special_tokens: dict[str, Any], template: str, chat: str
) -> None:
    expected = GOLDEN["renders"][template][chat]
    body = GOLDEN["chats"][chat]
    try:
        rendered: str | None = ChatTemplate(
            (TEMPLATES / template).read_text(), **special_tokens
        ).render(_messages(body), tools=body.get("tools"))
    except ChatTemplateError:
        rendered = None
    if (template, chat) in KNOWN_DIFFERENCES:
        assert rendered != expected.get("prompt")
        return
    if "error" in expected:
        assert rendered is None, "llama-server refused this chat; we rendered it"
    else:
        assert rendered == expected["prompt"]
