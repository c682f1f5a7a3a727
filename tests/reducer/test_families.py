"""Reducer families beyond loading: topology, sessions, requests, KV, devices, node, health."""

from __future__ import annotations

import pytest
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
from skippyctl.reducer.common import reject
from skippyctl.reducer.node import derive_node
from skippyctl.reducer.reduce import FAMILIES, merge_handlers, reduce
from skippyctl.reducer.state import (
    MAX_RECENT_EVENTS,
    MAX_SESSIONS,
    ModelState,
    NodeState,
    RequestState,
    RuntimeView,
    SessionState,
    StageState,
    lanes_in_use,
    queue_depth,
)
from tests.reducer.strategies import any_event

TINY = LogicalId("tiny")
BIG = LogicalId("big")
TOPO = LogicalId("topo-1")


def _run(events: list[Event], state: RuntimeView | None = None) -> tuple[RuntimeView, list[Event]]:
    state = state or RuntimeView()
    emitted: list[Event] = []
    for event in events:
        state, transitions = reduce(state, event)
        emitted.extend(transitions)
    return state, emitted


def _load(model: LogicalId, op: str, topology: LogicalId | None = None) -> list[Event]:
    operation = LogicalId(op)
    scope = Scope(model_id=model, topology_id=topology)
    ids = [
        EventId.MODEL_LOAD_REQUESTED,
        EventId.MODEL_LOAD_STARTED,
        EventId.NATIVE_MODEL_LOAD_COMPLETED,
        EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
        EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
    ]
    return [make_event(i, operation_id=operation, scope=scope) for i in ids]


def _stage(event_id: EventId, stage: str, index: int = 0) -> Event:
    return make_event(
        event_id, scope=Scope(stage_id=LogicalId(stage), topology_id=TOPO, stage_index=index)
    )


def _topology(event_id: EventId) -> Event:
    return make_event(event_id, scope=Scope(topology_id=TOPO, model_id=BIG))


RUNNING = [make_event(EventId.RUNTIME_INITIALIZED)]


def test_node_is_starting_while_a_model_loads_never_unavailable() -> None:
    idle, _ = _run(RUNNING)
    assert idle.node is NodeState.UNAVAILABLE  # running, nothing loaded: nothing can be served
    state, emitted = _run(_load(TINY, "load-1")[:3], idle)
    assert state.models[TINY].state is ModelState.INITIALIZING
    assert state.node is NodeState.STARTING
    assert EventId.NODE_UNAVAILABLE not in [e.id for e in emitted]


def test_node_accepts_once_a_model_is_available_and_announces_the_model_set() -> None:
    state, emitted = _run(RUNNING + _load(TINY, "load-1"))
    assert state.node is NodeState.ACCEPTING
    ids = [e.id for e in emitted]
    assert EventId.NODE_ACCEPTING_REQUESTS in ids
    assert EventId.AVAILABLE_MODEL_SET_CHANGED in ids


def test_topology_gates_availability_until_every_stage_is_ready() -> None:
    events = RUNNING + [_topology(EventId.TOPOLOGY_ASSEMBLING)]
    events += [_stage(EventId.STAGE_STARTING, "s0"), _stage(EventId.STAGE_STARTING, "s1", 1)]
    events += _load(BIG, "load-2", TOPO)
    state, _ = _run(events)
    assert state.models[BIG].state is ModelState.INITIALIZING
    assert state.models[BIG].backend_ready
    events = [_stage(EventId.STAGE_READY, "s0"), _stage(EventId.STAGE_READY, "s1", 1)]
    events.append(_topology(EventId.TOPOLOGY_READY))
    state, emitted = _run(events, state)
    assert state.models[BIG].state is ModelState.AVAILABLE
    assert EventId.MODEL_AVAILABLE in [e.id for e in emitted]
    assert state.node is NodeState.ACCEPTING


def test_a_topology_degraded_before_its_backend_completes_serves_degraded() -> None:
    """The host's topology events can be reduced before the engine's context return: a
    degraded topology (a slow link found at once) must not hold the model back."""
    events = RUNNING + [_topology(EventId.TOPOLOGY_ASSEMBLING), _stage(EventId.STAGE_READY, "s0")]
    events += [_topology(EventId.TOPOLOGY_READY), _topology(EventId.TOPOLOGY_DEGRADED)]
    events += _load(BIG, "load-2", TOPO)  # ends with serving_backend_initialization_completed
    state, emitted = _run(events)
    assert state.models[BIG].state is ModelState.DEGRADED
    ids = [e.id for e in emitted]
    assert ids.index(EventId.MODEL_AVAILABLE) < ids.index(EventId.MODEL_DEGRADED)
    state, emitted = _run([_topology(EventId.TOPOLOGY_READY)], state)
    assert state.models[BIG].state is ModelState.AVAILABLE


