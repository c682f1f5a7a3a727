"""``--spec auto``'s decisions (``engine/spec_gate.py``), with step times given, not measured."""

from __future__ import annotations

import random

import pytest

from skippyctl.engine.batch import forward_passes
from skippyctl.engine.spec_gate import (
    FIRST_WINDOW_CAP,
    Candidate,
    LaneGate,
    SpecGate,
    StepCosts,
    expected_accepted,
)


def test_expected_accepted_is_the_geometric_sum() -> None:
    assert expected_accepted(0.0, 8) == 0.0
    assert expected_accepted(1.0, 8) == 8.0
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)


def test_step_costs_learn_what_a_proposed_token_and_an_added_pass_cost() -> None:
    """Synthetic steps: 10 ms a plain step of 4 lanes, 0.6 ms a proposed token, 4 ms a pass,
    with ±10 % noise (fixed seed): the fit finds both within 15 %."""
    rng = random.Random(7)
    costs = StepCosts()
    for _ in range(20):
        costs.observe_plain(4, 0.010 * rng.uniform(0.9, 1.1))
    for _ in range(300):
        proposed = rng.randint(1, 40)
        added = rng.randint(0, 3)
        seconds = 0.010 + 0.0006 * proposed + 0.004 * added
        costs.observe_speculated(4, proposed, added, seconds * rng.uniform(0.9, 1.1))
    one_token = costs.cost(4, 1, 0)
    one_pass = costs.cost(4, 0, 1)
    assert one_token is not None and one_pass is not None
    assert one_token == pytest.approx(0.0006, rel=0.15)
    assert one_pass == pytest.approx(0.004, rel=0.15)


def test_nothing_is_known_before_a_plain_step() -> None:
    costs = StepCosts()
    assert costs.plain(1) is None and costs.cost(1, 4, 1) is None
    costs.observe_plain(2, 0.02)
    assert costs.plain(8) == pytest.approx(0.02)  # the nearest lane count measured


def test_a_shadow_is_decided_at_its_first_mismatch_or_when_all_matched() -> None:
    gate = LaneGate()
    gate.shadow = [5, 6, 7]
    assert gate.committed([5]) is None
    assert gate.committed([6, 9]) == (3, 2)
    assert not gate.shadow
    gate.shadow, gate.shadow_matched = [1, 2], 0
    assert gate.committed([1, 2, 3]) == (2, 2)


def _gate(plain_s: float, lanes: int, token_s: float, pass_s: float) -> SpecGate:
    """A gate that has learned the given costs exactly."""
    gate = SpecGate(forward_passes)
    gate.costs.observe_plain(lanes, plain_s)
    for proposed, added in ((4, 0), (8, 1), (16, 0), (2, 1)) * 50:
        seconds = plain_s + token_s * proposed + pass_s * added
        gate.costs.observe_speculated(lanes, proposed, added, seconds)
    return gate


def _accepting(gate: SpecGate, lane: LaneGate, proposed: int, accepted: int, n: int) -> None:
    for _ in range(n):
        gate.record(lane, proposed, accepted)


def _accepting_lanes(gate: SpecGate, lanes: int, window: int) -> list[LaneGate]:
    """``lanes`` lanes whose last 6 windows of ``window`` proposals were right."""
    gates = [LaneGate() for _ in range(lanes)]
    for lane in gates:
        _accepting(gate, lane, window, window, 6)
    return gates


def _steps(
    gate: SpecGate, rows: list[tuple[int, int]], candidates: list[Candidate], lanes: int, n: int
) -> tuple[dict[int, int], list[LaneGate]]:
    """``n`` steps with the same proposals: the last step's choice, every switch on the way."""
    switches: list[LaneGate] = []
    chosen: dict[int, int] = {}
    for _ in range(n):
        chosen, switched = gate.choose(rows, candidates, lanes)
        switches.extend(switched)
    return chosen, switches


