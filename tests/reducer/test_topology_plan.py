"""What the reducer keeps of a split load's plan: each stage's share (`stage_loading`), each
topology's plan (`topology_assembling`), reasons, and the state document built from them."""

from __future__ import annotations

import orjson

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event, summaries
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.output.state import state_document
from skippyctl.output.state_reader import read_state_document
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import (
    ModelState,
    RuntimeView,
    StageState,
    TopologyState,
    topology_stages,
)

MODEL = LogicalId("tiny")
TOPO = LogicalId("topology-1")
OTHER = LogicalId("topology-2")
S0 = LogicalId("stage-aaaa")
S1 = LogicalId("stage-bbbb")
MIB = 2**20


def _run(events: list[Event], state: RuntimeView | None = None) -> RuntimeView:
    state = state or RuntimeView()
    for event in events:
        state, _ = reduce(state, event)
    return state


def _stage(
    event_id: EventId,
    stage: LogicalId,
    index: int,
    topology: LogicalId = TOPO,
    **fields: object,
) -> Event:
    scope = Scope(topology_id=topology, stage_id=stage, stage_index=index)
    return make_event(event_id, scope=scope, **fields)  # type: ignore[arg-type]  # test kwargs


def _topology(event_id: EventId, topology: LogicalId = TOPO, **fields: object) -> Event:
    scope = Scope(model_id=MODEL, topology_id=topology)
    return make_event(event_id, scope=scope, **fields)  # type: ignore[arg-type]  # test kwargs


def _model(event_id: EventId, topology: LogicalId = TOPO) -> Event:
    return make_event(
        event_id,
        operation_id=LogicalId("load-1"),
        scope=Scope(model_id=MODEL, topology_id=topology),
    )


def _split_load(topology: LogicalId = TOPO) -> list[Event]:
    """A 2-stage split load as runtime/topology.py reports it, through the model's serving."""
    return [
        _model(EventId.MODEL_LOAD_REQUESTED, topology),
        _stage(EventId.STAGE_STARTING, S0, 0, topology),
        _stage(EventId.STAGE_READY, S0, 0, topology),
        _stage(EventId.STAGE_STARTING, S1, 1, topology),
        _stage(EventId.STAGE_READY, S1, 1, topology),
        _topology(
            EventId.TOPOLOGY_ASSEMBLING,
            topology,
            summaries=summaries(
                stages=2,
                layers=12,
                model_size_bytes=130 * MIB,
                offered_bytes=2048 * MIB,
                planned_bytes=180 * MIB,
            ),
        ),
        _stage(
            EventId.STAGE_LOADING,
            S0,
            0,
            topology,
            summaries=summaries(
                layer_start=0, layer_count=6, planned_bytes=60 * MIB, offered_bytes=1024 * MIB
            ),
        ),
        _stage(
            EventId.STAGE_LOADING,
            S1,
            1,
            topology,
            summaries=summaries(
                layer_start=6, layer_count=6, planned_bytes=70 * MIB, offered_bytes=1024 * MIB
            ),
        ),
        _model(EventId.MODEL_LOAD_STARTED, topology),
        _model(EventId.NATIVE_MODEL_LOAD_COMPLETED, topology),
        _stage(
            EventId.STAGE_READY, S0, 0, topology, summaries=summaries(layer_start=0, layer_count=6)
        ),
        _stage(
            EventId.STAGE_READY, S1, 1, topology, summaries=summaries(layer_start=6, layer_count=6)
        ),
        _model(EventId.SERVING_BACKEND_INITIALIZATION_STARTED, topology),
        _model(EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED, topology),
        _topology(EventId.TOPOLOGY_READY, topology, outcome=Outcome.SUCCESS),
    ]


def test_stage_loading_gives_each_stage_its_layer_range_and_bytes() -> None:
    state = _run(_split_load())
    s0, s1 = state.stages[S0], state.stages[S1]
    assert (s0.layer_start, s0.layer_count, s0.planned_bytes, s0.offered_bytes) == (
        0,
        6,
        60 * MIB,
        1024 * MIB,
    )
    assert (s1.layer_start, s1.layer_count, s1.planned_bytes, s1.offered_bytes) == (
        6,
        6,
        70 * MIB,
        1024 * MIB,
    )
    assert s0.state is s1.state is StageState.READY  # the ready that restates layers kept bytes
    topology = state.topologies[TOPO]
    assert topology.state is TopologyState.READY
    assert (topology.stages, topology.layers) == (2, 12)
    assert (topology.planned_bytes, topology.offered_bytes) == (180 * MIB, 2048 * MIB)
    assert [s.stage_id for s in topology_stages(state, TOPO)] == [S0, S1]
    assert state.models[MODEL].state is ModelState.AVAILABLE
    assert state.counters.rejected_transitions == 0


