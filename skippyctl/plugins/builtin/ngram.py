"""Prompt lookup decoding (no extra model) as a serving plugin: entry point ``ngram`` in the group
``skippyctl.plugins`` (``load --plugin ngram``, in a sidecar), and what ``--spec ngram`` runs in
the engine process (``skippyctl.plugins.inprocess``).

:class:`NgramIndex` is one request's history — its prompt and the tokens it committed — and an
index of its n-grams: the longest suffix (of ``ngram_max`` down to ``ngram_min`` tokens) of the
history that occurred earlier in it proposes the tokens that followed that earlier occurrence
(the latest one), continued cyclically when that occurrence is so recent that its continuation
runs into the present (``a b a b`` proposes ``a b a b …``). A proposal also tells how far
back its source agrees with the history (:attr:`NgramIndex.agreement`): ``--spec auto`` keeps
its windows within half of that. Cost: O(``ngram_max``) dictionary work per committed token, one
lookup per proposal, and a comparison of at most :data:`AGREEMENT_CAP` tokens when the agreement
is asked for; the index lives only as long as the request.

:class:`NgramPlugin` keeps one index per begun request, and :class:`SharedNgrams` across them:
a request whose own text has no earlier match proposes what followed its last ``ngram_max``
tokens in another request (as llama-server's ``ngram-mod`` pools n-grams across requests), so
text that requests repeat is proposed from its first token on. It relies on the plugin contract's
committed stream (``skippyctl.plugins.api``): a run that does not start where the last one
ended raises (the host counts it a failure) instead of proposing from a history with a hole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from skippyctl.plugins.api import (
    AbortReasonCode,
    BasePlugin,
    PluginReceipt,
    ProposalQuery,
    RequestIds,
)

__all__ = [
    "AGREEMENT_CAP",
    "NGRAM_MAX",
    "NGRAM_MIN",
    "NgramIndex",
    "NgramPlugin",
    "SharedNgrams",
    "StreamGap",
    "agreement",
]

NGRAM_MIN: Final = 2
"""A one-token match is mostly chance: a proposal needs the last two tokens seen before."""
NGRAM_MAX: Final = 4
AGREEMENT_CAP: Final = 128
"""The most tokens :attr:`NgramIndex.agreement` counts back (twice the longest window a lane
verifies)."""
SHARED_NGRAMS: Final = 65536
"""Longest n-grams the plugin remembers across its requests (the oldest are forgotten first).
Every committed token adds one, so what stays alive is the histories of the requests that wrote
the newest 65,536 (about that many tokens, plus the requests still running) and the entries:
a few tens of MiB of Python objects at most."""


class StreamGap(ValueError):
    """A committed run did not start where the request's stream stood."""


class SharedNgrams:
    """What every request of one plugin saw: each longest n-gram (``ngram_max`` tokens) → the
    history it last occurred in and where the token after it is there. A request whose own
    text has no earlier match proposes what followed the same n-gram in another request (a
    text that several requests repeat, a reply another session is writing); a history stays
    alive only while one of its n-grams is remembered. Bounded: the oldest n-gram goes first."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = SHARED_NGRAMS) -> None:
        self.limit = limit
        self._entries: dict[tuple[int, ...], tuple[list[int], int]] = {}

    def add(self, key: tuple[int, ...], history: list[int], end: int) -> None:
        entries = self._entries
        entries.pop(key, None)  # the latest occurrence, and the newest in the eviction order
        entries[key] = (history, end)
        if len(entries) > self.limit:
            del entries[next(iter(entries))]

    def source(self, key: tuple[int, ...], history: list[int]) -> tuple[list[int], int] | None:
        """Another request's history that ``key`` last occurred in, and where the token after
        it is there; None when no other request's does."""
        found = self._entries.get(key)
        if found is None or found[0] is history:
            return None
        return found

    def __len__(self) -> int:
        return len(self._entries)


def agreement(source: list[int], source_end: int, history: list[int], history_end: int) -> int:
    """How many tokens before ``source_end`` in ``source`` equal those before ``history_end``
    in ``history``, at most :data:`AGREEMENT_CAP`: how long the text a proposal is copied from
    has already been followed. Compared a slice at a time (in C), doubling."""
    agreed, step = 0, 8
    while agreed < AGREEMENT_CAP:
        take = min(step, AGREEMENT_CAP - agreed, source_end - agreed, history_end - agreed)
        if take <= 0:
            break
        a, b = source_end - agreed, history_end - agreed
        if source[a - take : a] == history[b - take : b]:
            agreed += take
            step *= 2
            continue
        while agreed < AGREEMENT_CAP and a > 0 and b > 0 and source[a - 1] == history[b - 1]:
            agreed += 1
            a, b = a - 1, b - 1
        break
    return agreed


