"""Lanes and KV reuse decisions, alone: pure Python, no llama.cpp (engine/lanes.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.engine.lanes import (
    KvGeometry,
    LaneTable,
    PressureGauge,
    cache_result,
    common_prefix,
)
from skippyctl.engine.protocol_messages import KvChange, SessionChange
from skippyctl.events.reasons import CacheResult


def test_a_request_without_a_session_takes_the_first_idle_lane_and_keeps_nothing() -> None:
    table = LaneTable(2)
    pick = table.pick(None)
    assert pick is not None and pick.lane.seq == 0 and pick.displaced is None
    claim = table.claim(pick.lane, "r1", None, [1, 2, 3])
    assert (claim.keep, claim.change) == (0, None)
    assert pick.lane.request_id == "r1"
    second = table.pick(None)
    assert second is not None and second.lane.seq == 1
    table.claim(second.lane, "r2", None, [4])
    assert table.all_busy()
    assert table.pick(None) is None


def test_a_new_session_is_bound_to_its_lane_and_reported_created() -> None:
    table = LaneTable(1)
    pick = table.pick("s-1")
    assert pick is not None
    claim = table.claim(pick.lane, "r1", "s-1", [1, 2, 3])
    assert (claim.keep, claim.change) == (0, SessionChange.CREATED)
    assert table.has_session("s-1") and pick.lane.session == "s-1"


def test_a_session_reuses_the_common_prefix_but_always_decodes_the_last_prompt_token() -> None:
    table = LaneTable(1)
    lane = table.lanes[0]
    table.claim(lane, "r1", "s", [1, 2, 3])
    lane.tokens = [1, 2, 3, 9]  # the prompt, then a sampled token
    assert not table.release(lane, now=1.0)  # keeps its session: no clear
    again = table.pick("s")
    assert again is not None and again.lane is lane
    grown = table.claim(lane, "r2", "s", [1, 2, 3, 9, 5])
    assert (grown.keep, grown.change) == (4, SessionChange.REUSED)
    lane.request_id = None
    same = table.claim(lane, "r3", "s", [1, 2, 3, 9])
    assert (same.keep, same.change) == (3, SessionChange.REUSED)  # the last token again
    lane.request_id = None
    diverged = table.claim(lane, "r4", "s", [1, 2, 7, 7, 7])
    assert (diverged.keep, diverged.change) == (2, SessionChange.TRIMMED)


def test_a_busy_session_lane_makes_its_request_wait_even_with_other_lanes_idle() -> None:
    table = LaneTable(2)
    lane = table.lanes[0]
    table.claim(lane, "r1", "s", [1])
    assert table.pick("s") is None
    other = table.pick("t")
    assert other is not None and other.lane.seq == 1


def test_the_least_recently_used_idle_session_is_displaced_when_every_lane_is_warm() -> None:
    table = LaneTable(2)
    for seq, (session, used_at) in enumerate((("old", 1.0), ("new", 2.0))):
        lane = table.lanes[seq]
        table.claim(lane, f"r{seq}", session, [seq])
        lane.tokens = [seq, seq]
        table.release(lane, now=used_at)
    pick = table.pick(None, [0, 0, 5])
    assert pick is not None
    assert (pick.lane.seq, pick.displaced) == (0, "old")
    assert pick.lane.session is None and not table.has_session("old")
    assert pick.lane.tokens == [0, 0]  # kept for the claim: the new prompt starts the same
    claim = table.claim(pick.lane, "r9", "newcomer", [0, 0, 5])
    assert (claim.keep, claim.change) == (2, SessionChange.CREATED)


def test_a_lane_keeps_its_kv_at_release_and_the_next_request_reuses_what_matches() -> None:
    """Like llama-server's slot cache: a shared prompt start is prefilled once, whoever sent it."""
    table = LaneTable(1)
    lane = table.lanes[0]
    table.claim(lane, "r1", None, [1, 2, 3])
    lane.tokens = [1, 2, 3, 9]
    assert table.cells_used() == 4  # a running request's KV counts
    assert not table.release(lane, now=5.0)  # nothing to clear
    assert lane.request_id is None and lane.last_used == 5.0
    assert table.cells_used() == 0  # kept as a reusable cache, not held by anyone
    without_session = table.claim(lane, "r2", None, [1, 2, 4])
    assert (without_session.keep, without_session.change) == (2, None)
    lane.request_id = None
    other_session = table.claim(lane, "r3", "s", [1, 2, 3, 9, 7])
    assert (other_session.keep, other_session.change) == (4, SessionChange.CREATED)
    lane.request_id = None
    nothing_shared = table.claim(lane, "r4", "t", [5, 6])
    assert (nothing_shared.keep, nothing_shared.change) == (0, SessionChange.CREATED)


def test_a_free_lane_is_picked_by_the_longest_shared_prefix_then_least_recently_used() -> None:
    table = LaneTable(3)
    for seq, (tokens, used_at) in enumerate((([1, 2], 1.0), ([1, 2, 3, 4], 3.0), ([], 2.0))):
        lane = table.lanes[seq]
        table.claim(lane, f"r{seq}", None, tokens or [0])
        lane.tokens = list(tokens)
        table.release(lane, now=used_at)
    best = table.pick("s", [1, 2, 3, 9])
    assert best is not None and best.lane.seq == 1 and best.displaced is None
    unrelated = table.pick(None, [7, 7])
    assert unrelated is not None and unrelated.lane.seq == 0  # nothing shared: the oldest