def test_a_lane_whose_proposals_are_right_speculates_and_one_whose_are_wrong_does_not() -> None:
    """A proposed token costs 3 ms, a token 10 ms: proposals that are right pay, those right
    less than 30 % of the time do not, at any length (another model's gate: no shared prior)."""
    gate = _gate(0.010, 1, 0.003, 0.0)
    good, bad = LaneGate(), LaneGate()
    _accepting(gate, good, 8, 8, 5)
    chosen, switched = gate.choose([(0, 1)], [Candidate(0, 8, good)], 1)
    assert chosen == {0: 8} and switched == [] and not good.on  # one step does not switch
    chosen, switched = _steps(gate, [(0, 1)], [Candidate(0, 8, good)], 1, 4)
    assert chosen == {0: 8} and switched == [good] and good.on
    gate = _gate(0.010, 1, 0.003, 0.0)
    _accepting(gate, bad, 8, 0, 5)
    chosen, switched = _steps(gate, [(0, 1)], [Candidate(0, 8, bad)], 1, 5)
    assert chosen == {} and not bad.on and switched == []


def test_a_lane_switches_off_when_its_acceptance_drops_and_on_again_when_it_recovers() -> None:
    gate = _gate(0.010, 1, 0.006, 0.0)
    lane = LaneGate()
    candidates = [Candidate(0, 8, lane)]
    _accepting(gate, lane, 8, 8, 5)
    _steps(gate, [(0, 1)], candidates, 1, 5)
    assert lane.on
    _accepting(gate, lane, 8, 0, 10)
    chosen, switched = _steps(gate, [(0, 1)], candidates, 1, 10)
    assert chosen == {} and not lane.on and switched == [lane]
    _accepting(gate, lane, 8, 8, 10)  # e.g. shadow windows that turned out right
    chosen, switched = _steps(gate, [(0, 1)], candidates, 1, 10)
    assert chosen == {0: 8} and lane.on and switched == [lane]


def test_an_added_pass_that_costs_more_than_the_window_adds_keeps_a_lane_out() -> None:
    """Eight lanes with one KV stream each: one lane's proposals alone cost a whole extra
    forward pass. With half its proposals right that does not pay; with all of them it does."""
    lanes = 8
    rows = [(seq, 1) for seq in range(lanes)]
    gate = _gate(0.030, lanes, 0.0005, 0.012)
    middling = LaneGate()
    _accepting(gate, middling, 4, 1, 6)
    chosen, _ = gate.choose(rows, [Candidate(3, 4, middling)], lanes)
    assert chosen == {}
    sure = LaneGate()
    _accepting(gate, sure, 16, 16, 6)
    chosen, _ = gate.choose(rows, [Candidate(3, 16, sure)], lanes)
    assert chosen == {3: 16}


def test_lanes_verify_their_own_lengths_when_passes_are_free() -> None:
    lanes = 4
    rows = [(seq, 1) for seq in range(lanes)]
    gate = _gate(0.020, lanes, 0.0002, 0.0)
    a, b = LaneGate(), LaneGate()
    _accepting(gate, a, 16, 16, 6)
    _accepting(gate, b, 12, 12, 6)
    chosen, _ = gate.choose(rows, [Candidate(0, 16, a), Candidate(1, 12, b)], lanes)
    assert chosen == {0: 16, 1: 12}


def test_a_longer_window_is_cut_to_one_already_taken_when_its_own_pass_is_dear() -> None:
    """Sequences 0 and 1 with 8 and 16 proposals beside two plain lanes, the second lane's
    mostly wrong past its first few: 16 would need a pass of its own, 8 shares the first
    lane's; with passes dear the second verifies 8."""
    lanes = 4
    rows = [(seq, 1) for seq in range(lanes)]
    gate = _gate(0.020, lanes, 0.0002, 0.008)
    a, b = LaneGate(), LaneGate()
    _accepting(gate, a, 16, 16, 6)
    _accepting(gate, b, 16, 4, 6)
    chosen, _ = gate.choose(rows, [Candidate(0, 8, a), Candidate(1, 16, b)], lanes)
    assert chosen == {0: 8, 1: 8}


def test_every_lane_of_a_repetitive_batch_speculates_at_its_own_length() -> None:
    lanes = 4
    rows = [(seq, 1) for seq in range(lanes)]
    gate = _gate(0.020, lanes, 0.0003, 0.004)
    gates = _accepting_lanes(gate, lanes, 16)
    windows = [16, 12, 16, 8]
    candidates = [Candidate(seq, windows[seq], gates[seq]) for seq in range(lanes)]
    chosen, switched = _steps(gate, rows, candidates, lanes, 5)
    assert chosen == dict(enumerate(windows)) and len(switched) == lanes


