"""``--spec auto``: which decoding lanes verify their n-gram proposals in a step.

A lane's proposals pay when the tokens they are expected to add are worth more than what
verifying them adds to the step, on this machine, for this model, at this batch size:

- **Worth.** A window of ``k`` proposals at per-token acceptance ``p`` adds
  ``p + p² + … + pᵏ`` tokens on average (verification stops at the first mismatch), each worth
  what a plain step spends per lane: ``plain(d) / d`` seconds with ``d`` lanes decoding.
- **Length.** A window grows while its next token still pays on its own (``pᵏ`` of a token's
  worth against ``c``), or takes the length of a window already in the step when that saves
  a forward pass; never past twice the longest run of right proposals the lane has shown
  (:data:`FIRST_WINDOW_CAP` before one): acceptance is not one per-token figure for every
  proposal, and a run of right short ones says little of a long one. With several lanes the
  windows may all take one common length instead, when that pays better: lanes of equal
  windows verify in the passes the step needs anyway, where the first lane's window alone
  would add one.
- **Cost.** What a step's proposals add to its time: ``c`` seconds a proposed token and ``e``
  seconds a forward pass they add (with one KV stream per lane, llama.cpp verifies lanes of
  unequal lengths in several passes: ``engine/batch.py``'s :func:`forward_passes`). Both are
  fitted as the step goes (recursive least squares, forgetting old steps) from how much
  longer speculating steps took than plain steps with as many lanes, for each lane count
  apart (:class:`StepCosts`).

- **Bound.** A request that arrives waits for the step under way before its prompt is decoded.
  So a step verifies no proposals while a request is due: a lane is free, a generation ended
  lately (its client's next request is on its way) and requests lately started beside decoding
  lanes (``DecodeCore._arrival_may_wait``); nor does a step that carries a prompt chunk
  (``proposals.py``). With every lane busy, or one client's requests one after the other, the
  windows are as long as they pay.

Acceptance is measured per lane also while the lane does not speculate: the proposer is still
asked (prompt lookup in this process costs microseconds), and its proposal is compared with
the tokens the lane then commits — a shadow window that costs no decode (:class:`LaneGate`).
So a lane that stopped because its proposals failed, or because the batch grew, starts again
as soon as they would pay again. Whether a lane counts as speculating follows the share of
its steps with proposals that verified them, with hysteresis; every switch is reported
(``speculation_switched``).

Decode thread only; no llama.cpp, no tokens leave (only counts and a percentage).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

ACCEPTANCE_DECAY: Final = 0.8
"""Each window's weight against the lane's earlier ones: recent windows decide."""
MODEL_ACCEPTANCE_DECAY: Final = 0.98
"""The same over every lane of the model: the prior a request starts from."""
PRIOR_WINDOWS: Final = 2.0
"""How many windows the model's acceptance counts for in a lane's estimate."""
PLAIN_STEP_WEIGHT: Final = 0.1
"""Weight of each plain step's time in its lane count's moving average."""
COST_FORGETTING: Final = 0.99
"""Recursive least squares' forgetting factor: a step 100 steps ago weighs a third."""
STEP_NOISE: Final = 0.1
"""How much a step's time varies from one step to the next, as a share of it (2 busy cores)."""
CHOSEN_WEIGHT: Final = 0.5
"""Weight of each step a lane had proposals in its share of such steps that verified them."""
FIRST_WINDOW_CAP: Final = 4
"""The longest window a lane verifies before any of its windows had a proposal right; each
longer run of right proposals lets it verify twice that (``LaneGate.longest_window``)."""
SWITCH_ON: Final = 0.6
SWITCH_OFF: Final = 0.25
"""Shares of a lane's steps with proposals that verified them, at which it counts as
speculating and as not (hysteresis: one step either way does not switch it)."""


def expected_accepted(acceptance: float, window: int) -> float:
    """Tokens a window of ``window`` proposals adds on average at per-token ``acceptance``."""
    if acceptance >= 1.0:
        return float(window)
    if acceptance <= 0.0:
        return 0.0
    return acceptance * (1.0 - acceptance**window) / (1.0 - acceptance)


