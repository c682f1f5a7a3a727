"""Pane 2, Stages: each model's topology and its stages, with state and link status.

One heading row per model, `model ▸ topology` with the topology's state, then a row per stage.
A model without a topology runs as one local stage: `model ▸ local` then "1 local stage", whose
state follows the model's. A topology lists every stage the reducer knows for it, ordered by stage
index, with its links as `↑x ↓y` (upstream, downstream: ✓ connected, ✗ lost, · not reported)
and its state followed by its reason code when it has one. Topologies and stages the reducer
knows without a model (yet) are listed too: nothing is hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from skippy_tui import format as fmt
from skippy_tui.store import DashboardSnapshot
from skippy_tui.tables import Cells, KeyedRows
from skippy_tui.widgets.pane import Pane
from skippyctl.events.envelope import LogicalId
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    ModelState,
    ModelView,
    RuntimeView,
    StageState,
    StageView,
    TopologyState,
)

COLUMNS: Final = ("Model ▸ topology / stage", "Links", "State")

LOCAL_STAGE_STATES: Final[dict[ModelState, StageState]] = {
    **dict.fromkeys(LOADING_MODEL_STATES, StageState.LOADING),
    ModelState.AVAILABLE: StageState.READY,
    ModelState.DEGRADED: StageState.DEGRADED,
    ModelState.UNAVAILABLE: StageState.UNAVAILABLE,
    ModelState.FAILED: StageState.FAILED,
    ModelState.CANCELLED: StageState.STOPPED,
    ModelState.UNLOADING: StageState.STOPPING,
    ModelState.UNLOADED: StageState.STOPPED,
}
"""The state of a model's one local stage (a model without a topology), for every model state."""


def local_stage_state(model: ModelView) -> StageState:
    return LOCAL_STAGE_STATES[model.state]


def _state(state: StageState | TopologyState, reason: str | None = None) -> Text:
    text = fmt.stage_state(state)
    if reason:
        text.append(f" · {reason}", style="red")
    return text


def _stage_rows(stages: list[StageView]) -> Iterable[tuple[str, Cells]]:
    ordered = sorted(
        stages, key=lambda s: (s.stage_index if s.stage_index is not None else 1 << 30, s.stage_id)
    )
    for position, stage in enumerate(ordered):
        branch = "└" if position == len(ordered) - 1 else "├"
        index = f"#{stage.stage_index} " if stage.stage_index is not None else ""
        links = Text("↑")
        links.append_text(fmt.link(stage.upstream_connected))
        links.append(" ↓")
        links.append_text(fmt.link(stage.downstream_connected))
        yield (
            f"s:{stage.stage_id}",
            (
                Text(f" {branch} {index}{stage.stage_id}"),
                links,
                _state(stage.state, stage.reason_code),
            ),
        )


def _heading(model: str, topology: str) -> Text:
    text = Text(model, style="bold")
    text.append(f" ▸ {topology}", style="grey62")
    return text


def stage_rows(view: RuntimeView) -> list[tuple[str, Cells]]:
    """Rows in display order: per model its topology (or local stage), then orphans."""
    by_topology: dict[LogicalId | None, list[StageView]] = {}
    for stage in view.stages.values():
        key = stage.topology_id if stage.topology_id in view.topologies else None
        by_topology.setdefault(key, []).append(stage)
    rows: list[tuple[str, Cells]] = []
    shown: set[LogicalId] = set()
    for model_id in sorted(view.models):
        model = view.models[model_id]
        topology_id = model.topology_id
        if topology_id is None:
            state = local_stage_state(model)
            reason = model.reason_code.value if model.reason_code is not None else None
            rows.append((f"m:{model_id}", (_heading(model_id, "local"), "", _state(state))))
            rows.append((f"l:{model_id}", (Text(" └ 1 local stage"), "", _state(state, reason))))
            continue
        topology = view.topologies.get(topology_id)
        state_text = _state(topology.state if topology is not None else TopologyState.ASSEMBLING)
        stages = by_topology.get(topology_id, [])
        rows.append((f"m:{model_id}", (_heading(model_id, topology_id), "", state_text)))
        rows.extend(_stage_rows(stages))
        shown.add(topology_id)
    for topology_id in sorted(set(view.topologies) - shown):
        topology = view.topologies[topology_id]
        stages = by_topology.get(topology_id, [])
        owner = str(topology.model_id) if topology.model_id is not None else "(no model)"
        heading = _heading(owner, topology_id)
        rows.append((f"t:{topology_id}", (heading, "", _state(topology.state))))
        rows.extend(_stage_rows(stages))
    orphans = by_topology.get(None, [])
    if orphans:
        rows.append(("o:", (Text("(no topology)", style="grey50"), "", "")))
        rows.extend(_stage_rows(orphans))
    return rows


class StagesPane(Pane):
    """Topologies and their stages."""

    NUMBER = 2
    TITLE = "Stages"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._table: DataTable[object] = DataTable(id="stages-table", cursor_type="row")
        self._rows = KeyedRows(self._table)
        self._inputs: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield self._table

    def on_mount(self) -> None:
        for label in COLUMNS:
            self._table.add_column(label, key=label)

    def show(self, snapshot: DashboardSnapshot) -> None:
        view = snapshot.view
        inputs = (view.models, view.stages, view.topologies)
        if self._inputs and all(a is b for a, b in zip(inputs, self._inputs, strict=True)):
            return
        self._inputs = inputs
        self._rows.show(stage_rows(view))
        topologies = len(view.topologies)
        local = sum(1 for m in view.models.values() if m.topology_id is None)
        parts = [f"{fmt.plural(local, 'local stage')}"] if local else []
        if topologies or not local:
            parts.append(
                f"{topologies} topolog{'y' if topologies == 1 else 'ies'} · "
                f"{fmt.plural(len(view.stages), 'stage')}"
            )
        self.border_subtitle = " · ".join(parts)
