"""`BatchReducer` is `reduce` event by event, with a working copy updated in place per batch."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Progress,
    Scope,
    make_event,
    summaries,
)
from skippyctl.events.reasons import ProgressUnit
from skippyctl.reducer import reduce as reducer
from skippyctl.reducer import serving
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.reduce import BatchReducer, Transitions, reduce
from skippyctl.reducer.serving import REQUEST_MOVES, SESSION_MOVES
from skippyctl.reducer.state import MAX_RECENT_EVENTS, RuntimeView
from tests.reducer.strategies import any_event

MODELS = [LogicalId(f"m{n}") for n in range(3)]
DEVICES = [LogicalId("CPU"), LogicalId("CUDA0")]
IDS = [LogicalId(f"x{n}") for n in range(3)]


class _Clock:
    """A deterministic stand-in for `time` in the envelope: both ways of reducing a stream
    stamp their transitions alike, so states and transitions compare field by field."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def time_ns(self) -> int:
        return next(self._ticks)

    def monotonic_ns(self) -> int:
        return next(self._ticks)


@contextmanager
def _deterministic_clock() -> Iterator[None]:
    with patch("skippyctl.events.envelope.time", _Clock()):
        yield


def _serving(model: LogicalId, lanes: int) -> list[Event]:
    operation = LogicalId(f"load-{model}")
    scope = Scope(model_id=model)
    ids = [
        EventId.MODEL_LOAD_REQUESTED,
        EventId.MODEL_LOAD_STARTED,
        EventId.NATIVE_MODEL_LOAD_COMPLETED,
        EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
    ]
    return [make_event(i, operation_id=operation, scope=scope) for i in ids] + [
        make_event(
            EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
            operation_id=operation,
            scope=scope,
            summaries=summaries(lanes=lanes, kv_cells_total=4096),
        )
    ]


_KV = [
    EventId.CACHE_PRESSURE_CROSSED,
    EventId.CACHE_PRESSURE_CLEARED,
    EventId.KV_CACHE_INITIALIZATION_COMPLETED,
    EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT,
    EventId.CONTEXT_EXHAUSTED,
]
_DEVICE = [
    EventId.BACKEND_DEVICE_SELECTED,
    EventId.MEMORY_PRESSURE_CROSSED,
    EventId.MEMORY_PRESSURE_CLEARED,
    EventId.OUT_OF_MEMORY_CONDITION,
    EventId.DEVICE_DEGRADED,
    EventId.DEVICE_RECOVERED,
]
_LIFECYCLE = [
    EventId.UNLOAD_REQUESTED,
    EventId.UNLOAD_COMPLETED,
    EventId.ENGINE_PROCESS_CRASHED,
    EventId.MODEL_LOAD_REQUESTED,
    EventId.WARNING_RAISED,
    EventId.RUNTIME_STOPPING,
]


@st.composite
def _kv_fact(draw: st.DrawFn) -> Event:
    return make_event(
        draw(st.sampled_from(_KV)),
        scope=Scope(model_id=draw(st.sampled_from(MODELS))),
        summaries=summaries(kv_cells_used=draw(st.one_of(st.none(), st.integers(0, 4096)))),
    )


@st.composite
def _device_fact(draw: st.DrawFn) -> Event:
    return make_event(
        draw(st.sampled_from(_DEVICE)),
        scope=Scope(
            model_id=draw(st.sampled_from(MODELS)), device_id=draw(st.sampled_from(DEVICES))
        ),
        summaries=summaries(memory_free_bytes=draw(st.one_of(st.none(), st.integers(0, 99)))),
    )


@st.composite
def _lifecycle_fact(draw: st.DrawFn) -> Event:
    model = draw(st.sampled_from(MODELS))
    return make_event(
        draw(st.sampled_from(_LIFECYCLE)),
        operation_id=LogicalId(f"load-{model}"),
        scope=Scope(model_id=model),
    )


_SERVING = [
    *SESSION_MOVES.events,
    *REQUEST_MOVES.events,
    EventId.GENERATION_PROGRESS,
    EventId.GENERATION_COMPLETED,
]
_REQUESTS = [LogicalId(f"r{n}") for n in range(4)]
_SESSIONS = [LogicalId(f"s{n}") for n in range(3)]