def test_stage_degradation_and_recovery_project_onto_the_model_and_node() -> None:
    events = RUNNING + [_topology(EventId.TOPOLOGY_ASSEMBLING), _stage(EventId.STAGE_READY, "s0")]
    events += _load(BIG, "load-2", TOPO) + [_topology(EventId.TOPOLOGY_READY)]
    state, _ = _run(events)
    lost = make_event(
        EventId.DOWNSTREAM_CONNECTION_LOST, scope=Scope(stage_id=LogicalId("s0"), topology_id=TOPO)
    )
    state, emitted = _run([lost, _topology(EventId.TOPOLOGY_DEGRADED)], state)
    assert state.stages[LogicalId("s0")].state is StageState.DEGRADED
    assert state.models[BIG].state is ModelState.DEGRADED
    assert state.node is NodeState.DEGRADED
    assert EventId.MODEL_DEGRADED in [e.id for e in emitted]
    recovered = make_event(
        EventId.DOWNSTREAM_CONNECTION_RECOVERED,
        scope=Scope(stage_id=LogicalId("s0"), topology_id=TOPO),
    )
    state, emitted = _run([recovered, _topology(EventId.TOPOLOGY_READY)], state)
    assert state.stages[LogicalId("s0")].state is StageState.READY
    assert state.models[BIG].state is ModelState.AVAILABLE
    assert state.node is NodeState.ACCEPTING


def test_node_availability_derives_from_several_models() -> None:
    events = RUNNING + [_topology(EventId.TOPOLOGY_ASSEMBLING), _stage(EventId.STAGE_READY, "s0")]
    events += _load(TINY, "load-1") + _load(BIG, "load-2", TOPO)
    events.append(_topology(EventId.TOPOLOGY_READY))
    state, _ = _run(events)
    assert state.node is NodeState.ACCEPTING
    state, _ = _run([_topology(EventId.TOPOLOGY_UNAVAILABLE)], state)
    assert state.models[BIG].state is ModelState.UNAVAILABLE
    assert state.node is NodeState.ACCEPTING  # tiny still serves
    crash = make_event(
        EventId.ENGINE_PROCESS_CRASHED,
        scope=Scope(model_id=TINY),
        reason_code=ReasonCode.PROCESS_CRASH,
    )
    state, emitted = _run([crash], state)
    assert state.node is NodeState.UNAVAILABLE
    assert EventId.NODE_UNAVAILABLE in [e.id for e in emitted]
    state, _ = _run([make_event(EventId.RUNTIME_STOPPING)], state)
    assert state.node is NodeState.DRAINING
    state, _ = _run([make_event(EventId.RUNTIME_STOPPED)], state)
    assert state.node is NodeState.STOPPED


def _request(event_id: EventId, request: str, **values: int | float) -> Event:
    return make_event(
        event_id,
        scope=Scope(model_id=TINY, request_id=LogicalId(request), session_id=LogicalId("s-1")),
        summaries=summaries(**values),
    )


def test_requests_move_through_admission_and_capacity_is_derived() -> None:
    state, _ = _run(RUNNING + _load(TINY, "load-1"))
    events = [
        _request(EventId.REQUEST_RECEIVED, "r1"),
        _request(EventId.REQUEST_QUEUED, "r1", queue_depth=1),
        _request(EventId.REQUEST_RECEIVED, "r2"),
        _request(EventId.REQUEST_QUEUED, "r2", queue_depth=2),
        _request(EventId.REQUEST_ADMITTED, "r1", queue_wait_ms=3.5),
        _request(EventId.PREFILL_STARTED, "r1"),
        _request(EventId.FIRST_TOKEN_PRODUCED, "r1", time_to_first_token_ms=12.0),
    ]
    state, _ = _run(events, state)
    assert state.requests[LogicalId("r1")].state is RequestState.DECODE
    assert state.requests[LogicalId("r1")].time_to_first_token_ms == 12.0
    assert queue_depth(state, TINY) == 1
    assert lanes_in_use(state, TINY) == 1
    regress, _ = reduce(state, _request(EventId.REQUEST_QUEUED, "r1"))
    assert regress.requests[LogicalId("r1")].state is RequestState.DECODE
    assert regress.counters.rejected_transitions == state.counters.rejected_transitions + 1
    done = _request(EventId.REQUEST_COMPLETED, "r1")
    state, _ = _run([done], state)
    assert LogicalId("r1") not in state.requests
    assert state.recent_requests[-1].event_id == "request_completed"
    assert state.models[TINY].completed_requests == 1
    assert lanes_in_use(state, TINY) == 0


