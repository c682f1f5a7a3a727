"""`/tokenize` and `/detokenize` on the real instruct model (SmolLM2-135M-Instruct, Q4_1), in
llama-server's shape and with its answers: the expected values are what llama-server (the
vendored llama.cpp's, `-m SmolLM2-135M-Instruct.Q4_1.gguf`, 2026-12-05) answered to the same
bodies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Server, real_model_server

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hello <|im_start|> world ☃"
LLAMA_SERVER_TOKENS = [19556, 216, 1, 905, 4636, 242, 221]
LLAMA_SERVER_PIECES = [
    {"id": 19556, "piece": "Hello"},
    {"id": 216, "piece": " "},
    {"id": 1, "piece": "<|im_start|>"},
    {"id": 905, "piece": " world"},
    {"id": 4636, "piece": [32, 226]},  # the snowman's bytes span three tokens
    {"id": 242, "piece": [152]},
    {"id": 221, "piece": [131]},
]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with real_model_server(
        tmp_path_factory.mktemp("runtime"), "smol", ctx=1024, lanes=1
    ) as running:
        yield running


def _post(server: Server, path: str, body: dict[str, Any]) -> Any:
    with server.http() as http:
        return http.post(path, json=body)


def test_tokenize_answers_as_llama_server(real: Server) -> None:
    response = _post(real, "/tokenize", {"content": TEXT})
    assert response.status_code == 200, response.text
    assert response.json() == {"tokens": LLAMA_SERVER_TOKENS}


def test_tokenize_with_pieces_answers_as_llama_server(real: Server) -> None:
    response = _post(real, "/tokenize", {"content": TEXT, "with_pieces": True})
    assert response.json() == {"tokens": LLAMA_SERVER_PIECES}


def test_special_text_stays_text_when_not_parsed(real: Server) -> None:
    tokens = _post(real, "/tokenize", {"content": TEXT, "parse_special": False}).json()["tokens"]
    assert 1 not in tokens
    assert len(tokens) > len(LLAMA_SERVER_TOKENS)


def test_detokenize_inverts_tokenize(real: Server) -> None:
    response = _post(real, "/detokenize", {"tokens": LLAMA_SERVER_TOKENS, "model": "smol"})
    assert response.status_code == 200, response.text
    assert response.json() == {"content": TEXT}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/detokenize", {"tokens": [49152]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": "12"}, 400, "tokens"),
        ("/tokenize", {"content": 5}, 400, "content"),
        ("/tokenize", {"content": "x", "model": "nope"}, 404, "model"),
    ],
)
def test_bad_vocabulary_requests_name_their_field(
    real: Server, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    response = _post(real, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param)
    assert error["reason_code"]


def test_with_two_models_loaded_a_request_must_name_one(real: Server, fixture_dir: Path) -> None:
    answer = real.load(fixture_dir / "tiny.gguf", alias="tiny-vocab", lanes=1, ctx=256)
    assert answer["state"] == "available", answer
    try:
        unnamed = _post(real, "/tokenize", {"content": "hi"})
        assert unnamed.status_code == 400
        assert unnamed.json()["error"]["param"] == "model"
        named = _post(real, "/tokenize", {"content": TEXT, "model": "smol"})
        assert named.json() == {"tokens": LLAMA_SERVER_TOKENS}
    finally:
        with real.http() as http:
            unloaded = http.post("/api/runtime/models/tiny-vocab/unload", json={})
        assert unloaded.status_code in (200, 202), unloaded.text
