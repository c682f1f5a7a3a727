"""Pooled embeddings of an embedding model, as llama-server's ``/v1/embeddings`` makes them.

A model whose GGUF declares a pooling type (``<arch>.pooling_type``: mean, CLS, last, rank) is
loaded with its context in embeddings mode (``engine/model_loader.py``); it serves embeddings
and no generation. :func:`embed` evaluates each input alone in sequence 0 of a cleared KV cache
(the whole input in one ``llama_decode``, so in one micro-batch: pooling needs every token of a
sequence together, and an input over the context's ``n_ubatch`` is refused, as llama-server
refuses it), reads llama.cpp's pooled vector and normalises it to unit length
(llama.cpp's ``common_embd_normalize`` with its default, the euclidean norm).

Nothing here logs: the inputs and the vectors stay with the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import numpy as np

from skippyctl.events.reasons import ReasonCode

POOLING_NAMES: Final[dict[int, str]] = {1: "mean", 2: "cls", 3: "last", 4: "rank"}
"""llama.h's ``enum llama_pooling_type`` values that pool (0 is NONE, -1 UNSPECIFIED)."""


@dataclass(frozen=True, slots=True)
class EmbedRefused(Exception):
    """Why the inputs were not embedded (a fixed phrase with counts only) and its reason."""

    problem: str
    reason: ReasonCode = ReasonCode.INVALID_CONFIGURATION


def pooling_name(llama: ModuleType, context: Any) -> str | None:
    """The context's pooling (``mean`` …), None when it does not pool (a generative model)."""
    return POOLING_NAMES.get(int(llama.llama_pooling_type(context)))


def check_inputs(token_lists: Sequence[Sequence[int]], n_vocab: int, n_ubatch: int) -> None:
    """Raise :class:`EmbedRefused` for an input that cannot be embedded: empty, a token id
    outside the vocabulary, or longer than one micro-batch."""
    if not token_lists:
        raise EmbedRefused("'input' must not be empty")
    for index, tokens in enumerate(token_lists):
        if not tokens:
            raise EmbedRefused(f"input {index} is empty")
        if any(not 0 <= t < n_vocab for t in tokens):
            raise EmbedRefused(f"input {index} has a token id outside the vocabulary")
        if len(tokens) > n_ubatch:
            raise EmbedRefused(
                f"input {index} is {len(tokens)} tokens; this model embeds at most {n_ubatch} "
                "(its context's n_ubatch)"
            )


def normalised(vector: np.ndarray[Any, np.dtype[np.float32]]) -> tuple[float, ...]:
    """``vector`` at unit euclidean length, as llama.cpp's ``common_embd_normalize(…, 2)``:
    float32 squares summed in double, the inverse norm rounded to float32, float32 products."""
    total = float(np.sum((vector * vector).astype(np.float64)))
    norm = np.float32(1.0 / np.sqrt(total) if total > 0.0 else 0.0)
    return tuple((vector * norm).tolist())


def embed(
    llama: ModuleType, model: Any, context: Any, token_lists: Sequence[Sequence[int]]
) -> tuple[tuple[float, ...], ...]:
    """One normalised pooled vector per input (see the module docstring); raises
    :class:`EmbedRefused` for inputs it cannot take or a decode that fails."""
    pooling = pooling_name(llama, context)
    if pooling is None:
        raise EmbedRefused(
            "the model has no pooling: it serves completions, not embeddings",
            ReasonCode.UNSUPPORTED_CAPABILITY,
        )
    if pooling == "rank":
        # A reranker pools into class scores, not an n_embd vector (llama-server's /rerank).
        raise EmbedRefused(
            "the model is a reranker (rank pooling): it scores pairs, it does not embed",
            ReasonCode.UNSUPPORTED_CAPABILITY,
        )
    n_vocab = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model)))
    check_inputs(token_lists, n_vocab, int(llama.llama_n_ubatch(context)))
    n_embd = int(llama.llama_model_n_embd_out(model))
    memory = llama.llama_get_memory(context)
    batch = llama.llama_batch_init(max(len(t) for t in token_lists), 0, 1)
    try:
        vectors = []
        for tokens in token_lists:
            llama.llama_memory_clear(memory, True)
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(tokens)
            if int(llama.llama_decode(context, batch)) != 0:
                raise EmbedRefused(
                    "the model could not evaluate an input", ReasonCode.INTERNAL_RUNTIME_FAILURE
                )
            pooled = llama.llama_get_embeddings_seq(context, 0)
            if not pooled:
                raise EmbedRefused(
                    "the model gave no pooled embedding", ReasonCode.INTERNAL_RUNTIME_FAILURE
                )
            vectors.append(normalised(np.ctypeslib.as_array(pooled, shape=(n_embd,)).copy()))
        return tuple(vectors)
    finally:
        llama.llama_memory_clear(memory, True)
        llama.llama_batch_free(batch)
