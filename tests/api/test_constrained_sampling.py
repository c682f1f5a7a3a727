"""Penalties, grammars and JSON output on the real instruct model (SmolLM2-135M-Instruct, Q4_1),
through the official `openai` client: `presence_penalty`, `frequency_penalty`, `repeat_last_n`,
a raw GBNF `grammar`, and `response_format` `json_object` / `json_schema` (llama.cpp's grammar
sampler), streamed and not, and the 400s of a grammar or schema llama.cpp cannot take.

The penalty expectations are llama-server's greedy answers for the same bodies on the same file
(the vendored llama.cpp's `llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --jinja -t 2 -c 2048
-np 2`, 2026-12-05): penalties are llama.cpp's own sampler, so the text is the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.api.conftest import Server, openai_client, real_model_server

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
ASK_PERSON = [{"role": "user", "content": "Give me a person with a name and an age."}]

# llama-server's greedy completions of "one one one one one" (max_tokens 12) on the same file.
LLAMA_SERVER_PENALISED = {
    (): "-to-many-to-many relationship, where a",
    (("frequency_penalty", 1.5),): (
        "-to-many relations, where the relationship between two variables"
    ),
}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with real_model_server(
        tmp_path_factory.mktemp("runtime"), "smollm2", ctx=2048, lanes=2
    ) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    client: openai.OpenAI = openai_client(server)
    return client


def _chat(server: Server, messages: list[dict[str, str]], **extra: Any) -> str:
    completion = _client(server).chat.completions.create(
        model="smollm2", messages=messages, **{"max_tokens": 60, "temperature": 0, **extra}
    )
    content = completion.choices[0].message.content
    assert content is not None
    return content


@pytest.mark.parametrize("penalties", list(LLAMA_SERVER_PENALISED))
def test_penalties_give_llama_server_s_greedy_text(
    real: Server, penalties: tuple[tuple[str, float], ...]
) -> None:
    completion = _client(real).completions.create(
        model="smollm2",
        prompt="one one one one one",
        max_tokens=12,
        temperature=0,
        **dict(penalties),
    )
    assert completion.choices[0].text == LLAMA_SERVER_PENALISED[penalties]


def test_a_frequency_penalty_changes_what_a_repetitive_prompt_gives(real: Server) -> None:
    plain, penalised = (
        _client(real)
        .completions.create(
            model="smollm2", prompt="one one one one one", max_tokens=12, temperature=0, **extra
        )
        .choices[0]
        .text
        for extra in ({}, {"frequency_penalty": 1.5, "extra_body": {"repeat_last_n": 64}})
    )
    assert plain != penalised


def test_a_grammar_allows_only_its_words(real: Server) -> None:
    for question in ("Is the sky blue?", "Is fire cold?", "Say something long."):
        answer = _chat(
            real,
            [{"role": "user", "content": question}],
            extra_body={"grammar": 'root ::= "yes" | "no"'},
        )
        assert answer in ("yes", "no")


def test_a_json_schema_reply_parses_and_has_the_schema_s_fields(real: Server) -> None:
    reply = _chat(
        real,
        ASK_PERSON,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    person = json.loads(reply)
    assert set(person) == {"name", "age"}
    assert isinstance(person["name"], str) and isinstance(person["age"], int)


def test_a_streamed_json_schema_reply_equals_the_whole_one(real: Server) -> None:
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON},
    }
    whole = _chat(real, ASK_PERSON, response_format=response_format)
    chunks = _client(real).chat.completions.create(
        model="smollm2",
        messages=ASK_PERSON,  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
        stream=True,
        response_format=response_format,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole


def test_json_object_gives_a_json_object(real: Server) -> None:
    reply = _chat(real, ASK_PERSON, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply), dict)


@pytest.mark.parametrize(
    "grammar",
    ['foo ::= "x"', 'root ::= "unterminated', "root ::= [", "root ::= undefined-rule"],
)
def test_a_grammar_llama_cpp_cannot_parse_is_a_400_and_the_model_serves_on(
    real: Server, grammar: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(real, ASK_PERSON, extra_body={"grammar": grammar})
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["reason_code"] == "invalid_configuration"
    assert "grammar" in body["message"]
    assert _chat(real, [{"role": "user", "content": "hi"}], max_tokens=4)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"grammar": ""}, "grammar"),
        (
            {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
            "grammar",
        ),
    ],
)
def test_bad_sampling_fields_are_400s_naming_them(
    real: Server, extra: dict[str, Any], param: str
) -> None:
    with real.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": "smollm2", "messages": ASK_PERSON, "max_tokens": 2, **extra},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param.split(".")[0]), error


def test_the_receipt_says_what_constrained_the_reply_never_the_grammar(real: Server) -> None:
    client = _client(real)
    for extra, constraint in (
        ({"extra_body": {"grammar": 'root ::= "yes" | "no"'}}, "grammar"),
        ({"response_format": {"type": "json_object"}}, "json_schema"),
        ({}, None),
    ):
        raw = client.chat.completions.with_raw_response.create(
            model="smollm2", messages=ASK_PERSON, max_tokens=8, temperature=0, **extra
        )
        with real.http() as http:
            receipt = http.get(
                f"/api/runtime/requests/{raw.headers['x-request-id']}/receipt"
            ).json()
        assert receipt["constraint"] == constraint
        assert "root ::=" not in json.dumps(receipt)
