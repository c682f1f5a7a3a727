"""Chat templates rendered as llama-server renders them (``--jinja``): the vendored collection of
real templates, the real SmolLM2 template through its own vocabulary, and hostile templates that
must end in a clean :class:`ChatTemplateError`."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine.chat_template import (
    CHATML_TEMPLATE,
    MAX_RENDER_CHARS,
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
    ToolCall,
    parse_check,
)
from skippyctl.engine.model_loader import chat_template_facts
from skippyctl.engine.request_intake import RequestIntake
from skippyctl.engine.text import model_chat_template, token_text, tokenize
from skippyctl.fixtures.generate import TINY, make_model

FIXTURES = Path(__file__).parents[2] / "fixtures"
TEMPLATES = sorted((FIXTURES / "vendor" / "templates").glob("*.jinja"))
REAL_MODEL = FIXTURES / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = (ChatMessage("system", "be brief"), ChatMessage("user", "hello world"))
CHATML_RENDERED = (
    "<|im_start|>system\nbe brief<|im_end|>\n"
    "<|im_start|>user\nhello world<|im_end|>\n"
    "<|im_start|>assistant\n"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_CHAT = (
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage(
        "assistant",
        None,
        tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', id="call_1"),),
    ),
    ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"),
)


# ---------------------------------------------------------------- ChatML, llama.cpp's fallback


def test_chatml_renders_as_llama_server_does() -> None:
    assert ChatTemplate(CHATML_TEMPLATE).render(CHAT) == CHATML_RENDERED


def test_chat_without_generation_prompt_ends_after_the_last_turn() -> None:
    rendered = ChatTemplate(CHATML_TEMPLATE).render(CHAT, add_generation_prompt=False)
    assert rendered == CHATML_RENDERED.removesuffix("<|im_start|>assistant\n")


def test_text_parts_join_with_newlines_for_a_string_template() -> None:
    message = ChatMessage("user", None, parts=("one", "two"))
    rendered = ChatTemplate(CHATML_TEMPLATE).render((message,))
    assert rendered.startswith("<|im_start|>user\none\ntwo<|im_end|>\n")


def test_developer_role_is_rendered_as_system() -> None:
    rendered = ChatTemplate(CHATML_TEMPLATE).render((ChatMessage("developer", "rules"),))
    assert rendered.startswith("<|im_start|>system\nrules<|im_end|>")


def test_leading_bos_text_is_cut_when_the_tokenizer_adds_bos() -> None:
    source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
    adds = ChatTemplate(source, bos_token="<s>", eos_token="</s>", add_bos=True, add_eos=True)
    keeps = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert adds.render((ChatMessage("user", "x"),)) == "x"
    assert keeps.render((ChatMessage("user", "x"),)) == "<s>x</s>"


def test_template_variables_follow_llama_server() -> None:
    source = (
        "{{ add_generation_prompt is defined }}|{{ enable_thinking }}|{{ tools is defined }}|"
        "{{ flavour }}|{{ date_string is string }}"
    )
    template = ChatTemplate(source)
    chat = (ChatMessage("user", "x"),)
    assert template.render(chat, add_generation_prompt=False) == "False|False|False||True"
    assert (
        template.render(chat, tools=[WEATHER_TOOL], chat_template_kwargs={"flavour": "mint"})
        == "True|False|True|mint|True"
    )
    assert template.render(chat, chat_template_kwargs={"enable_thinking": True}).startswith(
        "True|True|"
    )
    with pytest.raises(ChatTemplateError, match="enable_thinking"):
        template.render(chat, chat_template_kwargs={"enable_thinking": "yes"})


def test_enable_thinking_defaults_on_for_a_template_that_thinks() -> None:
    # llama-server turns thinking on by default only where the template opens a reasoning block.
    source = (
        "{{ messages[0].content }}{% if add_generation_prompt %}<|assistant|>"
        "{% if not enable_thinking %}<think></think>{% endif %}{% endif %}"
    )
    template = ChatTemplate(source)
    assert template.caps.supports_thinking
    chat = (ChatMessage("user", "x"),)
    assert template.render(chat) == "x<|assistant|>"
    off = {"enable_thinking": False}
    assert template.render(chat, chat_template_kwargs=off) == "x<|assistant|><think></think>"


def test_tojson_is_transformers_tojson() -> None:
    template = ChatTemplate("{{ tools | tojson }}|{{ tools[0].function.name | tojson(indent=2) }}")
    rendered = template.render((ChatMessage("user", "x"),), tools=[WEATHER_TOOL])
    assert rendered.startswith('[{"type": "function", "function": {"name": "get_weather"')
    assert rendered.endswith('|"get_weather"')


def test_object_arguments_reach_a_template_that_reads_them() -> None:
    source = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.name }}({{ c.function.arguments | tojson }})"
        "{% endfor %}{% endfor %}"
    )
    template = ChatTemplate(source)
    assert template.caps.supports_object_arguments
    assert template.render(TOOL_CHAT) == 'get_weather({"city": "Paris"})'


def test_string_arguments_stay_text_for_a_template_that_prints_them() -> None:
    source = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.arguments }}{% endfor %}{% endfor %}"
    )
    template = ChatTemplate(source)
    assert not template.caps.supports_object_arguments
    assert template.render(TOOL_CHAT) == '{"city": "Paris"}'


def test_system_message_merges_into_the_next_for_a_template_without_system_role() -> None:
    source = (
        "{% for m in messages %}{% if m.role != 'system' %}[{{ m.role }}:{{ m.content }}]"
        "{% endif %}{% endfor %}"
    )
    assert ChatTemplate(source).render(CHAT) == "[user:be brief\nhello world]"


# ---------------------------------------------------------------- the vendored collection


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_every_vendored_template_renders_a_plain_chat(path: Path) -> None:
    template = ChatTemplate(path.read_text("utf-8"), bos_token="<s>", eos_token="</s>")
    assert "hello world" in template.render(CHAT)


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_every_vendored_template_takes_a_tool_chat_or_refuses_cleanly(path: Path) -> None:
    template = ChatTemplate(path.read_text("utf-8"), bos_token="<s>", eos_token="</s>")
    try:
        rendered = template.render(TOOL_CHAT, tools=[WEATHER_TOOL])
    except ChatTemplateError:
        return  # a clean refusal (e.g. a template that allows no tool role)
    assert "Paris" in rendered


def test_vendored_collection_is_present() -> None:
    assert len(TEMPLATES) >= 50


# ---------------------------------------------------------------- the real model's template


@pytest.fixture(scope="module")
def real_model() -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(REAL_MODEL), params)
    assert model
    yield model
    llama_cpp.llama_model_free(model)


def _real_template(model: Any) -> ChatTemplate:
    vocab = llama_cpp.llama_model_get_vocab(model)
    source = model_chat_template(llama_cpp, model)
    assert source is not None
    return ChatTemplate(
        source,
        bos_token=token_text(llama_cpp, vocab, llama_cpp.llama_vocab_bos(vocab)),
        eos_token=token_text(llama_cpp, vocab, llama_cpp.llama_vocab_eos(vocab)),
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
    )


def test_smollm2_template_adds_its_default_system_message(real_model: Any) -> None:
    rendered = _real_template(real_model).render((ChatMessage("user", "Hello"),))
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_prompt_tokens_count_the_system_message(real_model: Any) -> None:
    vocab = llama_cpp.llama_model_get_vocab(real_model)
    rendered = _real_template(real_model).render((ChatMessage("user", "Hello"),))
    # llama-server --jinja counts 31 prompt tokens for this chat.
    assert len(tokenize(llama_cpp, vocab, rendered)) == 31


def test_a_final_assistant_message_is_continued_as_llama_server_does(real_model: Any) -> None:
    chat = (ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello! I am"))
    # llama-server --jinja's /apply-template for the same messages (prefill_assistant).
    assert _real_template(real_model).render(chat) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! I am"
    )
    twice = (*chat, ChatMessage("assistant", "x"))
    with pytest.raises(ChatTemplateError, match="2 or more assistant messages"):
        _real_template(real_model).render(twice)


# ---------------------------------------------------------------- hostile templates


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("{% for i in range(10**9) %}x{% endfor %}", "size"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "loop"),
        (
            "{% set l = range(99999) | list %}{% for i in l %}{% for j in l %}{% endfor %}"
            "{% endfor %}",
            "loop",
        ),
        ("{{ 'x' * 10**8 }}", "size"),
        ("{{ 'x' | center(10**9) }}", "size"),
        (
            "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "long",
        ),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed"),
        ("{{ messages + 1 }}", "failed"),
        ("{{ 1 / 0 }}", "failed"),
    ],
    ids=[
        "huge-range",
        "nested-ranges",
        "nested-lists",
        "repeat",
        "center",
        "doubling-concat",
        "dunder",
        "raises",
        "recursion",
        "list-plus-number",
        "zero-division",
    ],
)
def test_hostile_templates_fail_cleanly(source: str, why: str) -> None:
    template = ChatTemplate(source)
    with pytest.raises(ChatTemplateError) as caught:
        template.render(CHAT)
    assert why in str(caught.value) or why in ("size", "loop", "long")


def test_undefined_is_as_lenient_as_llama_cpp() -> None:
    # llama.cpp's engine: a member of undefined is undefined, undefined or null + text is the
    # text, nothing is in undefined; Cohere's and firefunction's templates rely on it.
    source = (
        "{{ 'a' + nothing.at.all }}|{{ none + 'b' }}|{{ 'x' in nothing }}|{{ messages[9].role }}"
    )
    assert ChatTemplate(source).render(CHAT, chat_template_kwargs={"none": None}) == "a|b|False|"


def test_raise_exception_message_reaches_the_error() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render(CHAT)


def test_output_past_the_bound_is_refused() -> None:
    source = "{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}"
    assert MAX_RENDER_CHARS < 5000 * 1000
    with pytest.raises(ChatTemplateError, match="rendered more than"):
        ChatTemplate(source).render(CHAT)


@pytest.mark.parametrize(
    "source", ["{% if %}", "{{ x", "{% for %}", "{% endfor %}", "{{ skippy_budgeted_iteration }}"]
)
def test_unparsable_templates_are_refused_at_compile(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        parse_check(source)


def test_empty_chat_is_refused() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(CHATML_TEMPLATE).render(())


# ---------------------------------------------------------------- which template serves


DEFAULT_SOURCE = "default:{% for m in messages %}{{ m.content }}{% endfor %}"
TOOL_USE_SOURCE = "tool_use:{{ tools | length }}"


def _fixture_model(directory: Path, name: str, templates: Any) -> Any:
    # gguf's writer takes [{"name", "template"}] for named templates (tokenizer.chat_template.NAME)
    spec = dataclasses.replace(TINY, chat_template=templates, name=name)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(make_model(directory / f"{name}.gguf", spec)), params
    )
    assert model
    return model


@pytest.fixture(scope="module")
def two_template_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    templates = [
        {"name": "default", "template": DEFAULT_SOURCE},
        {"name": "tool_use", "template": TOOL_USE_SOURCE},
    ]
    model = _fixture_model(tmp_path_factory.mktemp("two"), "skippy-two-templates", templates)
    yield model
    llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def untemplated_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    model = _fixture_model(tmp_path_factory.mktemp("none"), "skippy-no-template", None)
    yield model
    llama_cpp.llama_model_free(model)


def test_a_request_with_tools_gets_the_tool_use_template(two_template_model: Any) -> None:
    intake = RequestIntake(llama_cpp, two_template_model, tokens_per_lane=256)
    assert intake.template_for(with_tools=False).source == DEFAULT_SOURCE
    assert intake.template_for(with_tools=True).source == TOOL_USE_SOURCE
    facts = chat_template_facts(llama_cpp, two_template_model, None)
    assert facts == {
        "chat_template_source": "model",
        "chat_template_sha256": hashlib.sha256(DEFAULT_SOURCE.encode()).hexdigest()[:16],
        "chat_template_tool_use": True,
    }


def test_an_override_serves_every_chat(two_template_model: Any) -> None:
    intake = RequestIntake(
        llama_cpp, two_template_model, tokens_per_lane=256, chat_template="override"
    )
    assert intake.template_for(with_tools=False).source == "override"
    assert intake.template_for(with_tools=True).source == "override"
    facts = chat_template_facts(llama_cpp, two_template_model, "override")
    assert facts["chat_template_source"] == "override"
    assert facts["chat_template_tool_use"] is None


def test_a_model_without_a_template_gets_llama_cpp_chatml(untemplated_model: Any) -> None:
    assert model_chat_template(llama_cpp, untemplated_model) is None
    intake = RequestIntake(llama_cpp, untemplated_model, tokens_per_lane=256)
    assert intake.template_for(with_tools=True).render(CHAT) == CHATML_RENDERED
    facts = chat_template_facts(llama_cpp, untemplated_model, None)
    assert facts["chat_template_source"] == "builtin"