def test_generation_progress_ignores_regressions() -> None:
    state, _ = _run([_request(EventId.REQUEST_RECEIVED, "r1")])
    progress = [
        make_event(
            EventId.GENERATION_PROGRESS,
            scope=Scope(request_id=LogicalId("r1")),
            progress=Progress(value, None, ProgressUnit.TOKENS),
        )
        for value in (10, 5, 20)
    ]
    state, _ = _run(progress, state)
    assert state.requests[LogicalId("r1")].generated_tokens == 20
    assert state.counters.duplicate_transitions == 1


def _session(event_id: EventId, session: str, **values: int) -> Event:
    return make_event(
        event_id,
        scope=Scope(model_id=TINY, session_id=LogicalId(session)),
        summaries=summaries(**values),
    )


def test_session_lifecycle_and_bounded_table() -> None:
    state, _ = _run([_session(EventId.SESSION_CREATED, "s-1", lanes=2)])
    assert state.sessions[LogicalId("s-1")].state is SessionState.IDLE
    assert state.sessions[LogicalId("s-1")].lane == 2
    state, _ = _run(
        [_session(EventId.SESSION_ACTIVE, "s-1"), _session(EventId.SESSION_TRIMMED, "s-1")], state
    )
    assert state.sessions[LogicalId("s-1")].trimmed == 1
    state, _ = _run([_session(EventId.SESSION_CLOSED, "s-1")], state)
    assert LogicalId("s-1") not in state.sessions
    many = [_session(EventId.SESSION_CREATED, f"s-{n}") for n in range(MAX_SESSIONS + 10)]
    state, _ = _run(many, state)
    assert len(state.sessions) == MAX_SESSIONS
    assert state.counters.evicted_sessions == 10


def test_kv_pressure_crossing_is_tracked_and_repeats_are_duplicates() -> None:
    state, _ = _run(RUNNING + _load(TINY, "load-1"))
    kv = [
        make_event(
            EventId.KV_CACHE_INITIALIZATION_COMPLETED,
            scope=Scope(model_id=TINY),
            summaries=summaries(kv_cells_total=4096),
        ),
        make_event(
            EventId.CACHE_PRESSURE_CROSSED,
            scope=Scope(model_id=TINY),
            summaries=summaries(kv_cells_used=3900),
        ),
        make_event(EventId.CACHE_PRESSURE_CROSSED, scope=Scope(model_id=TINY)),
        make_event(EventId.CONTEXT_EXHAUSTED, scope=Scope(model_id=TINY)),
    ]
    state, _ = _run(kv, state)
    view = state.models[TINY].kv
    assert (view.cells_total, view.cells_used, view.pressure, view.exhausted) == (
        4096,
        3900,
        True,
        1,
    )
    assert state.counters.duplicate_transitions >= 1
    state, _ = _run([make_event(EventId.CACHE_PRESSURE_CLEARED, scope=Scope(model_id=TINY))], state)
    assert not state.models[TINY].kv.pressure


def test_device_loss_degrades_the_node_and_recovery_restores_it() -> None:
    state, _ = _run(RUNNING + _load(TINY, "load-1"))
    gpu = Scope(device_id=LogicalId("CUDA0"))
    state, _ = _run([make_event(EventId.DEVICE_READY, scope=gpu)], state)
    assert state.node is NodeState.ACCEPTING
    state, _ = _run([make_event(EventId.DEVICE_LOST, scope=gpu)], state)
    assert state.node is NodeState.DEGRADED
    state, _ = _run(
        [
            make_event(EventId.MEMORY_PRESSURE_CROSSED, scope=gpu),
            make_event(EventId.DEVICE_RECOVERED, scope=gpu),
        ],
        state,
    )
    assert state.devices[LogicalId("CUDA0")].memory_pressure
    assert state.node is NodeState.ACCEPTING


