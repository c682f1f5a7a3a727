"""`BatchReducer.reduce_pressure_run` is `reduce` for each of a run of one model's KV pressure
events: the same states, transitions and counters, for any stream around the runs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event, summaries
from skippyctl.reducer import resources
from skippyctl.reducer.reduce import BatchReducer, Transitions
from skippyctl.reducer.resources import KV_PRESSURE_EVENTS
from skippyctl.reducer.state import RuntimeView
from tests.reducer.test_batch import (
    _SETUP,
    _STREAM,
    DEVICES,
    MODELS,
    _deterministic_clock,
    _per_event,
    _plain,
    _without_recent,
)

_RUN_MODELS = [*MODELS, LogicalId("unknown")]


@st.composite
def _pressure_run(draw: st.DrawFn) -> list[Event]:
    """One model's crossings and clearings in any order (repeats included), some with the
    cells in use."""
    model = draw(st.sampled_from(_RUN_MODELS))
    ids = draw(st.lists(st.sampled_from(sorted(KV_PRESSURE_EVENTS)), min_size=1, max_size=40))
    used = st.one_of(st.none(), st.integers(0, 4096))
    return [
        make_event(i, scope=Scope(model_id=model), summaries=summaries(kv_cells_used=draw(used)))
        for i in ids
    ]


_DEVICE_PRESSURE = [
    make_event(EventId.BACKEND_DEVICE_SELECTED, scope=Scope(model_id=MODELS[0], device_id=d))
    for d in DEVICES
] + [
    make_event(EventId.MEMORY_PRESSURE_CROSSED, scope=Scope(model_id=MODELS[0], device_id=d))
    for d in DEVICES
]
_CHUNKS = st.lists(
    st.one_of(_STREAM, _pressure_run(), _pressure_run(), st.just(_DEVICE_PRESSURE)), max_size=8
)


def _runs(events: list[Event]) -> list[tuple[bool, list[Event]]]:
    """The stream cut as the pipeline cuts it: (is a pressure run, events)."""

    def key(event: Event) -> object:
        return event.scope.model_id if event.id in KV_PRESSURE_EVENTS else object()

    return [
        (len(group) > 1 and group[0].id in KV_PRESSURE_EVENTS, group)
        for group in (list(g) for _, g in itertools.groupby(events, key))
    ]


def _by_runs(
    events: list[Event], cuts: set[int]
) -> tuple[RuntimeView, list[Transitions], list[object]]:
    """Runs through `reduce_pressure_run`, the rest through `reduce`; published at `cuts`
    (between chunks) and after each run; a copy of the working state after each chunk (it
    changes in place)."""
    batch = BatchReducer(RuntimeView())
    transitions: list[Transitions] = []
    states: list[object] = []
    for index, (is_run, group) in enumerate(_runs(events)):
        if is_run and group[0].scope.model_id is not None:
            transitions.extend(batch.reduce_pressure_run(group))
        else:
            for event in group:
                transitions.append(batch.reduce(event)[1])
        states.append(_plain(_without_recent(batch.state)))
        if index in cuts:
            batch.publish()
    return batch.publish(), transitions, states


@settings(max_examples=300, deadline=None)
@given(_CHUNKS, st.sets(st.integers(0, 40), max_size=6))
def test_a_pressure_run_reduces_to_the_states_and_transitions_of_one_event_at_a_time(
    chunks: list[list[Event]], cuts: set[int]
) -> None:
    events = _SETUP + [e for chunk in chunks for e in chunk]
    with _deterministic_clock():
        expected, expected_transitions, expected_states = _per_event(events)
    with _deterministic_clock():
        published, transitions, states = _by_runs(events, cuts)
    assert published == expected
    assert transitions == expected_transitions
    ends = list(itertools.accumulate(len(group) for _, group in _runs(events)))
    for state, end in zip(states, ends, strict=True):
        # What the warning deriver reads after each run is the per-event state.
        assert state == _plain(_without_recent(expected_states[end - 1]))


def test_a_flapping_run_flips_the_node_pressure_with_every_fact_and_counts_repeats() -> None:
    model = Scope(model_id=MODELS[0])
    ids = [EventId.CACHE_PRESSURE_CROSSED, EventId.CACHE_PRESSURE_CROSSED]
    ids += [EventId.CACHE_PRESSURE_CLEARED, EventId.CACHE_PRESSURE_CROSSED] * 50
    run = [
        make_event(i, scope=model, summaries=summaries(kv_cells_used=n)) for n, i in enumerate(ids)
    ]
    batch = BatchReducer(RuntimeView())
    for event in _SETUP:
        batch.reduce(event)
    before = batch.publish()
    out = batch.reduce_pressure_run(run)
    state = batch.publish()
    changes = [t[0].state.current for t in out if t and t[0].state]
    assert changes == ["pressure"] + ["normal", "pressure"] * 50
    assert out[1] == ()  # the repeated crossing
    assert state.counters.duplicate_transitions == before.counters.duplicate_transitions + 1
    assert state.models[MODELS[0]].kv.pressure and state.node_pressure
    assert state.models[MODELS[0]].kv.cells_used == len(ids) - 1


def test_a_run_that_is_not_one_models_kv_pressure_is_refused() -> None:
    batch = BatchReducer(RuntimeView())
    crossed = make_event(EventId.CACHE_PRESSURE_CROSSED, scope=Scope(model_id=MODELS[0]))
    other = make_event(EventId.CACHE_PRESSURE_CLEARED, scope=Scope(model_id=MODELS[1]))
    exhausted = make_event(EventId.CONTEXT_EXHAUSTED, scope=Scope(model_id=MODELS[0]))
    for run in ([], [crossed, other], [crossed, exhausted], [make_event(crossed.id)]):
        with pytest.raises(ValueError, match="pressure run"):
            batch.reduce_pressure_run(run)
    assert not batch.pending


def test_a_run_that_raises_leaves_the_batch_as_if_it_never_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A defect inside the fold (made here: the real fold cannot fail on valid events)."""
    model = Scope(model_id=MODELS[0])
    flapping = [
        make_event(i, scope=model)
        for i in [EventId.CACHE_PRESSURE_CROSSED, EventId.CACHE_PRESSURE_CLEARED] * 4
    ]
    batch = BatchReducer(RuntimeView())
    for event in _SETUP + flapping[:3]:
        batch.reduce(event)

    calls = itertools.count(1)
    real = resources.pressure_state

    def broken_once_in_the_fold(flag: bool) -> resources.Pressure:
        # The first call is the run's first event, reduced as `reduce` does; the second is the
        # fold's. Only that one fails: reducing the batch again calls it too.
        if next(calls) == 2:
            raise RuntimeError("a defect")
        return real(flag)

    monkeypatch.setattr(resources, "pressure_state", broken_once_in_the_fold)
    with pytest.raises(RuntimeError, match="a defect"):
        batch.reduce_pressure_run(flapping[3:])
    assert next(calls) > 3  # the batch was reduced again
    batch.reduce_pressure_run(flapping[3:])
    expected, _, _ = _per_event(_SETUP + flapping)
    state = batch.publish()
    assert _without_recent(state) == _without_recent(expected)
    assert [e.id for e in state.recent_events] == [e.id for e in expected.recent_events]
