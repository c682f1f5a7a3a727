"""Tool calls end to end on the real instruct model (SmolLM2-135M-Instruct, Q4_1), through the
official `openai` client: `tools`, `tool_choice`, `parallel_tool_calls`, the reply parsed into
`tool_calls` (streamed as deltas and not) and the receipt's counts.

SmolLM2's own template has no tools section (the template decides what a request's `tools` do:
here, nothing), but the model copies a few-shot pattern greedily: two earlier turns in which the
assistant answered with `<tool_call>` blocks (or Llama 3's bare JSON) make its greedy reply a call
of the same form for the new question, with the new question's argument. So the model really
writes the calls and the runtime really parses them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.api.conftest import VENDORED_TEMPLATES, Server, openai_client, real_model_server
from tests.goldens import golden

SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with the "
    "user query. For each function call return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags."
)


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.removeprefix('get_')} in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }


TOOLS = [_tool("get_weather"), _tool("get_time")]


def _hermes(name: str, city: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


def _few_shot(answer: Any, question: Any) -> list[dict[str, str]]:
    """Two solved turns, then the question the model answers in the same form."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question("Paris")},
        {"role": "assistant", "content": answer("Paris")},
        {"role": "user", "content": question("Berlin")},
        {"role": "assistant", "content": answer("Berlin")},
        {"role": "user", "content": question("Oslo")},
    ]


ONE_CALL = _few_shot(
    lambda city: _hermes("get_weather", city), lambda city: f"What is the weather in {city}?"
)
TWO_CALLS = _few_shot(
    lambda city: _hermes("get_weather", city) + "\n" + _hermes("get_time", city),
    lambda city: f"Weather and time in {city}?",
)
LLAMA3_JSON = _few_shot(
    lambda city: f'{{"name": "get_weather", "parameters": {{"city": "{city}"}}}}',
    lambda city: f"What is the weather in {city}?",
)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with real_model_server(
        tmp_path_factory.mktemp("runtime"), "smollm2", ctx=2048, lanes=1
    ) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    client: openai.OpenAI = openai_client(server)
    return client


def _chat(server: Server, messages: list[dict[str, str]], **extra: Any) -> tuple[Any, str]:
    """The completion (greedy) and its request id."""
    raw = _client(server).chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, max_tokens=80, temperature=0, **extra
    )
    return raw.parse(), raw.headers["x-request-id"]


def _calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def test_a_hermes_call_comes_back_as_tool_calls_with_null_content(real: Server) -> None:
    completion, request_id = _chat(real, ONE_CALL, tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert _calls(choice.message) == [("get_weather", {"city": "Oslo"})]
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    receipt = real.receipt(request_id)
    assert (receipt["tools"], receipt["tool_calls"]) == (2, 1)
    assert "get_weather" not in json.dumps(receipt)  # counts, never names


def test_several_calls_and_parallel_tool_calls_false_keeps_the_first(real: Server) -> None:
    completion, request_id = _chat(real, TWO_CALLS, tools=TOOLS)
    assert _calls(completion.choices[0].message) == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {"city": "Oslo"}),
    ]
    assert real.receipt(request_id)["tool_calls"] == 2
    single, single_id = _chat(real, TWO_CALLS, tools=TOOLS, parallel_tool_calls=False)
    assert _calls(single.choices[0].message) == [("get_weather", {"city": "Oslo"})]
    assert real.receipt(single_id)["tool_calls"] == 1


def test_a_llama3_json_reply_naming_a_tool_is_a_call(real: Server) -> None:
    completion, _ = _chat(real, LLAMA3_JSON, tools=TOOLS)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert _calls(completion.choices[0].message) == [("get_weather", {"city": "Oslo"})]


def test_tool_choice_none_and_no_tools_leave_the_reply_as_text(real: Server) -> None:
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        completion, request_id = _chat(real, ONE_CALL, **extra)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop" and choice.message.tool_calls is None
        assert choice.message.content == _hermes("get_weather", "Oslo")
        assert (real.receipt(request_id)["tools"], real.receipt(request_id)["tool_calls"]) == (
            0,
            0,
        )


def test_a_reply_without_a_call_is_plain_content_even_with_tools(real: Server) -> None:
    completion, request_id = _chat(
        real, [{"role": "user", "content": "Say hello."}], tools=TOOLS, max_completion_tokens=12
    )
    choice = completion.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert real.receipt(request_id)["tool_calls"] == 0


