"""``benchmarks/spec_bound.py``'s replay: lanes in lockstep, each step costing the plain step of
the lanes still running plus a proposed token per verified proposal."""

from __future__ import annotations

import pytest

from benchmarks.spec_bound import Replay, prefill_ms, replay, wall_bound

PLAIN = {1: 10.0, 2: 15.0}
TOKEN = {1: 2.0, 2: 3.0}


def test_a_reply_that_copies_its_prompt_is_proposed_from_its_third_token_on() -> None:
    """The prompt's first step samples token 0; token 1 has no earlier 2-gram to follow, so it
    takes a plain step; from then on the prompt proposes the rest, all of it right."""
    prompt = list(range(100, 200))
    replies = [{"prompt": prompt, "reply": prompt[:50]}]
    assert replay(replies, 1, PLAIN, TOKEN, oracle=False) == (49 * 10.0, 50, 0, 49)
    oracle = replay(replies, 1, PLAIN, TOKEN, oracle=True)
    assert (oracle.made, oracle.from_proposals, oracle.steps) == (50, 47, 2)
    assert oracle.ms == pytest.approx(2 * 10.0 + 47 * 2.0)


def test_lanes_pay_the_plain_step_of_the_lanes_still_running() -> None:
    """Replies of 3 and 5 tokens that nothing proposes: two steps of both lanes, then two of
    the longer one alone."""
    replies = [{"prompt": [1, 2, 3], "reply": [7, 8, 9]}, {"prompt": [4, 5, 6], "reply": [11] * 5}]
    off = replay(replies, 2, PLAIN, TOKEN, oracle=False)
    assert (off.ms, off.made, off.steps) == (2 * 15.0 + 2 * 10.0, 8, 4)


def test_the_wall_bound_saves_the_rest_of_the_run_but_the_prefill_as_it_saves_steps() -> None:
    """A 100-step plain decode of 1000 ms inside a 1500 ms run with 200 ms of prefill, an
    oracle of 40 steps and 600 ms: 400 ms of decode and 60 % of the other 300 ms saved."""
    off, oracle = Replay(1000.0, 200, 0, 100), Replay(600.0, 200, 120, 40)
    assert wall_bound(1500.0, off, oracle, 200.0) == pytest.approx(1500.0 / (1500.0 - 580.0))


def test_a_replay_slower_than_the_run_scales_its_saving_to_the_run() -> None:
    """The replayed decode (2000 ms) took longer than the measured run (1000 ms): its saving
    is scaled to the run, with nothing outside the decode."""
    off, oracle = Replay(2000.0, 200, 0, 100), Replay(1000.0, 200, 120, 40)
    assert wall_bound(1000.0, off, oracle, 300.0) == pytest.approx(2.0)


def test_prefill_counts_the_prompts_each_session_count_asks() -> None:
    """One session asks every prompt once; eight sessions ask prompt i mod 4 each."""
    replies = [{"prefill_ms": float(ms)} for ms in (10, 20, 30, 40)]
    assert prefill_ms(replies, 1) == 100.0
    assert prefill_ms(replies, 8) == 200.0
    assert prefill_ms(replies, 2) == 30.0