def _best_length(acceptance: float, proposed: int, value: float, token: float) -> int:
    """:meth:`SpecGate.best_length` from a lane's ``acceptance``, the seconds a token is worth
    (``value``) and a proposed token costs (``token``)."""
    if token <= 0 or acceptance >= 1.0:
        return proposed
    if acceptance <= 0.0 or token >= value:
        return 1
    return max(1, min(proposed, int(math.log(token / value) / math.log(acceptance))))


@dataclass(frozen=True, slots=True)
class _Prices:
    """One step's figures for the gate: seconds a committed token is worth (``value``: a
    lane's share of a plain step), a proposed token costs and an added forward pass costs."""

    value: float
    token: float
    per_pass: float

    def of(self, proposed: int, added_passes: int) -> float:
        return self.token * proposed + self.per_pass * added_passes


def _rank(entry: tuple[float, Candidate, float]) -> float:
    return entry[0]


class _CostFit:
    """A recursive least-squares fit of ``[c, e]`` (seconds a proposed token, seconds an added
    forward pass) for one lane count, from a prior (module docstring, "Cost")."""

    __slots__ = ("covariance", "estimate")

    def __init__(self, plain: float, lanes: int) -> None:
        # The prior until speculating steps say otherwise: a proposed token costs a quarter of
        # a lane's share of the step, and an added forward pass as much as the whole step (a
        # pass reads every weight, as a one-lane step does) — pessimistic, so a lane speculates
        # first where it clearly pays, and the fit learns from there.
        token, added_pass = plain / lanes / 4.0, plain
        self.estimate = [token, added_pass]
        # In units of a step's noise (about a tenth of it), each prior as uncertain as it is
        # large: a few speculating steps outweigh it.
        noise = STEP_NOISE * plain
        self.covariance = [[(token / noise) ** 2, 0.0], [0.0, (added_pass / noise) ** 2]]

    def update(self, proposed: int, added_passes: int, excess: float) -> None:
        """A step whose proposals took ``excess`` seconds more than a plain step."""
        x0, x1 = float(proposed), float(added_passes)
        p = self.covariance
        cost = self.estimate
        px0 = p[0][0] * x0 + p[0][1] * x1
        px1 = p[1][0] * x0 + p[1][1] * x1
        gain_den = COST_FORGETTING + x0 * px0 + x1 * px1
        k0, k1 = px0 / gain_den, px1 / gain_den
        error = excess - (cost[0] * x0 + cost[1] * x1)
        cost[0] += k0 * error
        cost[1] += k1 * error
        # P = (P - k xᵀ P) / λ, with xᵀP = (px0, px1) since P is symmetric.
        self.covariance = [
            [(p[0][0] - k0 * px0) / COST_FORGETTING, (p[0][1] - k0 * px1) / COST_FORGETTING],
            [(p[1][0] - k1 * px0) / COST_FORGETTING, (p[1][1] - k1 * px1) / COST_FORGETTING],
        ]