def test_unload_and_forced_cleanup() -> None:
    state, _ = _run(RUNNING + _load(TINY, "load-1"))
    scope = Scope(model_id=TINY)
    events = [
        make_event(EventId.UNLOAD_REQUESTED, operation_id=LogicalId("unload-1"), scope=scope),
        make_event(EventId.FORCED_UNLOAD, scope=scope, summaries=summaries(cancelled_requests=2)),
        make_event(EventId.UNLOAD_COMPLETED, operation_id=LogicalId("unload-1"), scope=scope),
    ]
    state, emitted = _run(events, state)
    assert state.models[TINY].state is ModelState.UNLOADED
    assert state.node is NodeState.UNAVAILABLE
    again, _ = reduce(state, _load(TINY, "load-3")[0])
    assert again.models[TINY].state is ModelState.REQUESTED


def test_an_idle_timer_says_when_the_model_unloads_and_the_unload_says_why() -> None:
    state, _ = _run(RUNNING + _load(TINY, "load-1"))
    scope = Scope(model_id=TINY)
    started = make_event(
        EventId.MODEL_IDLE_TIMER_STARTED,
        scope=scope,
        summaries=summaries(idle_ttl_ms=30_000),
        wall_ns=1_000_000_000,
    )
    state, _ = _run([started], state)
    assert state.models[TINY].idle_ttl_ms == 30_000
    assert state.models[TINY].idle_expires_wall_ns == 31_000_000_000
    state, _ = _run([make_event(EventId.MODEL_IDLE_TIMER_CLEARED, scope=scope)], state)
    assert state.models[TINY].idle_expires_wall_ns is None
    state, _ = _run([started], state)
    unload = LogicalId("unload-1")
    idle = ReasonCode.IDLE
    events = [
        make_event(EventId.UNLOAD_REQUESTED, operation_id=unload, scope=scope, reason_code=idle),
        make_event(EventId.UNLOAD_COMPLETED, operation_id=unload, scope=scope, reason_code=idle),
    ]
    state, _ = _run(events, state)
    model = state.models[TINY]
    assert model.state is ModelState.UNLOADED and model.reason_code is ReasonCode.IDLE
    assert model.idle_expires_wall_ns is None
    # A timer for a model that does not serve is out of place.
    after, _ = reduce(state, started)
    assert after.counters.rejected_transitions == state.counters.rejected_transitions + 1
    # A new load starts afresh: no reason, no timer.
    again, _ = reduce(state, _load(TINY, "load-2")[0])
    assert again.models[TINY].reason_code is None


def test_unknown_and_out_of_place_events_leave_state_unchanged_but_counted() -> None:
    state, _ = _run(RUNNING)
    stray = make_event(EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED, scope=Scope(model_id=TINY))
    after, emitted = reduce(state, stray)
    assert after.models == state.models and emitted == ()
    assert after.counters.rejected_transitions == 1


def test_event_system_health_totals_accumulate() -> None:
    reports = [
        make_event(EventId.EVENTS_DROPPED_BY_CLASS, summaries=summaries(dropped_diagnostic=7)),
        make_event(EventId.EVENTS_DROPPED_BY_CLASS, summaries=summaries(dropped_diagnostic=3)),
        make_event(EventId.EVENTS_COALESCED, summaries=summaries(coalesced=100)),
        make_event(EventId.SUBSCRIBER_DISCONNECTED, summaries=summaries(count=1)),
        make_event(EventId.UNKNOWN_NATIVE_EVENT_RECEIVED, summaries=summaries(count=4)),
    ]
    state, _ = _run(reports)
    health = state.event_system
    assert (health.dropped_diagnostic, health.coalesced) == (10, 100)
    assert (health.disconnected_subscribers, health.unknown_native) == (1, 4)


def test_recent_events_are_capped_and_evictions_counted() -> None:
    warnings = [make_event(EventId.WARNING_RAISED) for _ in range(MAX_RECENT_EVENTS + 5)]
    state, _ = _run(warnings)
    assert len(state.recent_events) == MAX_RECENT_EVENTS
    assert state.counters.evicted_recent == 5


_IDS = [LogicalId(f"x{n}") for n in range(3)]


