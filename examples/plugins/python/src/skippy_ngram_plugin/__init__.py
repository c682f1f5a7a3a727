"""An example serving plugin in Python: prompt lookup decoding (n-gram), as the C example.

Registered in the entry-point group ``skippyctl.plugins`` as ``ngram-py`` (pyproject.toml), so
``--plugin ngram-py`` loads it into a plugin sidecar. When ``SKIPPY_PLUGIN_RECORD`` names a file
it appends one line per stream event it saw, in the C example's format (tests read it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

from skippyctl.plugins.api import (
    AbortReasonCode,
    BasePlugin,
    PluginReceipt,
    ProposalQuery,
    RequestIds,
)

NGRAM_MIN = 2
NGRAM_MAX = 4


class _History:
    __slots__ = ("index", "next_index", "tokens")

    def __init__(self, prompt: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        """n-gram → where the token after its latest occurrence is."""
        self.next_index = 0
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        history = self.tokens
        for token in tokens:
            end = len(history)
            for n in range(NGRAM_MIN, min(NGRAM_MAX, end) + 1):
                self.index[tuple(history[end - n : end])] = end
            history.append(token)

    def propose(self, limit: int) -> list[int]:
        history = self.tokens
        size = len(history)
        for n in range(min(NGRAM_MAX, size), NGRAM_MIN - 1, -1):
            start = self.index.get(tuple(history[size - n :]))
            if start is None:
                continue
            draft = history[start : start + limit]
            while len(draft) < limit:  # a recent match repeats a cycle: continue it
                draft.append(draft[len(draft) - (size - start)])
            return draft
        return []


class NgramPlugin(BasePlugin):
    def __init__(self) -> None:
        self._requests: dict[int, _History] = {}
        path = os.environ.get("SKIPPY_PLUGIN_RECORD")
        self._record: TextIO | None = open(path, "a") if path else None  # noqa: SIM115

    def _log(self, line: str) -> None:
        if self._record is not None:
            self._record.write(line + "\n")
            self._record.flush()

    def _apply(self, what: str, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        history = self._requests[ids.request]
        if start != history.next_index:
            raise ValueError("the stream is not contiguous")
        self._log(
            " ".join([what, str(ids.request), str(start), str(len(tokens)), *map(str, tokens)])
        )
        history.extend(tokens)
        history.next_index += len(tokens)

    def begin(self, ids: RequestIds, prompt: Sequence[int], reused: int) -> None:
        self._requests[ids.request] = _History(prompt)
        self._log(f"begin {ids.request} {len(prompt)} {reused}")

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        self._apply("commit", ids, start, tokens)

    def propose(self, query: ProposalQuery) -> list[int] | None:
        self._apply("pending", query.ids, query.pending_start, query.pending)
        return self._requests[query.ids.request].propose(query.capacity) or None

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        try:
            self._apply("suffix", ids, start, suffix)
        finally:
            self._log(f"finish {ids.request} {receipt.generated_tokens}")
            self._requests.pop(ids.request, None)

    def abort(self, ids: RequestIds, reason: AbortReasonCode) -> None:
        self._log(f"abort {ids.request} {int(reason)}")
        self._requests.pop(ids.request, None)

    def close(self) -> None:
        if self._record is not None:
            self._record.close()
