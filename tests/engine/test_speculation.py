"""The n-gram proposer (engine/speculation.py): what it proposes from a request's history."""

from __future__ import annotations

import pytest

from skippyctl.engine.speculation import (
    FIRST_WINDOW,
    MAX_DRAFT_TOKENS,
    STEP_PROPOSALS,
    NgramProposer,
    SpecConfig,
    SpecMode,
)


def test_a_single_token_match_is_not_enough() -> None:
    # "5" occurred before (followed by 6), but the 2-gram "9 5" did not.
    assert NgramProposer([5, 6, 7, 9, 5]).propose(3) == []
    assert NgramProposer([5, 6, 7, 9, 5], ngram_min=1).propose(2) == [6, 7]


def test_the_longest_earlier_match_of_the_suffix_proposes_what_followed_it() -> None:
    # ... 1 2 3 9 ... 7 2 3 4 ... 2 3: the 2-gram "2 3" last occurred before 4.
    proposer = NgramProposer([1, 2, 3, 9, 5, 7, 2, 3, 4, 6, 8])
    for token in (2, 3):
        proposer.commit(token)
    assert proposer.propose(3) == [4, 6, 8]
    # A longer match wins over a more recent shorter one: "7 2 3" occurred once, before 4.
    long = NgramProposer([7, 2, 3, 4, 5, 2, 3, 9, 9, 7, 2, 3])
    assert long.propose(2) == [4, 5]


def test_nothing_is_proposed_without_an_earlier_occurrence() -> None:
    proposer = NgramProposer([1, 2, 3, 4])
    assert proposer.propose(4) == []
    assert proposer.propose(0) == []
    assert NgramProposer([]).propose(4) == []


def test_a_recent_match_continues_its_cycle_past_the_end_of_the_history() -> None:
    assert NgramProposer([5, 6, 5, 6]).propose(5) == [5, 6, 5, 6, 5]
    assert NgramProposer([8, 8, 8]).propose(3) == [8, 8, 8]
    cycle = [10, 11, 12]
    proposer = NgramProposer(cycle * 2)
    assert proposer.propose(7) == [10, 11, 12, 10, 11, 12, 10]


def test_the_limit_caps_the_draft() -> None:
    proposer = NgramProposer([1, 2, 3, 4, 5, 1, 2])
    assert proposer.propose(2) == [3, 4]
    assert len(proposer.propose(50)) == 50


def test_config_bounds_and_the_slots_it_takes_in_a_batch() -> None:
    assert SpecConfig().step_slots(4) == 4 and not SpecConfig().enabled
    assert SpecConfig(SpecMode.NGRAM, 4).step_slots(2) == 2 + 8
    assert SpecConfig(SpecMode.NGRAM, 64).step_slots(8) == 8 + STEP_PROPOSALS
    # One lane may verify its whole window; many share the step's proposals.
    spec = SpecConfig(SpecMode.NGRAM, 64)
    assert [spec.lane_limit(n) for n in (1, 2, 4, 8, 64, 65)] == [64, 32, 16, 8, 1, 0]
    assert SpecConfig(SpecMode.NGRAM, 8).lane_limit(1) == 8
    for bad in (0, MAX_DRAFT_TOKENS + 1):
        with pytest.raises(ValueError, match="draft_tokens"):
            SpecConfig(SpecMode.NGRAM, bad)
    with pytest.raises(ValueError, match="ngram"):
        NgramProposer([], ngram_min=3, ngram_max=2)


def test_the_window_doubles_while_all_is_accepted_and_shrinks_to_what_held() -> None:
    proposer = NgramProposer([])
    assert proposer.window == FIRST_WINDOW == 4
    proposer.verified(4, 4, most=16)
    proposer.verified(8, 8, most=16)
    assert proposer.window == 16
    proposer.verified(16, 16, most=16)
    assert proposer.window == 16  # capped by the load's --spec-draft-tokens
    proposer.verified(16, 5, most=16)
    assert proposer.window == 6  # what proved right, plus one
    proposer.verified(6, 0, most=16)
    assert proposer.window == 1  # a miss: one proposal next time, never none
    proposer.verified(1, 1, most=16)
    assert proposer.window == 2
