"""SamplingParams validation and sampler chains sampling from real llama.cpp logits."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest

from skippyctl.engine.sampling import MAX_SEED, SamplingParams, build_sampler_chain
from skippyctl.engine.text import tokenize

PROMPT = "The quick brown fox jumps over the lazy dog"
LAST = -1
"""Output index of the last logits (a batch index without logits would abort llama.cpp)."""


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(fixture_dir / "tiny.gguf"), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


@pytest.fixture(scope="module")
def vocab(model: Any) -> Any:
    return llama_cpp.llama_model_get_vocab(model)


@pytest.fixture(scope="module")
def context(model: Any, vocab: Any) -> Iterator[Any]:
    """A context whose last output (index -1) holds the logits after PROMPT."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 256
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx
    tokens = tokenize(llama_cpp, vocab, PROMPT)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    for i, token in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 0
    batch.logits[len(tokens) - 1] = 1
    batch.n_tokens = len(tokens)
    assert llama_cpp.llama_decode(ctx, batch) == 0
    llama_cpp.llama_batch_free(batch)
    yield ctx
    llama_cpp.llama_free(ctx)


@pytest.fixture(scope="module")
def logits(context: Any, vocab: Any) -> npt.NDArray[np.float32]:
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    pointer = llama_cpp.llama_get_logits_ith(context, LAST)
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).copy()


def _draw(vocab: Any, context: Any, params: SamplingParams, count: int) -> list[int]:
    chain = build_sampler_chain(llama_cpp, vocab, params)
    try:
        return [
            int(llama_cpp.llama_sampler_sample(chain.pointer, context, LAST)) for _ in range(count)
        ]
    finally:
        chain.close()


# ---------------------------------------------------------------- validation


def test_defaults_are_valid_and_not_greedy() -> None:
    params = SamplingParams()
    assert not params.greedy
    assert not params.penalizes
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 1.5),
        ("top_p", -0.01),
        ("min_p", 2.0),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", -1.0),
        ("repeat_last_n", -1),
        ("seed", -1),
        ("seed", MAX_SEED + 1),
        ("seed", 1.0),
        ("logit_bias", [(1, 1.0)]),
        ("logit_bias", ((1, 2, 3),)),
        ("logit_bias", ((-1, 1.0),)),
        ("logit_bias", ((1, math.nan),)),
        ("logit_bias", ((1, math.inf),)),
        ("logit_bias", ((1, "x"),)),
    ],
)
def test_out_of_range_values_raise_value_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        SamplingParams(**{field: value})


def test_boundary_values_are_accepted() -> None:
    SamplingParams(
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repeat_penalty=1.0,
        repeat_last_n=0,
        seed=MAX_SEED,
        logit_bias=((5, -math.inf), (6, 3)),
    )


# ---------------------------------------------------------------- chains on real logits


def test_greedy_picks_the_argmax(vocab: Any, context: Any, logits: Any) -> None:
    assert _draw(vocab, context, SamplingParams(temperature=0), 3) == [int(np.argmax(logits))] * 3


def test_logit_bias_can_ban_the_argmax(vocab: Any, context: Any, logits: Any) -> None:
    order = np.argsort(logits)[::-1]
    params = SamplingParams(temperature=0, logit_bias=((int(order[0]), -math.inf),))
    assert _draw(vocab, context, params, 1) == [int(order[1])]


def test_logit_bias_can_force_a_token(vocab: Any, context: Any, logits: Any) -> None:
    weakest = int(np.argmin(logits))
    params = SamplingParams(temperature=0.8, seed=3, logit_bias=((weakest, 1000.0),))
    assert _draw(vocab, context, params, 5) == [weakest] * 5


def test_same_seed_draws_the_same_tokens(vocab: Any, context: Any) -> None:
    params = SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    first = _draw(vocab, context, params, 30)
    assert _draw(vocab, context, params, 30) == first
    assert len(set(first)) > 1  # hot and unfiltered: the draws really are random


def test_different_seeds_draw_different_tokens(vocab: Any, context: Any) -> None:
    draws = {
        tuple(_draw(vocab, context, SamplingParams(temperature=2.0, top_k=0, seed=s), 30))
        for s in range(3)
    }
    assert len(draws) == 3


def test_top_k_one_is_greedy(vocab: Any, context: Any, logits: Any) -> None:
    params = SamplingParams(temperature=5.0, top_k=1, seed=9)
    assert _draw(vocab, context, params, 10) == [int(np.argmax(logits))] * 10


def test_repeat_penalty_moves_away_from_seen_tokens(vocab: Any, context: Any, logits: Any) -> None:
    best = int(np.argmax(logits))
    params = SamplingParams(temperature=0, repeat_penalty=1e6, repeat_last_n=64)
    chain = build_sampler_chain(llama_cpp, vocab, params)
    try:
        chain.accept([best])
        assert int(llama_cpp.llama_sampler_sample(chain.pointer, context, LAST)) != best
    finally:
        chain.close()


def test_bias_outside_the_vocabulary_is_refused(vocab: Any) -> None:
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        build_sampler_chain(llama_cpp, vocab, SamplingParams(logit_bias=((n_vocab, 1.0),)))


def test_close_is_idempotent(vocab: Any) -> None:
    chain = build_sampler_chain(llama_cpp, vocab, SamplingParams())
    chain.close()
    chain.close()
    assert chain.pointer is None


# -- a JSON schema between literal tags (a forced Hermes tool call) -------------------------------

_CALL_SCHEMA = (
    '{"type": "object", "properties": {"name": {"const": "get_weather"}, '
    '"arguments": {"type": "object"}}, "required": ["name", "arguments"]}'
)


def test_tags_surround_the_schema_s_json_in_the_grammar() -> None:
    tagged = SamplingParams(json_schema=_CALL_SCHEMA, json_schema_tags=("<tool_call>\n", '"\\'))
    grammar = tagged.gbnf()
    assert grammar is not None
    assert grammar.splitlines()[0] == 'root ::= "<tool_call>\\n" tagged-json "\\"\\\\"'
    assert "\ntagged-json ::= " in grammar
    # Untagged, the same schema is the root itself.
    plain = SamplingParams(json_schema=_CALL_SCHEMA).gbnf()
    assert plain is not None and plain.replace("root ::=", "tagged-json ::=", 1) in grammar


def test_a_schema_rule_named_like_the_tagged_rule_is_not_overwritten() -> None:
    schema = (
        '{"type": "object", "properties": {"tagged-json": {"type": "object", '
        '"properties": {"a": {"type": "string"}}}}}'
    )
    assert "\ntagged-json ::= " in (SamplingParams(json_schema=schema).gbnf() or "")
    grammar = SamplingParams(json_schema=schema, json_schema_tags=("<", ">")).gbnf()
    assert grammar is not None
    assert grammar.splitlines()[0] == 'root ::= "<" tagged-json- ">"'


def test_tags_without_a_schema_are_refused() -> None:
    with pytest.raises(ValueError, match="need a JSON schema"):
        SamplingParams(json_schema_tags=("<", ">"))