@st.composite
def _serving_fact(draw: st.DrawFn) -> Event:
    """Request and session events of a few ids, the commonest events of a serving runtime."""
    event_id = draw(st.sampled_from(_SERVING))
    tokens = draw(st.integers(0, 40))
    return make_event(
        event_id,
        scope=Scope(
            model_id=draw(st.sampled_from(MODELS)),
            request_id=draw(st.sampled_from(_REQUESTS)),
            session_id=draw(st.one_of(st.none(), st.sampled_from(_SESSIONS))),
        ),
        progress=Progress(tokens, None, ProgressUnit.TOKENS)
        if event_id is EventId.GENERATION_PROGRESS
        else None,
        summaries=summaries(
            queue_depth=draw(st.one_of(st.none(), st.integers(0, 9))),
            lanes=draw(st.one_of(st.none(), st.integers(0, 4))),
            generated_tokens=tokens,
            spec_proposed_tokens=draw(st.sampled_from([0, 3])),
        ),
    )


_STREAM = st.lists(
    st.one_of(
        _kv_fact(),
        _kv_fact(),
        _device_fact(),
        _lifecycle_fact(),
        _serving_fact(),
        _serving_fact(),
        any_event(IDS + MODELS),
    ),
    max_size=120,
)
_SETUP = [
    make_event(EventId.RUNTIME_INITIALIZED),
    *_serving(MODELS[0], 4),
    *_serving(MODELS[1], 2),
]


def _batches(events: list[Event], cuts: list[int]) -> list[list[Event]]:
    bounds = sorted({0, len(events), *(c % (len(events) + 1) for c in cuts)})
    return [events[a:b] for a, b in itertools.pairwise(bounds)]


def _per_event(events: list[Event]) -> tuple[RuntimeView, list[Transitions], list[RuntimeView]]:
    state = RuntimeView()
    transitions: list[Transitions] = []
    states: list[RuntimeView] = []
    for event in events:
        state, out = reduce(state, event)
        transitions.append(out)
        states.append(state)
    return state, transitions, states


def _without_recent(state: RuntimeView) -> RuntimeView:
    """What a working copy holds before `publish` catches the recent list up."""
    return evolve(state, recent_events=(), counters=evolve(state.counters, evicted_recent=0))


@settings(max_examples=200, deadline=None)
@given(_STREAM, st.lists(st.integers(0, 200), max_size=6))
def test_a_batch_reduces_to_the_state_and_transitions_of_one_event_at_a_time(
    stream: list[Event], cuts: list[int]
) -> None:
    events = _SETUP + stream
    with _deterministic_clock():
        expected, expected_transitions, expected_states = _per_event(events)
    with _deterministic_clock():
        batch = BatchReducer(RuntimeView())
        transitions: list[Transitions] = []
        position = 0
        for part in _batches(events, cuts):
            for event in part:
                working, out = batch.reduce(event)
                transitions.append(out)
                # What the warning deriver reads after each event is today's state.
                assert _without_recent(working) == _without_recent(expected_states[position])
                position += 1
            published = batch.publish()
            assert published == expected_states[position - 1]
    assert published == expected
    assert transitions == expected_transitions
    assert len(published.recent_events) <= MAX_RECENT_EVENTS


@settings(max_examples=100, deadline=None)
@given(st.lists(_serving_fact(), max_size=120), st.lists(st.integers(0, 200), max_size=6))
def test_full_request_and_session_tables_evict_alike_in_a_batch(
    stream: list[Event], cuts: list[int]
) -> None:
    """With room for two of each, the bounded maps evict (in place within a batch)."""
    events = _SETUP + stream
    with (
        patch.object(serving, "MAX_REQUESTS", 2),
        patch.object(serving, "MAX_SESSIONS", 2),
    ):
        with _deterministic_clock():
            expected, expected_transitions, _ = _per_event(events)
        with _deterministic_clock():
            batch = BatchReducer(RuntimeView())
            transitions = []
            for part in _batches(events, cuts):
                transitions.extend(batch.reduce(event)[1] for event in part)
                published = batch.publish()
    assert published == expected
    assert transitions == expected_transitions


