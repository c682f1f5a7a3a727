"""`evolve` is `dataclasses.replace` for the reducer's frozen slotted dataclasses."""

from __future__ import annotations

import dataclasses

import pytest

from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.state import NodeState, ReducerCounters, RuntimeView


def test_evolve_copies_every_field_and_changes_only_the_named_ones() -> None:
    before = RuntimeView(counters=ReducerCounters(rejected_transitions=3))
    after = evolve(before, node=NodeState.ACCEPTING)
    assert after is not before
    assert after == dataclasses.replace(before, node=NodeState.ACCEPTING)
    assert before.node is NodeState.STARTING  # the original is untouched
    assert after.counters is before.counters


def test_evolve_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match="no field"):
        evolve(ReducerCounters(), rejected=1)


def test_evolve_refuses_a_dataclass_with_post_init() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="__post_init__"):
        evolve(Checked(1), value=-1)
