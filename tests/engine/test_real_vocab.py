"""The project's tokenizer on llama.cpp's real vocabularies, against llama.cpp's own test vectors.

`fixtures/vendor/vocab/ggml-vocab-*.gguf` are vocabulary-only GGUFs of real model families,
each with `.inp` (texts separated by `__ggml_vocab_test__` lines) and `.out` (the token ids per
text) that llama.cpp's tests/test-tokenizer-0 checks with `add_special = false` and
`parse_special = false`. `make fixtures` extracts them from the llama-cpp-python source
distribution (scripts/fetch_real_fixtures.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import llama_cpp
import pytest

from skippyctl.engine.text import tokenize

VOCAB_DIR: Final = Path(__file__).parents[2] / "fixtures" / "vendor" / "vocab"
SEPARATOR: Final = "\n__ggml_vocab_test__\n"


def _families() -> list[str]:
    return sorted(p.name.removesuffix(".gguf.inp") for p in VOCAB_DIR.glob("*.gguf.inp"))


def _vectors(family: str) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's reading of `.inp`/`.out`: one text per `.out` line."""
    raw = (VOCAB_DIR / f"{family}.gguf.inp").read_text(encoding="utf-8")
    texts: list[str] = []
    position = 0
    while position < len(raw):
        found = raw.find(SEPARATOR, position)
        if found < 0:
            texts.append(raw[position:])
            break
        texts.append(raw[position:found])
        position = found + len(SEPARATOR)
    lines = (VOCAB_DIR / f"{family}.gguf.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines), f"{family}: {len(texts)} texts, {len(lines)} token lines"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


@pytest.fixture(scope="module")
def vocab_models() -> Iterator[dict[str, Any]]:
    llama_cpp.llama_backend_init()
    loaded: dict[str, Any] = {}
    yield loaded
    for model in loaded.values():
        llama_cpp.llama_model_free(model)


def _vocab(loaded: dict[str, Any], family: str) -> Any:
    if family not in loaded:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(
            os.fsencode(VOCAB_DIR / f"{family}.gguf"), params
        )
        assert model, f"llama.cpp could not load the vocabulary {family}"
        loaded[family] = model
    return llama_cpp.llama_model_get_vocab(loaded[family])


def test_every_vendored_family_with_vectors_is_here() -> None:
    # The sdist of llama-cpp-python 0.3.36 has 15 vocabularies with vectors; fewer means the
    # extraction broke, and the parametrized test below would quietly test less.
    assert len(_families()) >= 15, _families()


@pytest.mark.parametrize("family", _families())
def test_tokenize_matches_llama_cpp_vectors(vocab_models: dict[str, Any], family: str) -> None:
    vocab = _vocab(vocab_models, family)
    vectors = _vectors(family)
    assert vectors
    wrong = [
        (text, expected, got)
        for text, expected in vectors
        if (got := tokenize(llama_cpp, vocab, text, add_special=False, parse_special=False))
        != expected
    ]
    assert not wrong, f"{family}: {len(wrong)}/{len(vectors)} vectors differ, first: {wrong[0]!r}"


def test_special_text_is_parsed_only_when_asked(vocab_models: dict[str, Any]) -> None:
    # The chat path parses special-token text into control tokens (as llama-server does);
    # test vectors and /tokenize's default do not.
    vocab = _vocab(vocab_models, "ggml-vocab-llama-bpe")
    text = "<|begin_of_text|>hi"
    parsed = tokenize(llama_cpp, vocab, text, add_special=False, parse_special=True)
    plain = tokenize(llama_cpp, vocab, text, add_special=False, parse_special=False)
    assert parsed[0] == llama_cpp.llama_vocab_bos(vocab)
    assert len(parsed) == 2
    assert llama_cpp.llama_vocab_bos(vocab) not in plain
    assert len(plain) > len(parsed)
