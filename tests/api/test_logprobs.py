"""Token log-probabilities on the real instruct model (SmolLM2-135M-Instruct, Q4_1) through the
official `openai` client, against llama-server's values for the same bodies
(tests/golden/logprobs.json, tests/golden/README.md): chat (`logprobs`, `top_logprobs`) and
completions (legacy `logprobs: N`), streamed and not. The goldens' llama-server ran with flash
attention (its choice on a CPU), so the model is loaded with `--flash-attn on`: the other
attention kernel rounds differently (by up to 0.03 in a log-probability here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.api.conftest import Server, openai_client, real_model_server
from tests.goldens import golden

GOLDEN = json.loads(golden("logprobs.json").read_text())
TOLERANCE = 1e-3
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with real_model_server(
        tmp_path_factory.mktemp("runtime"), "smol", ctx=2048, lanes=2, flash_attn="on"
    ) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    client: openai.OpenAI = openai_client(server)
    return client


def _close(ours: list[tuple[str, float]], theirs: list[list[Any]]) -> None:
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    for (_, mine), (_, peer) in zip(ours, theirs, strict=True):
        assert abs(mine - peer) <= TOLERANCE, (ours, theirs)


def test_chat_logprobs_equal_llama_server_s(real: Server) -> None:
    completion = _client(real).chat.completions.create(
        model="smol", messages=CHAT, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    golden = GOLDEN["chat"]
    assert len(logprobs.content) == len(golden)
    for entry, peer in zip(logprobs.content, golden, strict=True):
        _close([(entry.token, entry.logprob)], [[peer["token"], peer["logprob"]]])
        _close([(t.token, t.logprob) for t in entry.top_logprobs], peer["top"])
        assert bytes(entry.bytes or []).decode() == entry.token
    assert "".join(e.token for e in logprobs.content) == completion.choices[0].message.content


def test_streamed_chat_logprobs_equal_the_whole_reply_s(real: Server) -> None:
    client = _client(real)
    whole = client.chat.completions.create(
        model="smol", messages=CHAT, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2
    )
    streamed = [
        (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
        for chunk in client.chat.completions.create(
            model="smol",
            messages=CHAT,
            temperature=0,
            max_tokens=6,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content or ()
    ]
    assert whole.choices[0].logprobs is not None
    assert streamed == [
        (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
        for e in whole.choices[0].logprobs.content or ()
    ]


def test_completion_logprobs_in_the_legacy_shape_equal_llama_server_s(real: Server) -> None:
    completion = _client(real).completions.create(
        model="smol", prompt="The capital of France is", temperature=0, max_tokens=6, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    golden = GOLDEN["completion"]
    assert logprobs.tokens is not None and logprobs.token_logprobs is not None
    _close(
        list(zip(logprobs.tokens, logprobs.token_logprobs, strict=True)),
        [[g["token"], g["logprob"]] for g in golden],
    )
    assert logprobs.top_logprobs is not None
    for mine, peer in zip(logprobs.top_logprobs, golden, strict=True):
        _close(sorted(mine.items(), key=lambda kv: -kv[1]), peer["top"])
    offsets = logprobs.text_offset
    assert offsets == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(offsets or []))]


def test_no_logprobs_unless_asked(real: Server) -> None:
    completion = _client(real).chat.completions.create(
        model="smol", messages=CHAT, temperature=0, max_tokens=3
    )
    assert completion.choices[0].logprobs is None


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ],
)
def test_bad_logprobs_are_400s_naming_the_field(
    real: Server, path: str, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "smol", "max_tokens": 2, **extra}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": "hi"})
    with real.http() as http:
        response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
