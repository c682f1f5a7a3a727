"""Lanes and context per lane for a load (engine/geometry.py): pure rules, no llama.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippyctl.engine.geometry import (
    AUTO_LANES,
    CELL_PADDING_TOKENS,
    ContextPlan,
    available_memory_bytes,
    kv_bytes_per_token,
    plan_context,
)

GIB = 1 << 30
PLENTY = 64 * GIB


def plan(
    lanes: int | None = None,
    ctx: int | None = None,
    train: int = 32768,
    kv: int = 32 * 1024,
    free: int | None = PLENTY,
) -> ContextPlan:
    return plan_context(
        lanes=lanes,
        context_tokens=ctx,
        train_tokens=train,
        kv_bytes_per_token=kv,
        free_memory_bytes=free,
    )


def test_without_flags_four_lanes_get_the_training_context_each_at_most_4096() -> None:
    assert plan() == ContextPlan(4, 4 * 4096, lanes_auto=True, context_auto=True)
    assert plan(train=2048) == ContextPlan(4, 4 * 2048, lanes_auto=True, context_auto=True)
    assert plan(train=0).tokens_per_lane == 4096  # unknown training context
    assert AUTO_LANES == 4


def test_explicit_lanes_keep_the_per_lane_context() -> None:
    assert plan(lanes=1) == ContextPlan(1, 4096, lanes_auto=False, context_auto=True)
    assert plan(lanes=3, train=1024) == ContextPlan(3, 3072, lanes_auto=False, context_auto=True)


@pytest.mark.parametrize(
    ("ctx", "lanes"), [(256, 1), (1023, 1), (1024, 1), (2048, 2), (3500, 3), (4096, 4), (65536, 4)]
)
def test_an_explicit_context_is_the_whole_context_and_keeps_1024_tokens_a_lane(
    ctx: int, lanes: int
) -> None:
    result = plan(ctx=ctx)
    assert (result.lanes, result.context_tokens, result.lanes_auto) == (lanes, ctx, True)
    assert not result.context_auto


def test_both_given_is_taken_as_given() -> None:
    assert plan(lanes=8, ctx=512) == ContextPlan(8, 512, lanes_auto=False, context_auto=False)
    assert plan(lanes=8, ctx=512).tokens_per_lane == 64


def test_the_kv_cache_is_capped_to_half_the_free_memory_in_whole_padding_cells() -> None:
    kv = 512 * 1024  # 0.5 MiB a token
    # Half of 4 GiB holds 4096 tokens: 4 lanes of 1024.
    capped = plan(kv=kv, free=4 * GIB)
    assert capped == ContextPlan(4, 4096, lanes_auto=True, context_auto=True, memory_capped=True)
    assert capped.tokens_per_lane % CELL_PADDING_TOKENS == 0
    # Never under one padding cell a lane, however little is free.
    assert plan(kv=kv, free=1).tokens_per_lane == CELL_PADDING_TOKENS
    # Enough memory: no cap, and an unknown amount of free memory caps nothing.
    assert not plan(kv=kv, free=64 * GIB).memory_capped
    assert plan(kv=kv, free=None) == plan(kv=kv, free=PLENTY)


def test_an_explicit_context_is_never_capped() -> None:
    assert plan(ctx=65536, kv=512 * 1024, free=GIB).context_tokens == 65536


def test_nonsense_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="lanes"):
        plan(lanes=0)
    with pytest.raises(ValueError, match="context_tokens"):
        plan(ctx=0)


def test_kv_bytes_per_token_counts_keys_and_values_of_the_kv_heads() -> None:
    # 8 layers, 1024 wide, 16 heads of 64, 4 KV heads (grouped-query attention), f16.
    assert kv_bytes_per_token(layers=8, embedding=1024, heads=16, kv_heads=4) == 2 * 8 * 4 * 64 * 2
    assert kv_bytes_per_token(layers=0, embedding=1024, heads=16, kv_heads=4) == 0


def test_available_memory_reads_memavailable(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 50 kB\n")
    assert available_memory_bytes(meminfo) == 50 * 1024
    meminfo.write_text("MemTotal: 100 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "missing") is None
    assert (available_memory_bytes() or 0) > 0  # this machine's
