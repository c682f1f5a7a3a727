"""Token log-probabilities in OpenAI's two shapes, from the engine's `TokenLogprob` records.

- Chat (`logprobs: true`, `top_logprobs: N`): `{"content": [{token, logprob, bytes,
  top_logprobs: [{token, logprob, bytes}]}]}` per choice, and per chunk when streamed.
- Completions (legacy `logprobs: N`): `{tokens, token_logprobs, top_logprobs: [{token:
  logprob}], text_offset}`, offsets counted in characters from the start of the completion.

A token's `token` is its text; a token that ends inside a UTF-8 character shows U+FFFD there,
and `bytes` has the exact bytes (OpenAI's reason for the field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skippyctl.runtime.requests import TokenLogprob, TopLogprob


def _text(piece: tuple[int, ...]) -> str:
    return bytes(piece).decode("utf-8", errors="replace")


def _candidate(entry: TopLogprob | TokenLogprob) -> dict[str, Any]:
    return {"token": _text(entry.piece), "logprob": entry.logprob, "bytes": list(entry.piece)}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {**_candidate(entry), "top_logprobs": [_candidate(top) for top in entry.top]}
            for entry in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy shape; ``offset`` is the characters of the completion before these tokens
    (a streamed chunk's tokens continue the earlier chunks')."""
    tokens = [_text(entry.piece) for entry in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{_text(top.piece): top.logprob for top in entry.top} for entry in entries],
        "text_offset": offsets,
    }
