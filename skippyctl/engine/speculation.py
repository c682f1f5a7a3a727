"""Speculative decoding's proposer side: what a lane may verify in its next step.

Speculation is verification in the step loop (``engine/decode_core.py``): a decoding lane's
next token goes into the step's batch followed by up to ``draft_tokens`` proposed tokens, each
with its logits; the lane's sampler then samples position after position and commits while the
sampled token equals the proposed one, so the committed text is exactly what decoding one token
per step would give (the sampler sees the same logits for every committed position), and the KV
of the first rejected proposal onwards is removed. This module holds the configuration and the
built-in proposer.

With ``--spec plugin`` the proposals come from the model's serving plugins
(:class:`ServingPlugins`, ``skippyctl.plugins``), one query per step for the lanes that need
one, answered within the deadline or not used. A run-ahead budget
(``SpecConfig.runahead_tokens``) lets a query ask past the window: the extra proposals are the
window after it (its first one is the token expected after this window), used without a query
when this window verifies whole and the sampled token matches, and discarded — never executed,
counted as ``spec_discarded`` — when it does not.

:class:`NgramProposer` is prompt lookup decoding (no extra model): the longest suffix (of
``ngram_max`` down to ``ngram_min`` tokens) of the request's history — its prompt and what it
generated — that occurred earlier in that history proposes the tokens that followed that earlier
occurrence (the latest one), continued cyclically when that occurrence is so recent that its
continuation runs into the present (``a b a b`` proposes ``a b a b …``). Cost: O(``ngram_max``)
dictionary work per committed token, one lookup per proposal; the history and the index live only
as long as the request. Token ids stay in the engine process; only counts leave it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol


class SpecMode(StrEnum):
    """How a model's requests speculate (``load --spec``)."""

    OFF = "off"
    NGRAM = "ngram"
    PLUGIN = "plugin"
    """Proposals come from the model's serving plugins (``load --plugin``), under a deadline."""
    DRAFT = "draft"
    """Proposals come from a draft model's greedy continuation (``load --draft``)."""


DEFAULT_DRAFT_TOKENS: Final = 64
MAX_DRAFT_TOKENS: Final = 64
STEP_PROPOSALS: Final = 64
"""Proposed tokens one step verifies over all its lanes: one lane may take them all, four take 16
each (measured on the 8-layer F16 model, 2 threads: one lane decodes fastest with windows of 64,
four lanes with windows of 16 — beyond that a step is compute-bound and rejected tails cost)."""
FIRST_WINDOW: Final = 4
"""Proposals a request verifies in its first window; each window fully accepted doubles it (up
to ``draft_tokens``), a rejection shrinks it to what was accepted plus one."""
DEFAULT_PROPOSAL_DEADLINE_MS: Final = 8.0
"""How long a step waits for serving plugins' proposals (``load --spec-deadline-ms``; the
reference's deadline): a later answer is dropped and counted as late."""
MAX_PROPOSAL_DEADLINE_MS: Final = 1000.0
DEFAULT_RUNAHEAD_TOKENS: Final = 0
MAX_RUNAHEAD_TOKENS: Final = 256
NGRAM_MIN: Final = 2
"""A one-token match is mostly chance: a proposal needs the last two tokens seen before."""
NGRAM_MAX: Final = 4


