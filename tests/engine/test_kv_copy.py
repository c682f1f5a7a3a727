"""What the engine's lane-to-lane KV copy relies on in llama.cpp itself (real llama.cpp, tiny.gguf).

With a split KV (one stream per sequence) ``llama_memory_seq_cp(src, dst, -1, -1)`` copies the
source's whole stream at the next ``llama_decode`` (any other p0/p1 aborts the process); the
engine then trims the copy to the shared prefix (``llama_memory_seq_rm(dst, keep, -1)``) and
prefills the rest. The logits after that must be those of prefilling the whole prompt.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest

TEXT = b"The quick brown fox jumps over the lazy dog " * 4


class Context:
    def __init__(self, model: Any) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = 1024
        params.n_seq_max = 2  # two streams: kv_unified defaults to false
        params.n_threads = params.n_threads_batch = 2
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        assert self.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        buffer = (llama_cpp.llama_token * 512)()
        count = llama_cpp.llama_tokenize(vocab, TEXT, len(TEXT), buffer, 512, True, False)
        self.tokens = list(buffer[:count])

    def decode(self, seq: int, tokens: list[int], start: int) -> npt.NDArray[np.float32]:
        """Decode ``tokens`` at positions ``start..`` of ``seq``; the last token's logits."""
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = i == len(tokens) - 1
            batch.n_tokens = len(tokens)
            assert llama_cpp.llama_decode(self.ctx, batch) == 0
        finally:
            llama_cpp.llama_batch_free(batch)
        logits = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(fixture_dir / "tiny.gguf"), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


@pytest.mark.parametrize("copy", [True, False], ids=["copied", "control-without-copy"])
def test_a_whole_stream_copy_trimmed_to_a_prefix_continues_like_a_full_prefill(
    model: Any, copy: bool
) -> None:
    context = Context(model)
    try:
        tokens = context.tokens
        full = context.decode(0, tokens, 0)
        keep = len(tokens) - 3
        if copy:
            llama_cpp.llama_memory_seq_cp(context.memory, 0, 1, -1, -1)
            llama_cpp.llama_memory_seq_rm(context.memory, 1, keep, -1)
        continued = context.decode(1, tokens[keep:], keep)
        difference = float(np.abs(continued - full).max())
        if copy:
            assert difference < 1e-3, difference
        else:  # without the copy the tail sees no prefix: proves the comparison can fail
            assert difference > 1e-2, difference
    finally:
        context.close()
