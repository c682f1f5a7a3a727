"""Pane 2, Stages: each model's topology and its stages: state, layers, memory, links.

One heading row per model, `model ▸ topology` with its state and its layer count (and under it
the topology's reason, when it has one), then a row per stage. A model split across stages
(`load --stage`/`--local-stages`) lists every stage the reducer knows for its topology, ordered
by stage index: `#index stage-id` (the id's first 8 hex digits), its state followed by its
reason code when it has one (not when it only restates the state: `unavailable`, not
`unavailable · stage_unavailable`), its link figures (`rtt ±jitter` in ms, when measured), its layer
range (`0-5`, from its `stage_loading`), its memory (the plan's share of the weights / what the
stage offered) and its links as `↑x ↓y`
(upstream, downstream: ✓ connected, ✗ lost, · not reported). A stage that is lost (unavailable
or failed) is marked `✗` and drawn in the error style across its row, so it shows at a glance
even where the pane is too narrow for its state column. A model without a topology (served in
one engine process: it has no stages) is one row, `model ▸ one process`, with the model's
state in the stage words (`ready` for available) and its reason — no stage is made up for it.
Topologies and stages the reducer knows without a model (yet) are listed too. An ended
topology of a model that was loaded again since is history: the subtitle counts it (`N ended`)
and the state document keeps it, but it gets no rows. In the fleet dashboard the first column is
the node, and every node the filter selects has its rows, node by node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from skippy_tui import format as fmt
from skippy_tui.tables import Cells, KeyedRows, SizedTable
from skippy_tui.widgets.pane import NODE_COLUMN, NodePart, Pane, node_cell, row_key, same_inputs
from skippyctl.events.envelope import LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    ModelState,
    RuntimeView,
    StageState,
    StageView,
    TopologyState,
)

COLUMNS: Final = ("Model ▸ topology / stage", "State", "RTT ms ±", "Layers", "Memory", "Links")
"""The link figures come right after the state: on a large terminal the pane is 46 columns and
what does not fit scrolls, so what changes live is what shows."""
COLUMN_WIDTHS: Final = (20, 8, 10, 6, 16, 6)
"""Fixed, so the layout never depends on which texts a row held first (a table measured as
its rows arrive and change drew the same state as `fail…` or `failed · …` by timing); a longer
cell is cut with an ellipsis, and `ps` shows it whole."""
NODE_WIDTH: Final = 8
"""The node column's width in the fleet dashboard (a longer name is cut with an ellipsis)."""
SHORT_ID_CHARS: Final = len("stage-") + 8
LOST_STATES: Final = frozenset({StageState.UNAVAILABLE, StageState.FAILED})
LOST_STYLE: Final = "bold red"

ONE_PROCESS: Final = "one process"
"""What a model without a topology is served by (its heading row's second half)."""
ONE_PROCESS_STATES: Final[dict[ModelState, StageState]] = {
    **dict.fromkeys(LOADING_MODEL_STATES, StageState.LOADING),
    ModelState.AVAILABLE: StageState.READY,
    ModelState.DEGRADED: StageState.DEGRADED,
    ModelState.UNAVAILABLE: StageState.UNAVAILABLE,
    ModelState.FAILED: StageState.FAILED,
    ModelState.CANCELLED: StageState.STOPPED,
    ModelState.UNLOADING: StageState.STOPPING,
    ModelState.UNLOADED: StageState.STOPPED,
}
"""A one-process model's state in the pane's own words (the stage states: they fit its state
column, where `available` would not)."""


def _state(state: StageState | TopologyState, reason: str | None = None) -> Text:
    text = fmt.stage_state(state)
    if reason:
        text.append(f" · {reason}", style="red")
    return text


def _layers(stage: StageView) -> str:
    if stage.layer_start is None or stage.layer_count is None:
        return fmt.DASH
    if stage.layer_count == 1:
        return str(stage.layer_start)
    return f"{stage.layer_start}-{stage.layer_start + stage.layer_count - 1}"


def _size(value: int | None) -> str:
    """`fmt.size` in fewer characters: `284 KiB`, `23.5 GiB`."""
    text = fmt.size(value)
    number, _, unit = text.partition(" ")
    if unit and "." in number and float(number) >= 10:
        return f"{float(number):.0f} {unit}"
    return text


def _memory(planned: int | None, offered: int | None) -> str:
    if planned is None and offered is None:
        return fmt.DASH
    if offered is None:
        return _size(planned)
    return f"{_size(planned)}/{_size(offered)}"


def _rtt(stage: StageView) -> str:
    rtt, jitter = stage.link_rtt_ms, stage.link_jitter_ms
    if rtt is None:
        return fmt.DASH
    return f"{rtt:.2f}" if jitter is None else f"{rtt:.2f} ±{jitter:.2f}"


def _stage_reason(stage: StageView) -> str | None:
    """The reason beside a stage's state, unless it only restates it (unavailable ·
    stage_unavailable)."""
    reason = stage.reason_code
    if reason is None or (reason is ReasonCode.STAGE_UNAVAILABLE and stage.state in LOST_STATES):
        return None
    return reason.value


def _stage_rows(stages: list[StageView]) -> Iterable[tuple[str, Cells]]:
    ordered = sorted(
        stages, key=lambda s: (s.stage_index if s.stage_index is not None else 1 << 30, s.stage_id)
    )
    for position, stage in enumerate(ordered):
        branch = "└" if position == len(ordered) - 1 else "├"
        index = f"#{stage.stage_index} " if stage.stage_index is not None else ""
        lost = stage.state in LOST_STATES
        links = Text("↑")
        links.append_text(fmt.link(stage.upstream_connected))
        links.append(" ↓")
        links.append_text(fmt.link(stage.downstream_connected))
        style = LOST_STYLE if lost else ""
        yield (
            f"s:{stage.stage_id}",
            (
                Text(
                    f" {branch} {'✗ ' if lost else ''}{index}{_short(stage.stage_id)}", style=style
                ),
                _state(stage.state, _stage_reason(stage)),
                Text(_rtt(stage), style=style),
                Text(_layers(stage), style=style),
                Text(_memory(stage.planned_bytes, stage.offered_bytes), style=style),
                links,
            ),
        )