@settings(max_examples=100, deadline=None)
@given(st.lists(any_event(_IDS), max_size=150))
def test_any_event_sequence_of_any_family_keeps_bounds_and_never_raises(
    events: list[Event],
) -> None:
    state = RuntimeView()
    for event in events:
        state, transitions = reduce(state, event)
        assert len(state.recent_events) <= MAX_RECENT_EVENTS
        assert len(state.sessions) <= MAX_SESSIONS
        for transition in transitions:
            assert transition.state is not None
            assert transition.state.previous != transition.state.current
        assert derive_node(state) is state.node  # the stored node is always the derived one


def test_family_handler_maps_are_disjoint() -> None:
    owners: dict[EventId, list[str]] = {}
    for family in FAMILIES:
        for event_id in family.HANDLERS:
            owners.setdefault(event_id, []).append(family.__name__)
    assert {e: o for e, o in owners.items() if len(o) > 1} == {}


def test_merging_handler_maps_refuses_an_id_claimed_twice() -> None:
    claimed = {EventId.MODEL_LOAD_STARTED: reject}
    with pytest.raises(ValueError, match="model_load_started"):
        merge_handlers(claimed, dict(claimed))


def _linked(event_id: EventId, stage: str, **figures: float) -> Event:
    return make_event(
        event_id,
        scope=Scope(stage_id=LogicalId(stage), topology_id=TOPO, stage_index=0),
        summaries=summaries(**figures),
    )


def test_a_stage_keeps_the_latest_link_figures_its_events_carried() -> None:
    figures = {"link_rtt_ms": 1.5, "link_p95_ms": 2.5, "link_jitter_ms": 0.5}
    state, _ = _run(
        [
            _stage(EventId.STAGE_LOADING, "s0"),
            _linked(EventId.STAGE_READY, "s0", **figures),
            _linked(EventId.DOWNSTREAM_CONNECTION_ESTABLISHED, "s0"),  # no figures: kept
        ]
    )
    view = state.stages[LogicalId("s0")]
    assert (view.link_rtt_ms, view.link_p95_ms, view.link_jitter_ms) == (1.5, 2.5, 0.5)
    assert view.downstream_connected is True
    slow = {"link_rtt_ms": 70.0, "link_p95_ms": 90.0, "link_jitter_ms": 9.0}
    state, _ = _run([_linked(EventId.STAGE_DEGRADED, "s0", **slow)], state)
    view = state.stages[LogicalId("s0")]
    assert view.state is StageState.DEGRADED
    assert (view.link_rtt_ms, view.link_p95_ms, view.link_jitter_ms) == (70.0, 90.0, 9.0)
    # A repeat is a counted duplicate: its figures change nothing.
    again, _ = _run([_linked(EventId.STAGE_DEGRADED, "s0", link_rtt_ms=1.0)], state)
    assert again.stages[LogicalId("s0")].link_rtt_ms == 70.0


def _observed(stage: str, probes: int, topology: LogicalId = TOPO, **figures: float) -> Event:
    return make_event(
        EventId.STAGE_LINK_OBSERVED,
        scope=Scope(stage_id=LogicalId(stage), topology_id=topology, stage_index=0),
        progress=Progress(probes, None, ProgressUnit.ITEMS),
        summaries=summaries(**figures),
    )


def test_link_observations_keep_a_stage_s_figures_live_without_a_transition() -> None:
    state, transitions = _run(
        [_stage(EventId.STAGE_LOADING, "s0"), _stage(EventId.STAGE_READY, "s0")]
    )
    first = {"link_rtt_ms": 1.0, "link_p95_ms": 2.0, "link_jitter_ms": 0.1}
    later = {"link_rtt_ms": 3.0, "link_p95_ms": 4.0, "link_jitter_ms": 0.7}
    state, transitions = _run([_observed("s0", 1, **first), _observed("s0", 2, **later)], state)
    view = state.stages[LogicalId("s0")]
    assert view.state is StageState.READY and transitions == []
    assert (view.link_rtt_ms, view.link_p95_ms, view.link_jitter_ms, view.link_probes) == (
        3.0,
        4.0,
        0.7,
        2,
    )
    # An older count (delivered late) is a counted duplicate and changes no figure.
    stale, _ = _run([_observed("s0", 1, **first)], state)
    assert stale.stages[LogicalId("s0")].link_rtt_ms == 3.0
    assert stale.counters.duplicate_transitions == state.counters.duplicate_transitions + 1
    # A stage nobody knows, or one that stopped, takes no figures.
    unknown, _ = _run([_observed("nobody", 9, **first)], state)
    assert LogicalId("nobody") not in unknown.stages
    assert unknown.counters.rejected_transitions == state.counters.rejected_transitions + 1
    stopped, _ = _run([_stage(EventId.STAGE_STOPPED, "s0"), _observed("s0", 3, **first)], state)
    assert stopped.stages[LogicalId("s0")].link_rtt_ms == 3.0