def _plain(value: Any) -> Any:
    """A deep, mutation-proof copy of a state for comparison (mapping proxies don't deepcopy)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value),
            tuple(_plain(getattr(value, f.name)) for f in dataclasses.fields(value)),
        )
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple | frozenset):
        return type(value)(_plain(item) for item in value)
    return value


@settings(max_examples=100, deadline=None)
@given(_STREAM, _STREAM)
def test_a_published_snapshot_is_never_written_by_a_later_batch(
    first: list[Event], later: list[Event]
) -> None:
    batch = BatchReducer(RuntimeView())
    for event in _SETUP + first:
        batch.reduce(event)
    snapshot = batch.publish()
    copy = _plain(snapshot)
    for event in later:
        batch.reduce(event)
    batch.publish()
    for event in later:
        batch.reduce(event)
    assert _plain(snapshot) == copy


def _flapping(model: LogicalId, facts: int) -> list[Event]:
    ids = itertools.cycle([EventId.CACHE_PRESSURE_CROSSED, EventId.CACHE_PRESSURE_CLEARED])
    return [make_event(next(ids), scope=Scope(model_id=model)) for _ in range(facts)]


def test_a_batch_copies_the_views_once_and_updates_its_copies_in_place() -> None:
    batch = BatchReducer(RuntimeView())
    for event in _SETUP:
        batch.reduce(event)
    published = batch.publish()
    first, out = batch.reduce(_flapping(MODELS[0], 1)[0])
    assert [e.id for e in out] == [EventId.NODE_RESOURCE_PRESSURE_CHANGED]
    model = first.models[MODELS[0]]
    assert first is not published and model is not published.models[MODELS[0]]
    second, out = batch.reduce(make_event(EventId.CACHE_PRESSURE_CLEARED, scope=model_scope()))
    # The same objects, updated: and still announced as a change of the node's pressure.
    assert second is first and second.models[MODELS[0]] is model
    assert [e.state.current for e in out if e.state] == ["normal"]
    assert not published.models[MODELS[0]].kv.pressure  # the snapshot did not move
    assert batch.publish().models[MODELS[0]] is model  # published as it is, not copied


def model_scope() -> Scope:
    return Scope(model_id=MODELS[0])


def test_the_recent_list_is_capped_once_per_batch_with_every_eviction_counted() -> None:
    events = _SETUP + _flapping(MODELS[0], 3 * MAX_RECENT_EVENTS)
    expected, _, _ = _per_event(events)
    batch = BatchReducer(RuntimeView())
    for event in events:
        batch.reduce(event)
    state = batch.publish()
    assert state.counters.evicted_recent == expected.counters.evicted_recent > 0
    assert [e.id for e in state.recent_events] == [e.id for e in expected.recent_events]
    assert len(state.recent_events) == MAX_RECENT_EVENTS


def test_a_handler_that_raises_leaves_the_batch_as_if_its_event_never_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(state: RuntimeView, event: Event) -> tuple[RuntimeView, Transitions]:
        reducer._HANDLERS[EventId.CACHE_PRESSURE_CROSSED](state, event)  # half an update
        raise RuntimeError("a defect")

    flapping = _flapping(MODELS[0], 4)
    batch = BatchReducer(RuntimeView())
    for event in _SETUP + flapping[:3]:
        batch.reduce(event)
    monkeypatch.setitem(reducer._HANDLERS, EventId.CONTEXT_EXHAUSTED, broken)
    with pytest.raises(RuntimeError, match="a defect"):
        batch.reduce(make_event(EventId.CONTEXT_EXHAUSTED, scope=model_scope()))
    batch.reduce(flapping[3])
    expected, _, _ = _per_event(_SETUP + flapping)
    state = batch.publish()
    assert _without_recent(state) == _without_recent(expected)
    assert [e.id for e in state.recent_events] == [e.id for e in expected.recent_events]