class StepCosts:
    """What steps cost, for each lane count: a moving average of plain steps' seconds, and a
    recursive least-squares fit of what proposals add (module docstring). Each lane count has
    its own fit: a proposed token beside one lane changes the step's products from one row to
    several and costs about twice what it costs beside four lanes (the real model, measured in
    the engine: about 5 ms for the first one beside a 11 ms step, 2 ms each beside a 22 ms
    step of 4 lanes)."""

    __slots__ = ("_fits", "_plain")

    def __init__(self) -> None:
        self._plain: dict[int, float] = {}
        self._fits: dict[int, _CostFit] = {}

    def plain(self, lanes: int) -> float | None:
        """Seconds a plain step of ``lanes`` decoding lanes takes (the nearest lane count
        measured when this one was not), None before any plain step."""
        known = self._plain.get(lanes)
        if known is not None or not self._plain:
            return known
        nearest = min(self._plain, key=lambda measured: abs(measured - lanes))
        return self._plain[nearest]

    def observe_plain(self, lanes: int, seconds: float) -> None:
        known = self._plain.get(lanes)
        self._plain[lanes] = (
            seconds if known is None else known + PLAIN_STEP_WEIGHT * (seconds - known)
        )
        if lanes not in self._fits:
            self._fits[lanes] = _CostFit(self._plain[lanes], lanes)

    def observe_speculated(
        self, lanes: int, proposed: int, added_passes: int, seconds: float
    ) -> None:
        """A step of ``lanes`` lanes that verified ``proposed`` tokens in ``added_passes``
        passes more than its lanes alone would need took ``seconds``."""
        plain = self._plain.get(lanes)
        fit = self._fits.get(lanes)
        if plain is None or fit is None or proposed <= 0:
            return
        fit.update(proposed, added_passes, seconds - plain)

    def cost(self, lanes: int, proposed: int, added_passes: int) -> float | None:
        """Seconds ``proposed`` tokens in ``added_passes`` more passes add to a step of
        ``lanes`` lanes (the prior from the nearest lane count's plain step before one of
        this count was measured); None before any plain step (nothing to compare with)."""
        fit = self._fits.get(lanes)
        if fit is None:
            plain = self.plain(lanes)
            if plain is None:
                return None
            fit = _CostFit(plain, lanes)
        c, e = fit.estimate
        return max(0.0, c) * proposed + max(0.0, e) * added_passes


