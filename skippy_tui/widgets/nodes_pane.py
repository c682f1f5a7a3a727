"""Pane 0, Nodes (the fleet dashboard only): one row per runtime of the fleet.

Columns: the node (`▸` marks the one the node filter selects), whether it is reachable — `up`
with the runtime's own node state, `connecting…` before its stream first opened, or `down:`
with the reason code it cannot be followed for and the reconnection attempt (`down:
node_unreachable (retry 3)`), its runtime's version, its models (serving of those it knows, and
how many are loading), its load (lanes busy of its serving models' lanes, and requests queued),
its last event's time (`Seen at`, UTC, to the second), and the health of its event stream:
`live`, `reconnecting`, `connecting` or `ended` (a replay's end), then what it lost or skipped —
replay gaps, records not decoded — and how often a new runtime instance answered (`N
restarts`). A node that is down keeps its last known rows in the other panes; this row says
they are stale and why. Every node is listed whatever the filter: this pane is where the
filter's choices are.
"""

from __future__ import annotations

from typing import Any, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from skippy_tui import format as fmt
from skippy_tui.fleet_store import FleetSnapshot, NodeSnapshot, Reach
from skippy_tui.tables import Cells, KeyedRows, SizedTable
from skippy_tui.widgets.pane import NODE_STYLE, Pane
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    lanes_in_use,
    queue_depth,
)

COLUMNS: Final = ("Node", "Reachability", "Version", "Models", "Load", "Seen at", "Stream")
"""`Seen at`: the time of the node's last event (short: a 120-column terminal shows every column
of a node with a gap, a skipped record and a restart)."""
SELECTED: Final = "▸"
UNSELECTED: Final = " "


def reachability(node: NodeSnapshot) -> Text:
    """`up · accepting`, `connecting…`, or `down: REASON (retry N)`."""
    health = node.health
    if health.reach is Reach.UNREACHABLE:
        reason = health.reason_code or "node_unreachable"
        return Text(f"down: {reason} (retry {health.attempt})", style="bold red")
    if health.reach is Reach.CONNECTING:
        return Text("connecting…", style="cyan")
    text = Text("up", style="bold green")
    state = node.dashboard.view.node
    text.append(" · ", style="grey50")
    text.append(state.value, style=fmt.NODE_STYLES[state])
    return text


def models_cell(node: NodeSnapshot) -> Text:
    """`serving/known` and `· N loading`."""
    models = node.dashboard.view.models.values()
    if not models:
        return Text(fmt.DASH)
    serving = sum(1 for m in models if m.state in SERVING_MODEL_STATES)
    loading = sum(1 for m in models if m.state in LOADING_MODEL_STATES)
    text = Text(f"{serving}/{len(models)}", style="green" if serving else "")
    if loading:
        text.append(f" · {loading} loading", style="cyan")
    return text


def load_cell(node: NodeSnapshot) -> Text:
    """`busy/lanes lanes` of its serving models, and `· N queued`."""
    view = node.dashboard.view
    serving = [m for m in view.models.values() if m.state in SERVING_MODEL_STATES]
    lanes = sum(m.lanes or 0 for m in serving)
    busy = sum(lanes_in_use(view, m.model_id) for m in serving)
    queued = sum(queue_depth(view, m.model_id) for m in view.models.values())
    if not lanes and not queued:
        return Text(fmt.DASH)
    text = Text(f"{busy}/{lanes} lanes")
    if queued:
        text.append(f" · {queued} queued", style="yellow")
    return text


def stream_cell(node: NodeSnapshot) -> Text:
    """`live` / `reconnecting` / `connecting` / `ended`, then gaps, skips and restarts."""
    health = node.health
    if health.ended:
        text = Text("ended", style="grey62")
    elif health.reach is Reach.REACHABLE:
        text = Text("live", style="green")
    elif health.reach is Reach.UNREACHABLE:
        text = Text("reconnecting", style="bold red")
    else:
        text = Text("connecting", style="cyan")
    if health.gaps:
        text.append(f" · {fmt.plural(health.gaps, 'gap')}", style="yellow")
    if health.skipped:
        text.append(f" · {health.skipped:,} skipped", style="yellow")
    if health.restarts:
        text.append(f" · {fmt.plural(health.restarts, 'restart')}", style="yellow")
    return text


def node_row(node: NodeSnapshot, selected: bool = False) -> Cells:
    """A node's row (a pure function of its snapshot)."""
    health = node.health
    name = Text(SELECTED if selected else UNSELECTED, style="bold")
    name.append(node.name, style=f"bold {NODE_STYLE}")
    last = health.last_event_wall_ns
    return (
        name,
        reachability(node),
        health.version or fmt.DASH,
        models_cell(node),
        load_cell(node),
        fmt.clock(last)[:8] if last is not None else fmt.DASH,
        stream_cell(node),
    )


class NodesPane(Pane):
    """The fleet's runtimes: reachable or not and why, version, models, load, stream health."""

    NUMBER = 0
    TITLE = "Nodes"
    DETAIL = False

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, fleet=True)
        self._table: DataTable[Any] = SizedTable(
            id="nodes-table", cursor_type="row", zebra_stripes=True
        )
        self._rows = KeyedRows(self._table)
        self._drawn: tuple[int, str | None] | None = None

    def compose(self) -> ComposeResult:
        yield self._table

    def on_mount(self) -> None:
        for label in COLUMNS:
            self._table.add_column(label, key=label)

    def show_fleet(self, fleet: FleetSnapshot, node_filter: str | None) -> None:
        key = (fleet.version, node_filter)
        if key == self._drawn:
            return
        self._drawn = key
        self._rows.show([(n.name, node_row(n, n.name == node_filter)) for n in fleet.nodes])
        up = sum(1 for n in fleet.nodes if n.health.reach is Reach.REACHABLE)
        down = sum(1 for n in fleet.nodes if n.health.reach is Reach.UNREACHABLE)
        parts = [f"{up}/{len(fleet.nodes)} up"]
        if down:
            parts.append(f"{down} down")
        skipped = sum(fleet.skipped.values())
        if skipped:
            parts.append(f"{skipped:,} records of no node skipped")
        self.border_subtitle = " · ".join(parts)
