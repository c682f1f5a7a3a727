"""Chats rendered by the model's own Jinja template, through a real runtime and the official
`openai` client: the real SmolLM2 model against llama-server's answers, and fixture models whose
templates are hostile (each such chat a 400 with a reason code, the model serving the next)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import openai
import pytest

from skippyctl.engine.text import model_chat_template
from skippyctl.fixtures.generate import TINY, make_model
from tests.api.conftest import Server, assert_openai_error, start_server, stop_server
from tests.goldens import golden

REAL_MODEL = Path(__file__).parents[2] / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WEATHER_TOOL: dict[str, Any] = {
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
# llama-server's greedy answers (`temperature: 0`, `max_tokens: 24`) under the model's own
# template: content and usage.prompt_tokens (`python -m scripts.golden_model_template`).
LLAMA_SERVER_GREEDY = json.loads(golden("model_template_greedy.json").read_text())["cases"]
HOSTILE = {
    "raises": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "huge-range": ("{% for i in range(10**9) %}x{% endfor %}", "size"),
    "nested-loops": (
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        "loop iterations",
    ),
    "dunder": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed"),
}


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


@pytest.fixture(scope="module")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("smollm"))
    try:
        # LLAMA_SERVER_GREEDY's texts came from llama-server's default, flash attention on.
        answer = running.load(REAL_MODEL, lanes=1, ctx=1024, alias="smollm", flash_attn="on")
        assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


@pytest.mark.parametrize("case", LLAMA_SERVER_GREEDY, ids=lambda case: case["name"])
def test_greedy_chat_equals_llama_server(smollm: Server, case: dict[str, Any]) -> None:
    extra: dict[str, Any] = {} if case["tools"] is None else {"tools": case["tools"]}
    chat = _client(smollm).chat.completions.create(
        model="smollm", messages=case["messages"], max_tokens=24, temperature=0, **extra
    )  # type: ignore[call-overload]
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == case["prompt_tokens"]
    assert chat.choices[0].message.content == case["content"]


def test_assistant_tool_calls_and_tool_results_are_accepted(smollm: Server) -> None:
    chat = _client(smollm).chat.completions.create(
        model="smollm",
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        max_tokens=4,
        temperature=0,
    )
    assert chat.usage is not None and chat.usage.prompt_tokens > 30


def test_chat_template_kwargs_of_the_wrong_type_are_a_400(smollm: Server) -> None:
    with smollm.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={
                "model": "smollm",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template_kwargs": {"enable_thinking": "yes"},
            },
        )
    error = assert_openai_error(response, 400)
    assert error["reason_code"] == "invalid_configuration"
    assert "enable_thinking" in error["message"]


def test_a_message_without_content_or_tool_calls_is_a_400(smollm: Server) -> None:
    with smollm.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": "smollm", "max_tokens": 2, "messages": [{"role": "user"}]},
        )
    error = assert_openai_error(response, 400)
    assert error["param"] == "messages[0].content"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = tmp_path_factory.mktemp("hostile-models")
    running = start_server(tmp_path_factory.mktemp("hostile"))
    try:
        for name, (template, _why) in HOSTILE.items():
            spec = dataclasses.replace(TINY, chat_template=template, name=f"skippy-{name}")
            path = make_model(models / f"{name}.gguf", spec)
            answer = running.load(path, lanes=1, alias=name)
            assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_a_400_and_the_model_serves_on(hostile: Server, name: str) -> None:
    why = HOSTILE[name][1]
    chat = {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with hostile.http() as http:
        for _ in range(2):  # the second request finds the engine alive and refuses it the same way
            error = assert_openai_error(http.post("/v1/chat/completions", json=chat), 400)
            assert error["reason_code"] == "invalid_configuration"
            assert why in error["message"]
        completion = http.post(
            "/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 2}
        )
        assert completion.status_code == 200, completion.text
        assert http.get("/health").json()["models"][name] == "available"


def test_load_with_a_chat_template_file_serves_chats_with_it(
    hostile: Server, fixture_dir: Path, tmp_path: Path
) -> None:
    template = tmp_path / "mine.jinja"
    template.write_text("{{ raise_exception('the override is in use') }}", "utf-8")
    answer = hostile.load(
        fixture_dir / "tiny.gguf", alias="overridden", chat_template=str(template)
    )
    assert answer["state"] == "available", answer
    chat = {"model": "overridden", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with hostile.http() as http:
        error = assert_openai_error(http.post("/v1/chat/completions", json=chat), 400)
        assert "the override is in use" in error["message"]
        state = http.get("/api/runtime/state").json()
    # The file's path is the host's alone: never in the state document.
    assert str(tmp_path) not in str(state)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{% if %}", "not valid Jinja"),
        (b"\xff\xfe not text", "not UTF-8"),
        (b"", "empty"),
    ],
    ids=["syntax", "not-utf8", "empty"],
)
def test_load_with_a_bad_chat_template_file_is_refused(
    hostile: Server, fixture_dir: Path, tmp_path: Path, content: bytes, why: str
) -> None:
    template = tmp_path / "bad.jinja"
    template.write_bytes(content)
    with hostile.http() as http:
        response = http.post(
            "/api/runtime/models/load",
            json={
                "model": str(fixture_dir / "tiny.gguf"),
                "alias": "refused",
                "chat_template": str(template),
            },
        )
        body = response.json()
        assert body["problem"].startswith("--chat-template: "), body
        assert why in body["problem"]
        assert str(tmp_path) not in str(body)
        assert http.get("/health").json()["models"]["refused"] == "failed"
        (model,) = (
            m for m in http.get("/api/runtime/state").json()["models"] if m["model_id"] == "refused"
        )
        assert model["reason_code"] == "invalid_configuration", model


def _sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def test_state_and_ps_say_which_template_serves(smollm: Server) -> None:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(REAL_MODEL), params)
    try:
        source = model_chat_template(llama_cpp, model)
    finally:
        llama_cpp.llama_model_free(model)
    assert source is not None
    expected = {"source": "model", "sha256": _sha16(source)}
    with smollm.http() as http:
        models = http.get("/api/runtime/state").json()["models"]
    (state,) = (m for m in models if m["model_id"] == "smollm")
    assert state["chat_template"] == expected
    ps = subprocess.run(
        [sys.executable, "-m", "skippyctl", "ps", "--json"],
        env=dict(os.environ, SKIPPY_RUNTIME_DIR=str(smollm.directory)),
        capture_output=True,
        check=True,
    )
    assert expected == next(
        m["chat_template"] for m in json.loads(ps.stdout)["models"] if m["model_id"] == "smollm"
    )


def test_the_load_completed_event_states_an_override_by_digest(
    hostile: Server, fixture_dir: Path, tmp_path: Path
) -> None:
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    template = tmp_path / "digest.jinja"
    template.write_text(text, "utf-8")
    answer = hostile.load(fixture_dir / "tiny.gguf", alias="digested", chat_template=str(template))
    assert answer["state"] == "available", answer
    with hostile.http() as http:
        models = http.get("/api/runtime/state").json()["models"]
    (state,) = (m for m in models if m["model_id"] == "digested")
    assert state["chat_template"] == {"source": "override", "sha256": _sha16(text)}
    (builtin,) = (m for m in models if m["model_id"] == "raises")
    assert builtin["chat_template"]["source"] == "model"


def test_a_streamed_chat_refused_by_its_template_says_why(hostile: Server) -> None:
    chat = {
        "model": "raises",
        "max_tokens": 2,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with hostile.http() as http:
        response = http.post("/v1/chat/completions", json=chat)
    text = response.text
    assert "roles must alternate" in text, (response.status_code, text[:500])
    assert "invalid_configuration" in text