class LaneGate:
    """One request's acceptance and speculation state (module docstring)."""

    __slots__ = (
        "_accepted",
        "_chosen",
        "_rejected",
        "longest_run",
        "on",
        "shadow",
        "shadow_matched",
    )

    def __init__(self) -> None:
        self._accepted = 0.0
        """Accepted proposals, each window weighted by :data:`ACCEPTANCE_DECAY` per later one."""
        self._rejected = 0.0
        """Windows that ended in a mismatch, weighted alike."""
        self.on = False
        """Whether the lane speculates: its share of steps with proposals that verified them
        crossed :data:`SWITCH_ON` (and not :data:`SWITCH_OFF` since)."""
        self._chosen = 0.0
        self.shadow: list[int] = []
        """A proposal not verified, compared with the tokens the lane commits next."""
        self.shadow_matched = 0
        self.longest_run = 0
        """The most proposals one of its windows (verified or shadow) had right in a row."""

    def longest_window(self) -> int:
        """The longest window the lane may verify: twice its longest run of right proposals
        (:data:`FIRST_WINDOW_CAP` before one). The per-token estimate alone would let a run
        of right one- or two-token proposals (another session a step ahead on the same text)
        buy a 64-token window of the lane's own, much weaker, cyclic continuation."""
        return max(FIRST_WINDOW_CAP, 2 * self.longest_run)

    def acceptance(self, prior: float) -> float:
        """Per-token acceptance: the geometric estimate accepted / (accepted + mismatches),
        with the model's acceptance ``prior`` counted as :data:`PRIOR_WINDOWS` windows."""
        accepted = self._accepted + PRIOR_WINDOWS * prior
        return accepted / (accepted + self._rejected + PRIOR_WINDOWS * (1.0 - prior))

    def verified(self, chosen: bool) -> bool:
        """A step in which the lane had proposals verified them (``chosen``) or not; True when
        that switched :attr:`on`."""
        self._chosen += CHOSEN_WEIGHT * ((1.0 if chosen else 0.0) - self._chosen)
        if self.on and self._chosen < SWITCH_OFF or not self.on and self._chosen > SWITCH_ON:
            self.on = not self.on
            return True
        return False

    def record(self, proposed: int, accepted: int) -> None:
        if accepted > self.longest_run:
            self.longest_run = accepted
        self._accepted = self._accepted * ACCEPTANCE_DECAY + accepted
        self._rejected = self._rejected * ACCEPTANCE_DECAY + (1.0 if accepted < proposed else 0.0)

    def committed(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """Compare the shadow proposal with ``tokens`` just committed: ``(proposed,
        accepted)`` once it is decided (a mismatch, or every token matched), else None."""
        shadow = self.shadow
        if not shadow:
            return None
        matched = self.shadow_matched
        for token in tokens:
            if token != shadow[matched]:
                self.shadow = []
                return len(shadow), matched
            matched += 1
            if matched == len(shadow):
                self.shadow = []
                return len(shadow), matched
        self.shadow_matched = matched
        return None


@dataclass(frozen=True, slots=True)
class Candidate:
    """A lane with a proposal this step: its sequence, proposal length and gate."""

    seq: int
    proposed: int
    gate: LaneGate


class SpecGate:
    """The model's ``--spec auto`` decisions (module docstring). ``passes`` counts a step's
    forward passes from its ``(sequence, tokens)`` rows (one with a unified KV)."""

    __slots__ = ("_accepted", "_passes", "_rejected", "costs")

    def __init__(self, passes: Callable[[Sequence[tuple[int, int]]], int]) -> None:
        self._passes = passes
        self.costs = StepCosts()
        self._accepted = 0.0
        self._rejected = 0.0

    @property
    def prior(self) -> float:
        """The model's per-token acceptance over recent windows of every lane (0.5 before
        any)."""
        return (self._accepted + 1.0) / (self._accepted + self._rejected + 2.0)

    def record(self, gate: LaneGate, proposed: int, accepted: int) -> None:
        """A window's outcome, verified or shadow."""
        gate.record(proposed, accepted)
        self._accepted = self._accepted * MODEL_ACCEPTANCE_DECAY + accepted
        self._rejected = self._rejected * MODEL_ACCEPTANCE_DECAY + (
            1.0 if accepted < proposed else 0.0
        )

    def best_length(self, gate: LaneGate, proposed: int, lanes: int) -> int:
        """The window of at most ``proposed`` that pays best on its own: its ``k``-th token
        adds ``pᵏ`` tokens worth ``plain / lanes`` each for ``c`` more seconds, so a window
        grows while ``pᵏ · plain / lanes > c``."""
        plain = self.costs.plain(lanes)
        per_token = self.costs.cost(lanes, 1, 0)
        if plain is None or per_token is None:
            return proposed
        return _best_length(gate.acceptance(self.prior), proposed, plain / lanes, per_token)

    def choose(
        self,
        rows: list[tuple[int, int]],
        candidates: Sequence[Candidate],
        lanes: int,
    ) -> tuple[dict[int, int], list[LaneGate]]:
        """Which candidates verify how many of their proposals this step: ``{seq: length}``,
        and the gates that switched on or off. ``rows`` are the step's ``(sequence, tokens)``
        without proposals; lanes are taken best worth-per-token first while each still pays
        for what it adds — a window may be cut to the length of one already taken, when
        sharing that one's passes pays better — unless windows of one common length for all
        of them pay better still (:meth:`_common_length`)."""
        chosen: dict[int, int] = {}
        plain = self.costs.plain(lanes)
        token = self.costs.cost(lanes, 1, 0)
        per_pass = self.costs.cost(lanes, 0, 1)
        if plain is not None and token is not None and per_pass is not None:
            # Each lane's acceptance once a step: this runs every step.
            value, prior = plain / lanes, self.prior
            ranked: list[tuple[float, Candidate, float]] = []
            for candidate in candidates:
                cap = candidate.gate.longest_window()
                if candidate.proposed > cap:  # a copy only then
                    candidate = replace(candidate, proposed=cap)
                acceptance = candidate.gate.acceptance(prior)
                # Ranked by the tokens a proposed token is expected to add.
                yield_ = expected_accepted(acceptance, candidate.proposed) / candidate.proposed
                ranked.append((yield_, candidate, acceptance))
            ranked.sort(key=_rank, reverse=True)
            lanes_by_worth = [(candidate, acceptance) for _r, candidate, acceptance in ranked]
            prices = _Prices(value, token, per_pass)
            chosen = self._one_by_one(rows, lanes_by_worth, prices)
            if len(ranked) > 1:
                chosen = self._common_length(rows, lanes_by_worth, prices, chosen)
        switched = [
            candidate.gate
            for candidate in candidates
            if candidate.gate.verified(candidate.seq in chosen)
        ]
        return chosen, switched

    def _one_by_one(
        self,
        rows: list[tuple[int, int]],
        lanes_by_worth: Sequence[tuple[Candidate, float]],
        prices: _Prices,
    ) -> dict[int, int]:
        """Candidates (with their acceptance) taken in order while each pays for what it adds
        to the step taken so far: its whole proposal, the length that pays best on its own, or
        the length of a window already taken (sharing its passes)."""
        chosen: dict[int, int] = {}
        current = dict(rows)
        passes = self._passes(rows)
        for candidate, acceptance in lanes_by_worth:
            best: tuple[float, int, int] | None = None
            lengths = {
                candidate.proposed,
                _best_length(acceptance, candidate.proposed, prices.value, prices.token),
            } | {taken for taken in chosen.values() if taken < candidate.proposed}
            for length in lengths:
                trial = dict(current)
                trial[candidate.seq] = trial.get(candidate.seq, 0) + length
                trial_passes = self._passes(list(trial.items()))
                cost = prices.of(length, trial_passes - passes)
                net = expected_accepted(acceptance, length) * prices.value - cost
                if net > 0 and (best is None or net > best[0]):
                    best = (net, length, trial_passes)
            if best is not None:
                _net, length, passes = best
                current[candidate.seq] = current.get(candidate.seq, 0) + length
                chosen[candidate.seq] = length
        return chosen

    def _common_length(
        self,
        rows: list[tuple[int, int]],
        lanes_by_worth: Sequence[tuple[Candidate, float]],
        prices: _Prices,
        chosen: dict[int, int],
    ) -> dict[int, int]:
        """The better of ``chosen`` and windows of one common length. Taken one by one, the
        first lane's window pays for the forward pass it adds on its own, and is refused when
        that pass costs more than it brings — though with every lane's window as long as it,
        the step needs no added pass at all. So every length a candidate proposes or would
        take on its own is tried for all of them at once: each candidate whose own rows pay
        at that length (cut to it, or its whole proposal when shorter)."""
        base = self._passes(rows)
        lengths = {candidate.proposed for candidate, _a in lanes_by_worth} | {
            _best_length(acceptance, candidate.proposed, prices.value, prices.token)
            for candidate, acceptance in lanes_by_worth
        }
        best, best_net = chosen, self._net(rows, lanes_by_worth, prices, chosen, base)
        for common in lengths:
            plan: dict[int, int] = {}
            for candidate, acceptance in lanes_by_worth:
                length = min(common, candidate.proposed)
                if expected_accepted(acceptance, length) * prices.value > prices.token * length:
                    plan[candidate.seq] = length
            net = self._net(rows, lanes_by_worth, prices, plan, base)
            if net > best_net:
                best, best_net = plan, net
        return best

    def _net(
        self,
        rows: list[tuple[int, int]],
        lanes_by_worth: Sequence[tuple[Candidate, float]],
        prices: _Prices,
        plan: Mapping[int, int],
        base: int,
    ) -> float:
        """Seconds the ``plan``'s windows save on average, less what they add to the step."""
        if not plan:
            return 0.0
        worth = 0.0
        for candidate, acceptance in lanes_by_worth:
            length = plan.get(candidate.seq)
            if length:
                worth += expected_accepted(acceptance, length) * prices.value
        passes = self._passes([(seq, tokens + plan.get(seq, 0)) for seq, tokens in rows])
        return worth - prices.of(sum(plan.values()), passes - base)

    def added_passes(self, rows: Sequence[tuple[int, int]], chosen: Mapping[int, int]) -> int:
        """The forward passes the ``chosen`` windows add to what the step's rows alone take."""
        with_proposals = [(seq, tokens + chosen.get(seq, 0)) for seq, tokens in rows]
        return self._passes(with_proposals) - self._passes(rows)
