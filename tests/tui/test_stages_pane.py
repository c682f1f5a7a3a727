"""The Stages pane's rows (pure: `stage_rows` over reducer views built directly)."""

from __future__ import annotations

from types import MappingProxyType

from skippy_tui.widgets.stages_pane import ONE_PROCESS, stage_rows, superseded_topologies
from skippyctl.events.envelope import LogicalId
from skippyctl.reducer.state import (
    ModelState,
    ModelView,
    RuntimeView,
    StageState,
    StageView,
    TopologyState,
    TopologyView,
)

TINY = LogicalId("tiny")


def _view(
    models: list[ModelView], topologies: list[TopologyView], stages: list[StageView]
) -> RuntimeView:
    return RuntimeView(
        models=MappingProxyType({m.model_id: m for m in models}),
        topologies=MappingProxyType({t.topology_id: t for t in topologies}),
        stages=MappingProxyType({s.stage_id: s for s in stages}),
    )


def _first_cells(view: RuntimeView) -> list[str]:
    return [str(cells[0]) for _, cells in stage_rows(view)]


def test_a_model_in_one_process_is_one_row_with_no_stage_made_up() -> None:
    view = _view([ModelView(TINY, ModelState.AVAILABLE)], [], [])
    rows = stage_rows(view)
    assert [str(cells[0]) for _, cells in rows] == [f"tiny ▸ {ONE_PROCESS}"]
    assert str(rows[0][1][1]) == "ready"


def test_ended_topologies_of_a_reloaded_model_get_no_rows() -> None:
    current = LogicalId("topology-9")
    older = [LogicalId(f"topology-{n}") for n in (1, 3, 5)]
    stage = LogicalId("stage-3237a3d31709536e")
    view = _view(
        [ModelView(TINY, ModelState.AVAILABLE, topology_id=current)],
        [
            TopologyView(current, TopologyState.READY, model_id=TINY),
            *(TopologyView(t, TopologyState.UNAVAILABLE, model_id=TINY) for t in older),
            # another model's ended topology, that model gone from the view: still listed
            TopologyView(
                LogicalId("topology-2"), TopologyState.UNAVAILABLE, model_id=LogicalId("gone")
            ),
        ],
        [StageView(stage, StageState.READY, topology_id=current, stage_index=0)],
    )
    assert superseded_topologies(view) == set(older)
    cells = _first_cells(view)
    assert cells[0] == "tiny ▸ topology-9"
    assert any("stage-3237a3d3" in c for c in cells)
    assert not any(t in c for t in older for c in cells)
    assert any("topology-2" in c for c in cells)
