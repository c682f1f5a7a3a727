"""Speculation's configuration and the adaptive window (engine/speculation.py). What the n-gram
proposer proposes is tests/plugins/test_builtin_ngram.py."""

from __future__ import annotations

import pytest

from skippyctl.config.load_options import MAX_DRAFT_TOKENS, SpecMode
from skippyctl.engine.speculation import (
    FIRST_WINDOW,
    STEP_PROPOSALS,
    AdaptiveWindow,
    SpecConfig,
)


def test_config_bounds_and_the_slots_it_takes_in_a_batch() -> None:
    assert SpecConfig().step_slots(4) == 4 and not SpecConfig().enabled
    assert SpecConfig(SpecMode.NGRAM, 4).step_slots(2) == 2 + 8
    assert SpecConfig(SpecMode.NGRAM, 64).step_slots(8) == 8 + STEP_PROPOSALS
    # One lane may verify its whole window; many share the step's proposals.
    spec = SpecConfig(SpecMode.NGRAM, 64)
    assert [spec.lane_limit(n) for n in (1, 2, 4, 8, 256, 257)] == [64, 64, 64, 32, 1, 0]
    assert SpecConfig(SpecMode.NGRAM, 8).lane_limit(1) == 8
    for bad in (0, MAX_DRAFT_TOKENS + 1):
        with pytest.raises(ValueError, match="draft_tokens"):
            SpecConfig(SpecMode.NGRAM, bad)


def test_the_window_doubles_while_all_is_accepted_and_shrinks_to_what_held() -> None:
    window = AdaptiveWindow()
    assert window.window == FIRST_WINDOW == 4
    window.verified(4, 4, most=16)
    window.verified(8, 8, most=16)
    assert window.window == 16
    window.verified(16, 16, most=16)
    assert window.window == 16  # capped by the load's --spec-draft-tokens
    window.verified(16, 5, most=16)
    assert window.window == 6  # what proved right, plus one
    window.verified(6, 0, most=16)
    assert window.window == 1  # a miss: one proposal next time, never none
    window.verified(1, 1, most=16)
    assert window.window == 2


def test_auto_takes_the_batch_beside_the_lanes_and_leaves_chunks_whole() -> None:
    """A step with proposals carries no prompt chunk under --spec auto, so its proposals take
    the batch the lanes leave (a one-lane context of 512 speculates) and a chunk never gives
    up a slot to them; without a slot to spare it is off. A mode asked for by name keeps its
    budget (the core refuses a batch it does not fit), and its chunks make room for it."""
    auto = SpecConfig(SpecMode.AUTO)
    roomy = auto.within_batch(n_batch=2048, lanes=4)
    assert roomy.step_proposals == STEP_PROPOSALS and roomy.enabled
    one_lane = auto.within_batch(n_batch=512, lanes=1)
    assert one_lane.enabled and one_lane.lane_limit(1) == 64
    tight = auto.within_batch(n_batch=100, lanes=2)
    assert tight.step_proposals == 100 - 2 - 1 and tight.step_slots(2) == 2 + 97
    assert tight.beside_chunk(2) == 2
    assert not auto.within_batch(n_batch=2, lanes=1).enabled
    ngram = SpecConfig(SpecMode.NGRAM)
    assert ngram.within_batch(n_batch=512, lanes=1) is ngram
    assert ngram.beside_chunk(2) == ngram.step_slots(2) == 2 + 128