def test_a_lost_stage_keeps_its_share_and_its_reason_and_so_does_the_topology() -> None:
    state = _run(
        [
            *_split_load(),
            _stage(
                EventId.STAGE_UNAVAILABLE,
                S1,
                1,
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.STAGE_UNAVAILABLE,
            ),
            _topology(
                EventId.TOPOLOGY_UNAVAILABLE,
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.STAGE_UNAVAILABLE,
            ),
        ]
    )
    lost = state.stages[S1]
    assert lost.state is StageState.UNAVAILABLE
    assert lost.reason_code is ReasonCode.STAGE_UNAVAILABLE
    assert (lost.layer_start, lost.layer_count) == (6, 6)
    assert state.stages[S0].state is StageState.READY and state.stages[S0].reason_code is None
    topology = state.topologies[TOPO]
    assert topology.state is TopologyState.UNAVAILABLE
    assert topology.reason_code is ReasonCode.STAGE_UNAVAILABLE
    assert topology.layers == 12  # the plan is kept past the end
    assert state.models[MODEL].state is ModelState.UNAVAILABLE


def test_a_stage_in_a_new_topology_forgets_the_old_plan_and_the_topology_its_reason() -> None:
    ended = _run(
        [
            *_split_load(),
            _topology(EventId.TOPOLOGY_UNAVAILABLE, reason_code=ReasonCode.STAGE_UNAVAILABLE),
        ]
    )
    again = _run([_stage(EventId.STAGE_STARTING, S0, 0, OTHER)], ended)
    moved = again.stages[S0]
    assert moved.topology_id == OTHER
    assert (moved.layer_start, moved.layer_count, moved.planned_bytes) == (None, None, None)
    reassembled = _run(
        [_topology(EventId.TOPOLOGY_ASSEMBLING, summaries=summaries(stages=1, layers=12))], ended
    )
    topology = reassembled.topologies[TOPO]
    assert topology.reason_code is None and topology.stages == 1
    assert topology.planned_bytes is None  # a new plan: the old one's bytes are not its own


def test_the_state_document_carries_the_plan_and_the_reader_reads_it_back() -> None:
    state = _run(
        [
            *_split_load(),
            _stage(EventId.STAGE_UNAVAILABLE, S1, 1, reason_code=ReasonCode.STAGE_UNAVAILABLE),
        ]
    )
    document = orjson.loads(orjson.dumps(state_document(state)))
    (topology,) = document["topologies"]
    assert topology == {
        "topology_id": "topology-1",
        "state": "ready",
        "model_id": "tiny",
        "stages": 2,
        "layers": 12,
        "planned_bytes": 180 * MIB,
        "offered_bytes": 2048 * MIB,
        "stage_ids": ["stage-aaaa", "stage-bbbb"],
    }
    stages = {s["stage_id"]: s for s in document["stages"]}
    assert stages["stage-bbbb"] == {
        "stage_id": "stage-bbbb",
        "state": "unavailable",
        "topology_id": "topology-1",
        "stage_index": 1,
        "reason_code": "stage_unavailable",
        "layer_start": 6,
        "layer_count": 6,
        "planned_bytes": 70 * MIB,
        "offered_bytes": 1024 * MIB,
    }
    reading = read_state_document(document)
    model = reading.model("tiny")
    assert model is not None and model.topology_id == "topology-1"
    entry = reading.topology_of(model)
    assert entry is not None and entry.layers == 12
    assert [s.stage_id for s in entry.stages] == ["stage-aaaa", "stage-bbbb"]
    assert [s.layers for s in entry.stages] == [range(0, 6), range(6, 12)]
    assert entry.stages[1].state.member is StageState.UNAVAILABLE
    assert entry.stages[1].reason_code is not None
    assert entry.stages[1].reason_code.member is ReasonCode.STAGE_UNAVAILABLE
    assert all(s.link_rtt_ms is None and s.link_jitter_ms is None for s in entry.stages)


def test_the_reader_takes_link_figures_when_a_document_has_them_and_drops_bad_ones() -> None:
    document = {
        "models": [{"model_id": "m", "state": "available", "topology_id": "t"}],
        "topologies": [{"topology_id": "t", "state": "ready", "model_id": "m"}],
        "stages": [
            {
                "stage_id": "b",
                "state": "ready",
                "topology_id": "t",
                "stage_index": 1,
                "link_rtt_ms": 0.25,
                "link_p95_ms": 1,
                "link_jitter_ms": 0.05,
            },
            {
                "stage_id": "a",
                "state": "lost-ish",
                "topology_id": "t",
                "stage_index": 0,
                "link_rtt_ms": "fast",
                "link_jitter_ms": True,
            },
        ],
    }
    reading = read_state_document(document)
    model = reading.model("m")
    assert model is not None
    topology = reading.topology_of(model)
    assert topology is not None
    a, b = topology.stages
    assert (a.stage_id, a.state.text, a.state.member) == ("a", "lost-ish", None)
    assert (a.link_rtt_ms, a.link_jitter_ms) == (None, None)
    assert (b.link_rtt_ms, b.link_p95_ms, b.link_jitter_ms) == (0.25, 1.0, 0.05)
