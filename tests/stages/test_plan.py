"""The layer plan: pure functions, table-driven and property-based."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.config.endpoints import MAX_STAGES
from skippyctl.stages.plan import (
    STAGE_RESERVE_BYTES,
    PlanRefused,
    device_of_layer,
    plan_layers,
    tensor_split,
)

MIB = 2**20


def test_layers_follow_the_offered_memory_and_the_output_goes_with_the_last_stage() -> None:
    plan = plan_layers(12, 13 * MIB, [3 * 2**30, 1 * 2**30])
    assert [(s.layer_start, s.layer_count) for s in plan.shares] == [(0, 9), (9, 3)]
    assert [s.output_layer for s in plan.shares] == [False, True]
    assert [s.planned_bytes for s in plan.shares] == [9 * MIB, 4 * MIB]
    assert plan.fits


def test_a_stage_that_offers_less_than_its_share_plus_the_reserve_does_not_fit() -> None:
    plan = plan_layers(2, 435_744, [MIB, MIB])
    assert not plan.fits
    assert all(s.needed_bytes > STAGE_RESERVE_BYTES for s in plan.shares)


def test_more_stages_than_layers_or_no_memory_cannot_be_planned() -> None:
    with pytest.raises(PlanRefused):
        plan_layers(2, MIB, [MIB, MIB, MIB])
    with pytest.raises(PlanRefused):
        plan_layers(2, MIB, [MIB, 0])


@given(
    n_layer=st.integers(1, 200),
    offered=st.lists(st.integers(1, 2**40), min_size=1, max_size=MAX_STAGES),
)
def test_llama_cpp_places_exactly_the_planned_ranges(n_layer: int, offered: list[int]) -> None:
    if len(offered) > n_layer:
        return
    plan = plan_layers(n_layer, 10**9, offered)
    shares = plan.shares
    assert sum(s.layer_count for s in shares) == n_layer and all(s.layer_count >= 1 for s in shares)
    assert [s.layer_start for s in shares] == [
        sum(x.layer_count for x in shares[:i]) for i in range(len(shares))
    ]
    split = tensor_split(plan)
    for index, share in enumerate(shares):
        for layer in range(share.layer_start, share.layer_end):
            assert device_of_layer(split, n_layer, layer) == index
    assert device_of_layer(split, n_layer, n_layer) == len(shares) - 1  # the output layer