def _short(stage_id: LogicalId) -> str:
    """`stage-` and the first 8 hex digits of its hash (unique enough on one screen; the whole
    id is in `ps` and the state document)."""
    return stage_id[:SHORT_ID_CHARS]


def _heading(model: str, topology: str) -> Text:
    text = Text(model, style="bold")
    text.append(f" ▸ {topology}", style="grey62")
    return text


def stage_rows(view: RuntimeView) -> list[tuple[str, Cells]]:
    """Rows in display order: per model its topology and stages (or its one process row),
    then topologies without a model, then stages without a topology."""
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
            reason = model.reason_code.value if model.reason_code is not None else None
            heading = _heading(model_id, ONE_PROCESS)
            state = _state(ONE_PROCESS_STATES[model.state], reason)
            rows.append((f"m:{model_id}", (heading, state, *_BLANK)))
            continue
        rows.append((f"m:{model_id}", _topology_heading(view, model_id, topology_id)))
        rows.extend(_topology_reason(view, topology_id))
        rows.extend(_stage_rows(by_topology.get(topology_id, [])))
        shown.add(topology_id)
    for topology_id in sorted(set(view.topologies) - shown - superseded_topologies(view)):
        topology = view.topologies[topology_id]
        owner = str(topology.model_id) if topology.model_id is not None else "(no model)"
        rows.append((f"t:{topology_id}", _topology_heading(view, owner, topology_id)))
        rows.extend(_topology_reason(view, topology_id))
        rows.extend(_stage_rows(by_topology.get(topology_id, [])))
    orphans = by_topology.get(None, [])
    if orphans:
        rows.append(("o:", (Text("(no topology)", style="grey50"), "", *_BLANK)))
        rows.extend(_stage_rows(orphans))
    return rows


def superseded_topologies(view: RuntimeView) -> set[LogicalId]:
    """Ended topologies of a model that has been loaded again since (with another topology or
    in one process): history, which the state document keeps and the pane only counts."""
    current = {m.topology_id for m in view.models.values()}
    return {
        topology_id
        for topology_id, topology in view.topologies.items()
        if topology.state is TopologyState.UNAVAILABLE
        and topology.model_id in view.models
        and topology_id not in current
    }


_BLANK: Final = ("", "", "", "")
"""The cells a heading row leaves empty (rtt, layers, memory, links)."""


def _topology_heading(view: RuntimeView, owner: str, topology_id: LogicalId) -> Cells:
    topology = view.topologies.get(topology_id)
    if topology is None:
        return (_heading(owner, topology_id), _state(TopologyState.ASSEMBLING), *_BLANK)
    layers = "" if topology.layers is None else f"{topology.layers} layers"
    return (_heading(owner, topology_id), _state(topology.state), "", layers, "", "")


def _topology_reason(view: RuntimeView, topology_id: LogicalId) -> list[tuple[str, Cells]]:
    """A row under the heading with the topology's reason (beside its state it would widen the
    state column past what the pane shows on a large terminal)."""
    topology = view.topologies.get(topology_id)
    if topology is None or topology.reason_code is None:
        return []
    reason = Text(f" ⚠ {topology.reason_code.value}", style="red")
    return [(f"r:{topology_id}", (reason, "", *_BLANK))]


class StagesPane(Pane):
    """Topologies and their stages."""

    NUMBER = 2
    TITLE = "Stages"

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, fleet=fleet)
        self._table: DataTable[Any] = SizedTable(id="stages-table", cursor_type="row")
        self._rows = KeyedRows(self._table)
        self._inputs: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield self._table

    def on_mount(self) -> None:
        if self.fleet:
            self._table.add_column(NODE_COLUMN, key=NODE_COLUMN, width=NODE_WIDTH)
        for label, width in zip(COLUMNS, COLUMN_WIDTHS, strict=True):
            self._table.add_column(label, key=label, width=width)

    def show_parts(self, parts: Sequence[NodePart]) -> None:
        inputs = tuple(
            value
            for name, snapshot in parts
            for value in (
                name,
                snapshot.view.models,
                snapshot.view.stages,
                snapshot.view.topologies,
                snapshot.connection if name is not None else None,
            )
        )
        if same_inputs(inputs, self._inputs):
            return
        self._inputs = inputs
        rows: list[tuple[str, Cells]] = []
        ended = topologies = one_process = stages = 0
        for name, snapshot in parts:
            view = snapshot.view
            node_rows = stage_rows(view)
            if name is not None:
                node = node_cell(name, snapshot)
                node_rows = [(row_key(name, key), (node, *cells)) for key, cells in node_rows]
            rows += node_rows
            node_ended = len(superseded_topologies(view))
            ended += node_ended
            topologies += len(view.topologies) - node_ended
            one_process += sum(1 for m in view.models.values() if m.topology_id is None)
            stages += len(view.stages)
        self._rows.show(rows)
        subtitle = [f"{fmt.plural(one_process, 'model')} in {ONE_PROCESS}"] if one_process else []
        if topologies or not one_process:
            subtitle.append(
                f"{topologies} topolog{'y' if topologies == 1 else 'ies'} · "
                f"{fmt.plural(stages, 'stage')}"
            )
        if ended:
            subtitle.append(f"{ended} ended")
        self.border_subtitle = " · ".join(subtitle)
