"""`/v1/embeddings` on an embedding model (fixtures/tiny-embedding.gguf: mean pooling), through
the official `openai` client, against llama-server's answers to the same inputs
(tests/golden/embeddings.json, `python -m scripts.golden_embeddings`); and its refusals. The
embedding model is loaded with `--flash-attn on`, as llama-server computed the goldens: without
it the vectors differ by about 1e-4, beyond the few float32 ulps compared here."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests.api.conftest import Server, assert_openai_error, openai_client, start_server, stop_server
from tests.goldens import golden

GOLDEN = json.loads(golden("embeddings.json").read_text())
N_UBATCH = 512
FLOAT32_ULPS_OF_ONE = 4 * float(np.finfo(np.float32).eps)
"""Four float32 ulps at 1.0: every component of a normalised vector is at most 1."""
"""llama.cpp's default micro-batch: the longest input one decode can pool."""


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("runtime"))
    try:
        for alias, name in (("emb", "tiny-embedding.gguf"), ("gen", "tiny.gguf")):
            answer = running.load(
                fixture_dir / name, alias=alias, ctx=1024, lanes=1, flash_attn="on"
            )
            assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda case: case["name"])
@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_vectors_equal_llama_server_s(
    runtime: Server, case: dict[str, Any], encoding_format: str | None
) -> None:
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    # Without encoding_format the official client asks for base64 and decodes it.
    result = openai_client(runtime).embeddings.create(model="emb", input=case["input"], **extra)
    vectors = []
    for index, item in enumerate(result.data):
        assert item.index == index
        if encoding_format == "base64":
            assert isinstance(item.embedding, str)
            vectors.append(np.frombuffer(base64.b64decode(item.embedding), dtype="<f4").tolist())
        else:
            vectors.append(item.embedding)
    assert len(vectors) == len(case["vectors"])
    for ours, theirs in zip(vectors, case["vectors"], strict=True):
        assert len(ours) == len(theirs)
        # llama.cpp computes both, but its CPU kernels round differently per CPU model: the
        # golden made on one CPU differed from llama-server's own answer on another by 3e-8
        # (1 float32 ulp) in one component. Within a few ulps, then; not a looser check.
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=FLOAT32_ULPS_OF_ONE)
        assert abs(float(np.linalg.norm(ours)) - 1.0) < 1e-5
    assert result.usage.prompt_tokens == case["prompt_tokens"]
    assert result.usage.total_tokens == case["prompt_tokens"]
    assert result.model == "emb"


def test_the_same_input_gives_the_same_vector_alone_and_in_a_list(runtime: Server) -> None:
    client = openai_client(runtime)
    alone = client.embeddings.create(model="emb", input="Paris", encoding_format="float")
    listed = client.embeddings.create(
        model="emb", input=["Berlin", "Paris"], encoding_format="float"
    )
    assert listed.data[1].embedding == alone.data[0].embedding
    assert listed.data[0].embedding != alone.data[0].embedding


def _post(runtime: Server, body: dict[str, Any], path: str = "/v1/embeddings") -> Any:
    with runtime.http() as http:
        return http.post(path, json=body)


def test_a_generative_model_is_refused_naming_the_model(runtime: Server) -> None:
    error = assert_openai_error(_post(runtime, {"model": "gen", "input": "hi"}), 400)
    assert error["param"] == "model"
    assert error["code"] == "model_not_supported"
    assert error["reason_code"] == "unsupported_capability"
    assert "no pooling" in error["message"]
    with pytest.raises(openai.BadRequestError):
        openai_client(runtime).embeddings.create(model="gen", input="hi")


def test_an_embedding_model_refuses_completions(runtime: Server) -> None:
    for path, body in (
        ("/v1/completions", {"model": "emb", "prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "emb", "messages": [{"role": "user", "content": "x"}]}),
    ):
        error = assert_openai_error(_post(runtime, body, path), 400)
        assert error["reason_code"] == "unsupported_capability"
        assert "embedding model" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": []}, "input", "at least 1"),
        ({"input": [[]]}, "input[0]", "at least 1"),
        ({"input": [1, 2**31]}, "input", None),
        ({"input": [1, 99_999]}, "input", "outside the vocabulary"),
        ({"input": [[1] * (N_UBATCH + 1)]}, "input", f"at most {N_UBATCH}"),
        ({"input": "x", "dimensions": 8}, "dimensions", "not supported"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", None),
        ({"input": 5}, "input", None),
        ({"input": ["a", 1]}, "input", None),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    runtime: Server, body: dict[str, Any], param: str, words: str | None
) -> None:
    error = assert_openai_error(_post(runtime, {"model": "emb", **body}), 400)
    assert error["param"] is not None and error["param"].startswith(param), error
    if words is not None:
        assert words in error["message"], error
    assert error["reason_code"] in ("invalid_configuration", "unsupported_capability")


def test_an_unknown_model_is_a_404(runtime: Server) -> None:
    error = assert_openai_error(_post(runtime, {"model": "nope", "input": "x"}), 404)
    assert error["code"] == "model_not_found"