def test_a_stage_in_the_next_topology_counts_its_link_probes_afresh() -> None:
    figures = {"link_rtt_ms": 1.0, "link_p95_ms": 2.0, "link_jitter_ms": 0.1}
    state, _ = _run(
        [
            _stage(EventId.STAGE_LOADING, "s0"),
            _stage(EventId.STAGE_READY, "s0"),
            _observed("s0", 40, **figures),
        ]
    )
    assert state.stages[LogicalId("s0")].link_probes == 40
    other = LogicalId("topology-next")
    reload = make_event(
        EventId.STAGE_LOADING,
        scope=Scope(stage_id=LogicalId("s0"), topology_id=other, stage_index=0),
    )
    state, _ = _run([reload, _observed("s0", 1, other, link_rtt_ms=5.0)], state)
    view = state.stages[LogicalId("s0")]
    assert (view.link_probes, view.link_rtt_ms, view.topology_id) == (1, 5.0, other)


def _completed(session: str | None, **numbers: float) -> Event:
    return make_event(
        EventId.GENERATION_COMPLETED,
        scope=Scope(
            model_id=TINY,
            session_id=None if session is None else LogicalId(session),
            request_id=LogicalId("req-1"),
        ),
        summaries=summaries(generated_tokens=10, **numbers),
    )


def test_speculative_acceptance_adds_up_per_model_and_per_session() -> None:
    state, _ = _run([*RUNNING, *_load(TINY, "op-1"), _session(EventId.SESSION_CREATED, "s-1")])
    state, _ = _run(
        [
            _completed("s-1", spec_windows=3, spec_proposed_tokens=20, spec_accepted_tokens=15),
            _completed("s-1", spec_windows=1, spec_proposed_tokens=4, spec_accepted_tokens=1),
            _completed(None, spec_windows=1, spec_proposed_tokens=8, spec_accepted_tokens=8),
            _completed("s-1"),  # a request without proposals changes nothing
        ],
        state,
    )
    model = state.models[TINY]
    assert (model.spec_proposed_tokens, model.spec_accepted_tokens) == (32, 24)
    assert model.generated_tokens == 40
    session = state.sessions[LogicalId("s-1")]
    assert (session.spec_proposed_tokens, session.spec_accepted_tokens) == (24, 16)


def _serving(model: LogicalId, op: str, lanes: int) -> list[Event]:
    events = _load(model, op)
    events[-1] = make_event(
        EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
        operation_id=LogicalId(op),
        scope=Scope(model_id=model),
        summaries=summaries(lanes=lanes, context_tokens=1024 * lanes),
    )
    return events


def test_the_node_s_capacity_and_resource_pressure_are_derived_and_announced() -> None:
    state, out = _run([*RUNNING, *_serving(TINY, "op-1", 4), *_serving(BIG, "op-2", 2)])
    capacity = [e for e in out if e.id is EventId.NODE_CAPACITY_CHANGED]
    assert [(e.state.previous, e.state.current) for e in capacity if e.state] == [
        ("0 lanes", "4 lanes"),
        ("4 lanes", "6 lanes"),
    ]
    assert capacity[-1].summary_value(SummaryKey.LANES) == 6
    assert state.node_lanes == 6
    crossed = make_event(EventId.CACHE_PRESSURE_CROSSED, scope=Scope(model_id=TINY))
    cleared = make_event(EventId.CACHE_PRESSURE_CLEARED, scope=Scope(model_id=TINY))
    state, out = _run([crossed, crossed, cleared], state)
    pressure = [e for e in out if e.id is EventId.NODE_RESOURCE_PRESSURE_CHANGED]
    assert [(e.state.previous, e.state.current) for e in pressure if e.state] == [
        ("normal", "pressure"),
        ("pressure", "normal"),
    ]
    unloaded = [
        make_event(EventId.UNLOAD_REQUESTED, scope=Scope(model_id=BIG)),
        make_event(EventId.UNLOAD_COMPLETED, scope=Scope(model_id=BIG)),
    ]
    state, out = _run(unloaded, state)
    assert [e.state.current for e in out if e.id is EventId.NODE_CAPACITY_CHANGED and e.state] == [
        "4 lanes"
    ]