def test_streamed_calls_accumulate_in_the_official_client_to_the_non_streamed_ones(
    real: Server,
) -> None:
    expected, _ = _chat(real, TWO_CALLS, tools=TOOLS)
    client = _client(real)
    with client.chat.completions.stream(
        model="smollm2", messages=TWO_CALLS, tools=TOOLS, max_tokens=80, temperature=0
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert _calls(message) == _calls(expected.choices[0].message)
    assert not message.content
    assert [c.id for c in message.tool_calls or ()] != [
        c.id for c in expected.choices[0].message.tool_calls
    ]  # fresh ids per reply


def test_streamed_tool_call_chunks_have_openai_s_shape(real: Server) -> None:
    chunks = list(
        _client(real).chat.completions.create(
            model="smollm2",
            messages=ONE_CALL,
            tools=TOOLS,
            max_tokens=80,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first, *rest = calls
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert all(r.index == 0 and r.id is None and r.function.name is None for r in rest)
    arguments = "".join(r.function.arguments for r in rest)
    assert json.loads(arguments) == {"city": "Oslo"}
    assert not "".join(d.content or "" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tools": TOOLS, "tool_choice": "required"}, "teaches no tool-call form"),
        ({"tool_choice": "required"}, "needs 'tools'"),
    ],
)
def test_a_forced_call_the_runtime_cannot_force_is_a_400_naming_tool_choice(
    real: Server, extra: dict[str, Any], words: str
) -> None:
    # SmolLM2's own template has no tools section: there is no form to write a call in.
    with real.http() as http:
        response = http.post(
            "/v1/chat/completions", json={"model": "smollm2", "messages": ONE_CALL, **extra}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tool_choice"
    assert words in error["message"]


# -- against llama-server: the real model with a vendored tool template (tests/golden/README.md)
GOLDEN_TOOL_CALLS = json.loads(golden("tool_calls.json").read_text())


def _with_template(factory: pytest.TempPathFactory, template: str) -> Iterator[Server]:
    """The real model served as `smollm2` under a vendored chat template."""
    with real_model_server(
        factory.mktemp("runtime"),
        "smollm2",
        ctx=2048,
        lanes=1,
        chat_template=str(VENDORED_TEMPLATES / template),
        # The goldens' llama-server ran with flash attention (its choice on a CPU).
        flash_attn="on",
    ) as running:
        yield running


@pytest.fixture(scope="module")
def with_tool_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _with_template(tmp_path_factory, GOLDEN_TOOL_CALLS["template"])


@pytest.mark.parametrize("case", GOLDEN_TOOL_CALLS["cases"], ids=lambda case: case["name"])
def test_tool_calls_equal_llama_server_s_with_the_template_s_tool_section(
    with_tool_template: Server, case: dict[str, Any]
) -> None:
    body = case["request"]
    peer = case
    completion = _client(with_tool_template).chat.completions.create(model="smollm2", **body)
    choice = completion.choices[0]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == peer["prompt_tokens"]
    # llama-server counts the end-of-generation token it sampled; skippyctl counts the reply's.
    assert completion.usage.completion_tokens == peer["completion_tokens"] - 1
    assert choice.finish_reason == peer["finish_reason"]
    # llama-server says "" where a reply was only calls; OpenAI (and skippyctl) say null.
    assert (choice.message.content or "") == peer["content"]
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ()
    ] == [(c["name"], json.loads(c["arguments"])) for c in peer["tool_calls"]]


# -- tool_choice required / named: a grammar forces one call in the template's form

WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def with_llama3_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _with_template(tmp_path_factory, "meta-llama-Llama-3.1-8B-Instruct.jinja")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("choice", "name"),
    [
        ("required", "get_weather"),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
    ],
    ids=["required", "named"],
)
@pytest.mark.parametrize("template", ["hermes", "llama3"])
def test_a_forced_call_is_one_call_of_the_allowed_tool_with_valid_arguments(
    request: pytest.FixtureRequest, template: str, choice: Any, name: str, stream: bool
) -> None:
    # Unforced, SmolLM2 answers this question in prose under both templates (tests/golden/
    # chat_greedy.json): the call below is the grammar's doing.
    server = request.getfixturevalue(
        "with_tool_template" if template == "hermes" else "with_llama3_template"
    )
    created = _client(server).chat.completions.create(
        model="smollm2",
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=60,
        temperature=0,
        stream=stream,
    )
    if stream:
        chunks = list(created)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in d.tool_calls or ()]
        names = "".join(tc.function.name or "" for tc in calls)
        arguments = "".join(tc.function.arguments or "" for tc in calls)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        content = "".join(d.content or "" for d in deltas)
        assert {tc.index for tc in calls} == {0}
    else:
        choice_out = created.choices[0]
        assert len(choice_out.message.tool_calls or ()) == 1
        call = choice_out.message.tool_calls[0]
        names, arguments = call.function.name, call.function.arguments
        finish, content = choice_out.finish_reason, choice_out.message.content or ""
    assert names == name
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"
    assert content == ""


def test_a_forced_call_refuses_a_name_tools_lacks_and_a_second_constraint(
    with_tool_template: Server,
) -> None:
    base = {"model": "smollm2", "messages": WEATHER_QUESTION, "tools": TOOLS}
    for extra, words in (
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "lacks"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "combined"),
        ({"tool_choice": "required", "grammar": 'root ::= "x"'}, "combined"),
    ):
        with with_tool_template.http() as http:
            response = http.post("/v1/chat/completions", json={**base, **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tool_choice"
        assert words in error["message"]
