"""Speculative decoding's proposer side: what a lane may verify in its next step.

Speculation is verification in the step loop (``engine/proposals.py``): a decoding lane's
next token goes into the step's batch followed by up to ``draft_tokens`` proposed tokens, each
with its logits; the lane's sampler then samples position after position and commits while the
sampled token equals the proposed one, so the committed text is exactly what decoding one token
per step would give (the sampler sees the same logits for every committed position), and the KV
of the first rejected proposal onwards is removed. This module holds the configuration, the
proposer protocol and the window each request verifies.

Every mode proposes through the same calls, :class:`ServingPlugins` — one query per step for
the lanes that need one:

- ``--spec auto`` (the default): the built-in n-gram plugin as for ``ngram``, each lane's
  proposals verified only while they pay for their verification (``engine/spec_gate.py``);
- ``--spec ngram``: the built-in n-gram plugin (``skippyctl.plugins.builtin.ngram``, prompt
  lookup over the prompt and the generated history) called directly in the engine process
  (``skippyctl.plugins.inprocess``);
- ``--spec plugin``: the model's serving plugins in their sidecars (``skippyctl.plugins.link``),
  answered within the deadline or not used;
- ``--spec draft``: the draft model (``engine/draft.py``), all lanes in one batched decode.

A run-ahead budget (``SpecConfig.runahead_tokens``) lets a query ask past the window: the extra
proposals are the window after it (its first one is the token expected after this window), used
without a query when this window verifies whole and the sampled token matches, and discarded —
never executed, counted as ``spec_discarded`` — when it does not. Token ids stay with the
proposer (the engine process, or a plugin's sidecar); only counts leave it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

from skippyctl.config.load_options import MAX_DRAFT_TOKENS, MAX_RUNAHEAD_TOKENS, SpecMode
from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.api import DiscardReason, OutcomeKind

STEP_PROPOSALS: Final = 256
"""Proposed tokens one step verifies over all its lanes: one to four lanes take their whole
window (64), eight 32 each. Measured side by side on the 8-layer F16 successor model, 2
threads, 4 sessions (benchmarks/spec_auto.py, successor workload): 64 a lane ran 318 tok/s
against 233 with 48 (the cap of 192 before), where llama-server's `ngram-mod` drafts 64 a slot
(290 in the same runs); with 48 a lane it was 1.06× 16 (BENCHMARKS.md 7)."""
FIRST_WINDOW: Final = 4
"""Proposals a request verifies in its first window; each window fully accepted doubles it (up
to ``draft_tokens``), a rejection shrinks it to what was accepted plus one."""


@dataclass(frozen=True, slots=True)
class SpecConfig:
    mode: SpecMode = SpecMode.OFF
    draft_tokens: int = MAX_DRAFT_TOKENS
    """Most proposed tokens one lane verifies in a step (the window)."""
    runahead_tokens: int = 0
    """With plugin or n-gram proposals: how many tokens past the window a query may ask for
    (the run-ahead budget; 0 = fixed depth). The proposals beyond the window are the next window,
    used without a query when the window verifies whole and the token sampled after it is the
    first of them; otherwise they are discarded unexecuted (counted)."""
    step_proposals: int = STEP_PROPOSALS
    """Most proposed tokens one step verifies over all its lanes (``--spec auto`` takes fewer
    when the context's batch beside the lanes' tokens holds fewer: see :meth:`within_batch`)."""

    def __post_init__(self) -> None:
        if not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be in 1..{MAX_DRAFT_TOKENS}")
        if not 0 <= self.runahead_tokens <= MAX_RUNAHEAD_TOKENS:
            raise ValueError(f"runahead_tokens must be in 0..{MAX_RUNAHEAD_TOKENS}")

    @property
    def enabled(self) -> bool:
        return self.mode is not SpecMode.OFF

    @property
    def gated(self) -> bool:
        """``--spec auto``: a lane verifies its proposals only while they pay
        (``engine/spec_gate.py``), so a step without any is a plain step."""
        return self.mode is SpecMode.AUTO

    def step_slots(self, lanes: int) -> int:
        """Batch slots the decoding lanes may take in one step: each lane's next token, and
        the proposals (at most ``draft_tokens`` a lane, :data:`STEP_PROPOSALS` in all)."""
        if not self.enabled:
            return lanes
        return lanes + min(lanes * self.draft_tokens, self.step_proposals)

    def lane_limit(self, decoding: int) -> int:
        """Most proposals one of ``decoding`` lanes verifies in a step (0 beyond
        :data:`STEP_PROPOSALS` lanes)."""
        return min(self.draft_tokens, self.step_proposals // max(1, decoding))

    def beside_chunk(self, lanes: int) -> int:
        """Batch slots the decoding lanes take in a step that carries a prompt chunk: with
        ``--spec auto`` their next tokens only (such a step verifies no proposals:
        ``proposals.py``), otherwise :meth:`step_slots`."""
        return lanes if self.gated else self.step_slots(lanes)

    def within_batch(self, n_batch: int, lanes: int) -> SpecConfig:
        """``--spec auto`` in a context of ``n_batch`` batch slots: the proposals a step may
        verify beside ``lanes`` tokens (a step with proposals carries no prompt chunk, so
        they never shorten one), off when none fit. Other modes were asked for by name and
        stay as they are (the core refuses a batch they do not fit)."""
        if not self.gated:
            return self
        room = n_batch - lanes - 1
        if room < 1:
            return SPEC_OFF
        return replace(self, step_proposals=min(self.step_proposals, room))


SPEC_OFF: Final = SpecConfig()


class ServingPlugins(Protocol):
    """What the decode thread tells a model's serving plugins and proposers and asks them:
    the sidecars' link (``skippyctl.plugins.link``: delivery never blocks, ``propose`` waits at
    most its deadline), the in-process built-in plugin (``skippyctl.plugins.inprocess``) and the
    draft model (``engine/draft.py``). Token ids stay with them."""

    def begin(self, request: str, session: str | None, prompt: Sequence[int], reused: int) -> None:
        """A request starts generating from ``prompt`` (``reused`` of it came from its KV)."""

    def commit(self, request: str, tokens: Sequence[int]) -> None:
        """Canonical tokens committed since the previous call, in order."""

    def propose(self, wants: Mapping[str, int]) -> dict[str, list[int]]:
        """Proposals for each request id in ``wants`` (at most its value), valid token ids;
        requests the plugins had nothing for (or answered too late) are absent."""

    def late(self) -> frozenset[str]:
        """The requests of the last :meth:`propose` whose answer missed the deadline."""

    def outcome(
        self,
        request: str,
        proposed: int,
        accepted: int,
        kind: OutcomeKind,
        reason: DiscardReason | None = None,
    ) -> None:
        """How the proposals of a window ended: verified (``full_accept``, ``first_mismatch``,
        ``stopped`` when the request ended inside it: delivered before its finish or abort) or
        ``discarded`` unverified with a ``reason`` (``position_mismatch``: a run-ahead that no
        longer follows the text; ``execution_failed``: the step that would verify them
        failed)."""

    def finish(self, request: str, stop_reason: StopReason, figures: GenerationFigures) -> None:
        """The request completed, with its terminal's stop reason and figures (its final
        committed suffix travels with them)."""

    def abort(self, request: str, reason: str) -> None:
        """The request ended without completing (cancelled, timed out, failed)."""


class AdaptiveWindow:
    """How many proposals a request verifies next: each window fully accepted doubles it (up to
    the configured most), a rejection makes it what was accepted plus one. Proposes nothing
    itself: the proposals come from a :class:`ServingPlugins`, in every mode. Decode thread
    only."""

    __slots__ = ("window",)

    def __init__(self, first_window: int = FIRST_WINDOW) -> None:
        self.window = max(1, first_window)
        """How many tokens the next proposal may have (see :meth:`verified`)."""

    def verified(self, proposed: int, accepted: int, most: int) -> None:
        """A window's outcome: all ``proposed`` accepted doubles the next window (up to
        ``most``); a rejection makes it ``accepted + 1`` — proposals that failed here cost a
        batch slot each, so the next ones are only as many as just proved right, plus one."""
        if accepted >= proposed:
            self.window = min(most, self.window * 2)
        else:
            self.window = max(1, min(most, accepted + 1))
