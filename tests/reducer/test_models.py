"""Model availability: the transition table, readiness gating, and invariants under any sequence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Progress,
    Scope,
    SummaryKey,
    make_event,
    summaries,
)
from skippyctl.events.reasons import ProgressUnit, ReasonCode
from skippyctl.reducer.reduce import NODE_EVENTS, reduce
from skippyctl.reducer.state import MAX_MODELS, ModelState, RuntimeView

MODEL = LogicalId("tiny")
OP = LogicalId("load-1")


def _event(event_id: EventId, model: LogicalId = MODEL, op: LogicalId = OP, **kw: object) -> Event:
    return make_event(event_id, operation_id=op, scope=Scope(model_id=model), **kw)  # type: ignore[arg-type]  # test helper forwards typed keywords


def _run(events: list[Event], state: RuntimeView | None = None) -> tuple[RuntimeView, list[Event]]:
    state = state or RuntimeView()
    emitted: list[Event] = []
    for event in events:
        state, transitions = reduce(state, event)
        emitted.extend(transitions)
    return state, emitted


HAPPY_PATH = [
    EventId.MODEL_LOAD_REQUESTED,
    EventId.MODEL_LOAD_STARTED,
    EventId.BACKEND_DEVICE_SELECTED,
    EventId.NATIVE_MODEL_LOAD_COMPLETED,
    EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
    EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
]


def test_happy_path_emits_native_loaded_then_available() -> None:
    state, emitted = _run([_event(e) for e in HAPPY_PATH])
    assert state.models[MODEL].state is ModelState.AVAILABLE
    model_transitions = [t.id for t in emitted if t.category.value == "model_availability"]
    assert model_transitions == [EventId.NATIVE_MODEL_LOADED, EventId.MODEL_AVAILABLE]
    available = next(t for t in emitted if t.id is EventId.MODEL_AVAILABLE)
    assert available.state is not None
    assert (available.state.previous, available.state.current) == ("initializing", "available")


def test_native_completion_is_not_availability() -> None:
    state, emitted = _run([_event(e) for e in HAPPY_PATH[:4]])
    assert state.models[MODEL].state is ModelState.INITIALIZING
    assert EventId.MODEL_AVAILABLE not in [t.id for t in emitted]


def test_backend_completion_without_native_completion_is_rejected() -> None:
    events = [_event(e) for e in HAPPY_PATH[:2]]
    events.append(_event(EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED))
    state, emitted = _run(events)
    assert state.models[MODEL].state is ModelState.LOADING
    assert EventId.MODEL_AVAILABLE not in [t.id for t in emitted]
    assert state.counters.rejected_transitions == 1


def test_duplicate_transition_is_counted_and_state_unchanged() -> None:
    state, _ = _run([_event(e) for e in HAPPY_PATH])
    again, emitted = reduce(state, _event(EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED))
    assert emitted == ()
    assert again.models == state.models
    assert again.counters.duplicate_transitions == state.counters.duplicate_transitions + 1


def test_progress_is_recorded_and_regressions_ignored() -> None:
    def progress(value: int) -> Event:
        return _event(
            EventId.MODEL_LOAD_PROGRESS, progress=Progress(value, 1000, ProgressUnit.STEPS)
        )

    events = [_event(e) for e in HAPPY_PATH[:2]] + [progress(500), progress(200)]
    state, _ = _run(events)
    view_progress = state.models[MODEL].progress
    assert view_progress is not None and view_progress.current == 500


def test_dropped_progress_still_reaches_available() -> None:
    state, _ = _run([_event(e) for e in HAPPY_PATH if e is not EventId.BACKEND_DEVICE_SELECTED])
    assert state.models[MODEL].state is ModelState.AVAILABLE


def test_failure_settles_and_a_new_load_can_start() -> None:
    events = [_event(e) for e in HAPPY_PATH[:2]]
    events.append(_event(EventId.MODEL_LOAD_FAILED, reason_code=ReasonCode.PROCESS_CRASH))
    state, _ = _run(events)
    assert state.models[MODEL].state is ModelState.FAILED
    assert state.models[MODEL].reason_code is ReasonCode.PROCESS_CRASH
    retry = [_event(e, op=LogicalId("load-2")) for e in HAPPY_PATH]
    state, _ = _run(retry, state)
    assert state.models[MODEL].state is ModelState.AVAILABLE


def test_engine_crash_makes_an_available_model_unavailable() -> None:
    state, _ = _run([_event(e) for e in HAPPY_PATH])
    crash = make_event(
        EventId.ENGINE_PROCESS_CRASHED,
        scope=Scope(model_id=MODEL),
        reason_code=ReasonCode.PROCESS_CRASH,
    )
    state, emitted = reduce(state, crash)
    assert state.models[MODEL].state is ModelState.UNAVAILABLE
    assert EventId.MODEL_UNAVAILABLE in [t.id for t in emitted]


def test_events_of_another_operation_do_not_move_the_model() -> None:
    state, _ = _run([_event(e) for e in HAPPY_PATH[:2]])
    stray = _event(EventId.NATIVE_MODEL_LOAD_COMPLETED, op=LogicalId("load-99"))
    state, emitted = reduce(state, stray)
    assert state.models[MODEL].state is ModelState.LOADING
    assert emitted == ()


_IDS = [
    *HAPPY_PATH,
    EventId.MODEL_LOAD_PROGRESS,
    EventId.MODEL_LOAD_FAILED,
    EventId.MODEL_LOAD_CANCELLED,
    EventId.ENGINE_PROCESS_CRASHED,
    EventId.WARNING_RAISED,
]


@st.composite
def _events(draw: st.DrawFn) -> Event:
    event_id = draw(st.sampled_from(_IDS))
    model = LogicalId(f"m{draw(st.integers(0, MAX_MODELS + 8))}")
    op = LogicalId(f"load-{draw(st.integers(0, 3))}")
    value = draw(st.integers(0, 1000))
    return make_event(
        event_id,
        operation_id=op,
        scope=Scope(model_id=model),
        progress=Progress(value, 1000, ProgressUnit.STEPS)
        if event_id is EventId.MODEL_LOAD_PROGRESS
        else None,
        summaries=summaries(context_tokens=512),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_events(), max_size=400))
def test_any_sequence_keeps_invariants_and_bounds(events: list[Event]) -> None:
    state = RuntimeView()
    for event in events:
        before = state
        state, transitions = reduce(state, event)
        assert len(state.models) <= MAX_MODELS
        for transition in transitions:
            # only the reducer's own availability events come out, each a real state change
            assert transition.id in {
                EventId.NATIVE_MODEL_LOADED,
                EventId.MODEL_AVAILABLE,
                EventId.MODEL_UNAVAILABLE,
                EventId.MODEL_DEGRADED,
                EventId.AVAILABLE_MODEL_SET_CHANGED,
                *NODE_EVENTS.values(),
            }
            assert transition.state is not None
            assert transition.state.previous != transition.state.current
        for model_id, view in state.models.items():
            previous = before.models.get(model_id)
            if view.state is ModelState.AVAILABLE and (
                previous is None or previous.state is not ModelState.AVAILABLE
            ):
                # availability only ever follows initializing (readiness gating)
                assert previous is not None and previous.state is ModelState.INITIALIZING


def _serving_with(context_tokens: int, lanes: int, op: LogicalId) -> list[Event]:
    capacity = summaries(context_tokens=context_tokens, lanes=lanes)
    return [_event(e, op=op, summaries=capacity if e is HAPPY_PATH[-1] else ()) for e in HAPPY_PATH]


def test_a_restart_that_serves_another_capacity_says_so() -> None:
    state, _ = _run(_serving_with(8192, 4, OP))
    crash = make_event(
        EventId.ENGINE_PROCESS_CRASHED,
        scope=Scope(model_id=MODEL),
        reason_code=ReasonCode.PROCESS_CRASH,
    )
    started = make_event(
        EventId.MODEL_RECOVERY_STARTED, scope=Scope(model_id=MODEL), summaries=summaries(attempt=1)
    )
    state, _ = _run([crash, started], state)
    # Less memory free at the restart: the engine planned a smaller context.
    state, emitted = _run(_serving_with(4096, 2, LogicalId("load-2")), state)
    changed = [t for t in emitted if t.id is EventId.MODEL_CAPACITY_CHANGED]
    assert len(changed) == 1
    assert changed[0].summary_value(SummaryKey.CONTEXT_TOKENS) == 4096
    assert changed[0].summary_value(SummaryKey.LANES) == 2
    assert state.models[MODEL].served_capacity is None
    # The same capacity again after the next crash: nothing to say.
    state, _ = _run([crash, started], state)
    state, emitted = _run(_serving_with(4096, 2, LogicalId("load-3")), state)
    assert EventId.MODEL_CAPACITY_CHANGED not in [t.id for t in emitted]
    assert EventId.MODEL_AVAILABLE in [t.id for t in emitted]