class NgramIndex:
    """One request's history and its n-gram index (module docstring)."""

    __slots__ = (
        "_history",
        "_index",
        "_ngram_max",
        "_ngram_min",
        "_shared",
        "_source",
        "committed",
    )

    def __init__(
        self,
        prompt: Iterable[int] = (),
        ngram_min: int = NGRAM_MIN,
        ngram_max: int = NGRAM_MAX,
        shared: SharedNgrams | None = None,
    ) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self._ngram_min = ngram_min
        self._ngram_max = ngram_max
        self._history: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._shared = shared
        """n-gram → where the token after its latest occurrence is (only occurrences that
        have a following token: the current suffix never finds itself)."""
        self.committed = 0
        """Committed tokens in the history (it starts with the prompt): the stream index the
        next run must start at."""
        self._source: tuple[list[int], int, int] | None = None
        """The last proposal's source: the history it was copied from, where the copy starts
        there, and how long this history was then (None: no proposal)."""
        self._extend(prompt)

    def _extend(self, tokens: Iterable[int]) -> None:
        history = self._history
        index = self._index
        low, high = self._ngram_min, self._ngram_max
        shared = self._shared
        for token in tokens:
            end = len(history)  # the new token's index: it follows the n-grams ending here
            for n in range(low, min(high, end) + 1):
                key = tuple(history[end - n : end])
                index[key] = end
                if n == high and shared is not None:
                    shared.add(key, history, end)
            history.append(token)

    def commit(self, start: int, tokens: Sequence[int]) -> None:
        """Committed tokens ``start`` … join the history; raises :class:`StreamGap` when
        ``start`` is not where the stream stands."""
        if start != self.committed:
            raise StreamGap(f"run starts at {start}, the stream is at {self.committed}")
        self._extend(tokens)
        self.committed += len(tokens)

    @property
    def agreement(self) -> int:
        """How many tokens before the last proposal's source agree with the history as it was
        then (the matched n-gram and as far back as the texts stay equal, up to
        :data:`AGREEMENT_CAP`); 0 with no proposal. A copy followed for long tends to go on.
        Counted when asked: only ``--spec auto`` asks."""
        if self._source is None:
            return 0
        source, start, size = self._source
        return agreement(source, start, self._history, size)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest earlier match of the history's
        suffix, else what followed its longest n-gram in another request (``shared``); empty
        when nothing matches."""
        history = self._history
        size = len(history)
        self._source = None
        if limit < 1:
            return []
        for n in range(min(self._ngram_max, size), self._ngram_min - 1, -1):
            start = self._index.get(tuple(history[size - n :]))
            if start is None:
                continue
            self._source = (history, start, size)
            draft = history[start : start + limit]
            # A match close to the end repeats a short cycle: continue it past the history's
            # end the way it went so far (what followed the match is what the draft says).
            while len(draft) < limit:
                draft.append(draft[len(draft) - (size - start)])
            return draft
        if self._shared is not None and size >= self._ngram_max:
            found = self._shared.source(tuple(history[size - self._ngram_max :]), history)
            if found is not None:
                other, start = found
                self._source = (other, start, size)
                return other[start : start + limit]
        return []


class NgramPlugin(BasePlugin):
    """Prompt lookup proposals for every request it is told about (module docstring)."""

    def __init__(self, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        NgramIndex((), ngram_min, ngram_max)  # refuses bad bounds now, not at the first begin
        self._ngram_min = ngram_min
        self._ngram_max = ngram_max
        self._requests: dict[int, NgramIndex] = {}
        self.shared = SharedNgrams()
        """What its requests saw, for the next ones (bounded)."""

    def begin(self, ids: RequestIds, prompt: Sequence[int], reused: int) -> None:
        self._requests[ids.request] = NgramIndex(
            prompt, self._ngram_min, self._ngram_max, self.shared
        )

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        self._requests[ids.request].commit(start, tokens)

    def propose(self, query: ProposalQuery) -> list[int] | None:
        index = self._requests[query.ids.request]
        if query.pending:
            index.commit(query.pending_start, query.pending)
        return index.propose(query.capacity) or None

    def agreement(self, ids: RequestIds) -> int:
        """How far back the source of the request's last proposal agrees with its text
        (:attr:`NgramIndex.agreement`); 0 for a request it does not hold."""
        index = self._requests.get(ids.request)
        return 0 if index is None else index.agreement

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        # Nothing to learn from the suffix: the request is over.
        self._requests.pop(ids.request, None)

    def abort(self, ids: RequestIds, reason: AbortReasonCode) -> None:
        self._requests.pop(ids.request, None)

    def close(self) -> None:
        self._requests.clear()
        self.shared = SharedNgrams()

    def requests(self) -> int:
        """Requests it holds a history for (begun, not yet finished or aborted)."""
        return len(self._requests)