def test_a_donor_is_the_lane_sharing_the_longest_prefix_when_it_saves_enough() -> None:
    table = LaneTable(4)
    empty, short, long, pending = table.lanes
    short.tokens = [1, 2, 3]
    long.tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    long.request_id = "busy"  # a running request's KV may be copied too
    pending.tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    pending.copy_pending = True  # its own copy has not happened yet
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert table.donor(empty, prompt, keep=0, min_gain=4) is long
    assert table.donor(empty, prompt, keep=0, min_gain=9) is None  # saves only 8
    assert table.donor(short, prompt, keep=3, min_gain=5) is long  # 8 - 3 = 5 more
    assert table.donor(short, prompt, keep=3, min_gain=6) is None
    assert table.donor(long, prompt, keep=8, min_gain=1) is None  # nobody shares more
    # Never the whole prompt: its last token is decoded again for its logits.
    assert table.donor(empty, [1, 2, 3, 4, 5, 6, 7, 8], keep=0, min_gain=7) is long


def test_dropping_a_session_unbinds_its_lane_and_unknown_sessions_are_ignored() -> None:
    table = LaneTable(1)
    lane = table.lanes[0]
    table.claim(lane, "r", "s", [1])
    assert table.drop("s") is lane and lane.session is None
    assert table.drop("s") is None
    assert table.release(lane, now=1.0)  # dropped while busy: cleared when its request ends
    assert not table.release(lane, now=2.0)  # once


def test_pressure_relief_order_is_idle_warm_lanes_least_recently_used_first() -> None:
    table = LaneTable(3)
    for seq, used_at in ((0, 3.0), (1, 1.0), (2, 2.0)):
        lane = table.lanes[seq]
        table.claim(lane, f"r{seq}", f"s{seq}", [seq])
        table.release(lane, now=used_at)
    table.claim(table.lanes[2], "busy", "s2", [2])
    assert [lane.seq for lane in table.idle_sessions_lru()] == [1, 0]
    assert table.evict(table.lanes[1]) == "s1" and not table.has_session("s1")


def test_cells_used_counts_the_lanes_of_requests_and_sessions() -> None:
    table = LaneTable(3)
    table.claim(table.lanes[0], "r", None, [1])
    table.claim(table.lanes[1], "r2", "s", [1])
    table.release(table.lanes[1], now=1.0)  # idle, keeps its session
    for lane, tokens in zip(table.lanes, ([1, 2, 3], [4], [5, 6]), strict=True):
        lane.tokens = tokens
    assert table.cells_used() == 4  # lane 2: idle, no session — a reusable cache


@pytest.mark.parametrize(
    ("has_session", "kept", "prompt", "expected"),
    [
        (False, 0, 5, CacheResult.NONE),
        (False, 2, 5, CacheResult.PARTIAL),
        (False, 4, 5, CacheResult.HIT),
        (True, 0, 5, CacheResult.MISS),
        (True, 4, 5, CacheResult.HIT),
        (True, 2, 5, CacheResult.PARTIAL),
        (True, 0, 1, CacheResult.MISS),
    ],
)
def test_cache_result(has_session: bool, kept: int, prompt: int, expected: CacheResult) -> None:
    assert cache_result(has_session, kept, prompt) is expected


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_is_the_longest_shared_start(a: list[int], b: list[int]) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def test_pressure_has_hysteresis_and_never_flaps_in_between() -> None:
    gauge = PressureGauge(100, high=0.85, low=0.70)
    assert gauge.observe(84) is None
    assert gauge.observe(85) is KvChange.PRESSURE_CROSSED
    assert gauge.observe(90) is None and gauge.observe(71) is None  # between: no flapping
    assert not gauge.relieved(71) and gauge.relieved(70)
    assert gauge.observe(70) is KvChange.PRESSURE_CLEARED
    assert gauge.observe(80) is None
    with pytest.raises(ValueError, match="kv_pressure_low < kv_pressure_high"):
        PressureGauge(100, high=0.5, low=0.7)


def test_kv_geometry_split_and_unified() -> None:
    split = KvGeometry.of(n_ctx=1024, n_ctx_seq=512, n_seq_max=2, lanes=2)
    assert (split.unified, split.tokens_per_lane, split.cells_total) == (False, 512, 1024)
    # Sequences beyond the lanes served are not counted.
    fewer = KvGeometry.of(n_ctx=1024, n_ctx_seq=256, n_seq_max=4, lanes=2)
    assert (fewer.tokens_per_lane, fewer.cells_total) == (256, 512)
    unified = KvGeometry.of(n_ctx=512, n_ctx_seq=512, n_seq_max=2, lanes=2)
    assert (unified.unified, unified.tokens_per_lane, unified.cells_total) == (True, 256, 512)
    single = KvGeometry.of(n_ctx=256, n_ctx_seq=256, n_seq_max=1, lanes=1)
    assert (single.unified, single.tokens_per_lane) == (False, 256)