@dataclass(frozen=True, slots=True)
class SpecConfig:
    mode: SpecMode = SpecMode.OFF
    draft_tokens: int = DEFAULT_DRAFT_TOKENS
    """Most proposed tokens one lane verifies in a step (the window)."""
    runahead_tokens: int = 0
    """With plugin proposals: how many tokens past the window a query may ask for (the
    run-ahead budget; 0 = fixed depth). The proposals beyond the window are the next window,
    used without a query when the window verifies whole and the token sampled after it is the
    first of them; otherwise they are discarded unexecuted (counted)."""

    def __post_init__(self) -> None:
        if not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be in 1..{MAX_DRAFT_TOKENS}")
        if not 0 <= self.runahead_tokens <= MAX_RUNAHEAD_TOKENS:
            raise ValueError(f"runahead_tokens must be in 0..{MAX_RUNAHEAD_TOKENS}")

    @property
    def enabled(self) -> bool:
        return self.mode is not SpecMode.OFF

    def step_slots(self, lanes: int) -> int:
        """Batch slots the decoding lanes may take in one step: each lane's next token, and
        the proposals (at most ``draft_tokens`` a lane, :data:`STEP_PROPOSALS` in all)."""
        if not self.enabled:
            return lanes
        return lanes + min(lanes * self.draft_tokens, STEP_PROPOSALS)

    def lane_limit(self, decoding: int) -> int:
        """Most proposals one of ``decoding`` lanes verifies in a step (0 beyond
        :data:`STEP_PROPOSALS` lanes)."""
        return min(self.draft_tokens, STEP_PROPOSALS // max(1, decoding))


SPEC_OFF: Final = SpecConfig()


class ServingPlugins(Protocol):
    """What the decode thread tells a model's serving plugins and asks them (the engine side
    of ``skippyctl.plugins``: delivery never blocks, ``propose`` waits at most its deadline).
    Token ids go to the plugins' own process and nowhere else."""

    def begin(self, request: str, session: str | None, prompt: Sequence[int], reused: int) -> None:
        """A request starts generating from ``prompt`` (``reused`` of it came from its KV)."""

    def commit(self, request: str, tokens: Sequence[int]) -> None:
        """Canonical tokens committed since the previous call, in order."""

    def propose(self, wants: Mapping[str, int]) -> dict[str, list[int]]:
        """Proposals for each request id in ``wants`` (at most its value), valid token ids;
        requests the plugins had nothing for (or answered too late) are absent."""

    def late(self) -> frozenset[str]:
        """The requests of the last :meth:`propose` whose answer missed the deadline."""

    def outcome(self, request: str, proposed: int, accepted: int) -> None:
        """How a window of the plugins' proposals verified."""

    def finish(self, request: str, receipt: Mapping[str, object]) -> None:
        """The request completed (its final committed suffix travels with this)."""

    def abort(self, request: str, reason: str) -> None:
        """The request ended without completing (cancelled, timed out, failed)."""


class AdaptiveWindow:
    """How many proposals a request verifies next: each window fully accepted doubles it (up to
    the configured most), a rejection makes it what was accepted plus one. Proposes nothing
    itself: with plugins the proposals come from them (:class:`ServingPlugins`). Decode
    thread only."""

    __slots__ = ("window",)

    def __init__(self, first_window: int = FIRST_WINDOW) -> None:
        self.window = max(1, first_window)
        """How many tokens the next proposal may have (see :meth:`verified`)."""

    def commit(self, token: int) -> None:
        """``token`` was committed (a proposer that keeps history records it)."""

    def verified(self, proposed: int, accepted: int, most: int) -> None:
        """A window's outcome: all ``proposed`` accepted doubles the next window (up to
        ``most``); a rejection makes it ``accepted + 1`` — proposals that failed here cost a
        batch slot each, so the next ones are only as many as just proved right, plus one."""
        if accepted >= proposed:
            self.window = min(most, self.window * 2)
        else:
            self.window = max(1, min(most, accepted + 1))

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` proposed tokens; none here."""
        return []


class NgramProposer(AdaptiveWindow):
    """Prompt lookup over one request's history (module docstring). Decode thread only."""

    __slots__ = ("_history", "_index", "_ngram_max", "_ngram_min")

    def __init__(
        self,
        prompt: list[int],
        ngram_min: int = NGRAM_MIN,
        ngram_max: int = NGRAM_MAX,
        first_window: int = FIRST_WINDOW,
    ) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        super().__init__(first_window)
        self._ngram_min = ngram_min
        self._ngram_max = ngram_max
        self._history: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        """n-gram → where the token after its latest occurrence is (only occurrences that
        have a following token: the current suffix never finds itself)."""
        for token in prompt:
            self.commit(token)

    def commit(self, token: int) -> None:
        """``token`` joined the history (a prompt token or a committed one)."""
        history = self._history
        end = len(history)  # the new token's index: it follows the n-grams ending just before
        for n in range(self._ngram_min, min(self._ngram_max, end) + 1):
            self._index[tuple(history[end - n : end])] = end
        history.append(token)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest earlier match of the history's
        suffix; empty when nothing matches."""
        history = self._history
        size = len(history)
        if limit < 1:
            return []
        for n in range(min(self._ngram_max, size), self._ngram_min - 1, -1):
            start = self._index.get(tuple(history[size - n :]))
            if start is None:
                continue
            draft = history[start : start + limit]
            # A match close to the end repeats a short cycle: continue it past the history's
            # end the way it went so far (what followed the match is what the draft says).
            while len(draft) < limit:
                draft.append(draft[len(draft) - (size - start)])
            return draft
        return []
