"""``benchmarks/spec_bound.py``'s replay: lanes in lockstep, each step costing the plain step of
the lanes still running plus a proposed token per verified proposal."""

from __future__ import annotations

import pytest

from benchmarks.spec_bound import replay

PLAIN = {1: 10.0, 2: 15.0}
TOKEN = {1: 2.0, 2: 3.0}


def test_a_reply_that_copies_its_prompt_is_proposed_from_its_third_token_on() -> None:
    """The prompt's first step samples token 0; token 1 has no earlier 2-gram to follow, so it
    takes a plain step; from then on the prompt proposes the rest, all of it right."""
    prompt = list(range(100, 200))
    replies = [{"prompt": prompt, "reply": prompt[:50]}]
    assert replay(replies, 1, PLAIN, TOKEN, oracle=False) == (49 * 10.0, 50, 0)
    oracle_ms, made, from_proposals = replay(replies, 1, PLAIN, TOKEN, oracle=True)
    assert (made, from_proposals) == (50, 47)
    assert oracle_ms == pytest.approx(2 * 10.0 + 47 * 2.0)


def test_lanes_pay_the_plain_step_of_the_lanes_still_running() -> None:
    """Replies of 3 and 5 tokens that nothing proposes: two steps of both lanes, then two of
    the longer one alone."""
    replies = [{"prompt": [1, 2, 3], "reply": [7, 8, 9]}, {"prompt": [4, 5, 6], "reply": [11] * 5}]
    off_ms, made, _ = replay(replies, 2, PLAIN, TOKEN, oracle=False)
    assert (off_ms, made) == (2 * 15.0 + 2 * 10.0, 8)
