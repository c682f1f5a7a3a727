"""The fleet dashboard's header line: title, how many nodes are up, the node filter, model
availability over the nodes it selects, the source.

Contract: `show(shown, live, node_filter)` draws one line: model counts from `shown` (the
snapshot the panes show, frozen while paused, so the line agrees with them) and reachability and
the source's state from `live` (never frozen). How many nodes are down is drawn in the error
style; the line itself stays as it is (one node down is a state of the fleet, the Nodes pane says
which and why).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from skippy_tui.fleet_store import FleetSnapshot, Reach
from skippy_tui.widgets.node_header import append_model_counts


def filter_label(node_filter: str | None) -> str:
    """What the node filter selects, for titles: `all nodes` or `node NAME`."""
    return "all nodes" if node_filter is None else f"node {node_filter}"


def fleet_header_text(
    title: str,
    source: str,
    shown: FleetSnapshot,
    live: FleetSnapshot | None = None,
    node_filter: str | None = None,
) -> Text:
    """The header as text (a pure function)."""
    live = live if live is not None else shown
    nodes = live.nodes
    up = sum(1 for n in nodes if n.health.reach is Reach.REACHABLE)
    down = sum(1 for n in nodes if n.health.reach is Reach.UNREACHABLE)
    text = Text()
    text.append(f" {title} ", style="bold reverse")
    text.append("  ")
    text.append("fleet ", style="grey62")
    text.append(f"{up}/{len(nodes)} up", style="bold green" if up == len(nodes) else "bold")
    if down:
        text.append(f" · {down} down", style="bold white on red")
    text.append("  │  ", style="grey37")
    text.append("showing ", style="grey62")
    text.append(filter_label(node_filter), style="bold magenta")
    models = [m for n in shown.shown(node_filter) for m in n.dashboard.view.models.values()]
    append_model_counts(text, models)
    text.append("  │  ", style="grey37")
    text.append(source, style="grey62")
    if live.ended:
        text.append(" · ended", style="grey62")
    return text


class FleetHeader(Static):
    """One line at the top of the fleet dashboard."""

    def __init__(self, title: str, source: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.source = source
        self._drawn: tuple[int, int, str | None] | None = None

    def show(self, shown: FleetSnapshot, live: FleetSnapshot, node_filter: str | None) -> None:
        key = (shown.version, live.version, node_filter)
        if key == self._drawn:
            return
        self._drawn = key
        self.update(fleet_header_text(self.title, self.source, shown, live, node_filter))
