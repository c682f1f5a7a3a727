"""Log-probabilities of generated tokens, as llama-server reports them to OpenAI clients.

A token's log-probability is the log-softmax of the model's raw logits at its position (before
the sampler chain: bias, penalties, grammar and temperature do not change it), and the top
candidates are the most likely tokens under the same distribution, most likely first — what
llama-server computes for ``n_probs`` without ``post_sampling_probs``. Computed on the decode
thread from ``llama_get_logits_ith`` only for requests that ask (numpy over the vocabulary:
tens of microseconds for a 50k vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from skippyctl.engine.protocol_messages import TokenLogprob, TopLogprob


def token_logprob(
    llama: ModuleType,
    ctx: Any,
    index: int,
    n_vocab: int,
    token: int,
    top: int,
    piece: Callable[[int], bytes],
) -> TokenLogprob:
    """``token``'s log-probability at logits row ``index`` and the ``top`` most likely tokens
    there; ``piece`` gives a token's text bytes."""
    logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
    logits = logits.astype(np.float64)
    peak = float(logits.max())
    log_total = peak + float(np.log(np.exp(logits - peak).sum()))
    candidates: tuple[TopLogprob, ...] = ()
    if top > 0:
        best = np.argpartition(-logits, top - 1)[:top] if top < n_vocab else np.arange(n_vocab)
        best = best[np.argsort(-logits[best], kind="stable")]
        candidates = tuple(
            TopLogprob(tuple(piece(int(t))), float(logits[t]) - log_total) for t in best
        )
    return TokenLogprob(tuple(piece(token)), float(logits[token]) - log_total, candidates)