def test_a_window_is_as_long_as_its_next_token_still_pays() -> None:
    """Half the proposals right, a proposed token at a tenth of a token's worth: the k-th
    token adds 0.5^k, which pays while it is above 0.1 — three tokens, whatever was proposed;
    proposals that are always right are taken whole."""
    gate = _gate(0.010, 1, 0.001, 0.0)
    half, sure = LaneGate(), LaneGate()
    for _ in range(40):
        gate.record(half, 2, 1)  # a mismatch after every accepted token: p = 1/2
    assert half.acceptance(gate.prior) == pytest.approx(0.5, abs=0.05)
    assert gate.best_length(half, 16, 1) == 3
    chosen, _ = gate.choose([(0, 1)], [Candidate(0, 16, half)], 1)
    assert chosen == {0: 3}
    _accepting(gate, sure, 16, 16, 30)
    assert gate.best_length(sure, 16, 1) == 16


def test_a_window_is_at_most_twice_the_longest_run_of_right_proposals_the_lane_has_shown() -> None:
    """Right one-token proposals (another session a step ahead on the same text) make the
    per-token estimate high; they do not buy a 53-token window of the lane's own proposal:
    FIRST_WINDOW_CAP at most, as before any run, and twice a longer run once the lane shows
    one."""
    gate = _gate(0.010, 1, 0.0001, 0.0)
    fresh = LaneGate()
    assert gate.choose([(0, 1)], [Candidate(0, 53, fresh)], 1)[0] == {0: FIRST_WINDOW_CAP}
    lane = LaneGate()
    _accepting(gate, lane, 1, 1, 40)
    assert lane.acceptance(gate.prior) > 0.9
    assert gate.choose([(0, 1)], [Candidate(0, 53, lane)], 1)[0] == {0: FIRST_WINDOW_CAP}
    gate.record(lane, 12, 10)
    assert lane.longest_window() == 20
    assert gate.choose([(0, 1)], [Candidate(0, 53, lane)], 1)[0] == {0: 20}


def test_lanes_that_each_would_add_a_pass_alone_verify_together_at_one_length() -> None:
    """Four lanes with one KV stream each, a forward pass dear (a plain step's half): one
    lane's window alone would need a pass of its own and does not pay for it, so taken one by
    one no lane speculates; windows of one length on every lane need no added pass, and
    their rows pay. Uneven proposals (16, 12, 16, 6) are cut to a common length."""
    lanes = 4
    rows = [(seq, 1) for seq in range(lanes)]
    gate = _gate(0.022, lanes, 0.0026, 0.011)
    gates = [LaneGate() for _ in range(lanes)]
    for lane in gates:  # 5 of each window of 8 right: about 0.83 a token
        _accepting(gate, lane, 8, 5, 6)
    single, _ = gate.choose(rows, [Candidate(0, 8, gates[0])], lanes)
    assert single == {}
    windows = [16, 12, 16, 6]
    candidates = [Candidate(seq, windows[seq], gates[seq]) for seq in range(lanes)]
    chosen, _ = gate.choose(rows, candidates, lanes)
    assert len(chosen) == lanes and len(set(chosen.values())) == 1
    assert gate.added_passes(rows, chosen) == 0


def test_each_lane_count_has_its_own_cost_fit() -> None:
    """A proposed token beside one lane costs 5 ms (the step's products go from one row to
    several); beside four, 2 ms. What one lane's steps taught does not price four lanes'
    windows: before any step of four speculated, its prior (a quarter of a lane's share of the
    plain step) prices them, then its own steps."""
    costs = StepCosts()
    costs.observe_plain(1, 0.011)
    for proposed in (1, 2, 4, 8) * 30:
        costs.observe_speculated(1, proposed, 0, 0.011 + 0.005 * proposed)
    assert costs.cost(1, 1, 0) == pytest.approx(0.005, rel=0.05)
    assert costs.cost(4, 1, 0) == pytest.approx(0.011 / 4 / 4)  # the prior, from the nearest
    costs.observe_plain(4, 0.022)
    assert costs.cost(4, 1, 0) == pytest.approx(0.022 / 4 / 4)
    for proposed in (4, 8, 16) * 30:
        costs.observe_speculated(4, proposed, 0, 0.022 + 0.002 * proposed)
    assert costs.cost(4, 1, 0) == pytest.approx(0.002, rel=0.05)
    assert costs.cost(1, 1, 0) == pytest.approx(0.005, rel=0.05)
