"""The fleet dashboard's screen: the Nodes pane on top, then the single-runtime dashboard's panes,
each with a node column, over the nodes the node filter selects.

Layout (app.tcss, the `-fleet` class): Nodes across the top (key `0`), then the single-runtime
grid; on a small terminal Nodes and Models stay on top and the detail panes share the space
below, one at a time.

The node filter: `n` cycles it — every node, then each node in the Nodes pane's order, then
every node again. The header and every pane's title say what it selects; the Nodes pane marks
the node with `▸` and keeps listing them all. Load and unload (the app's command palette) act on
the node it selects.

Contract: `show(snapshot)` fans a `FleetSnapshot` out to the panes under the current filter (UI
thread only), `show_header(shown, live)` updates the header. Changing the filter redraws the
panes from the snapshot they last drew (a paused dashboard stays paused, filtered anew).
"""

from __future__ import annotations

from textual.binding import Binding

from skippy_tui.fleet_store import FleetSnapshot
from skippy_tui.screens.dashboard import PaneScreen
from skippy_tui.widgets.events_log import EventsLog
from skippy_tui.widgets.fleet_header import FleetHeader, filter_label
from skippy_tui.widgets.health_pane import HealthPane
from skippy_tui.widgets.models_pane import ModelsPane
from skippy_tui.widgets.nodes_pane import NodesPane
from skippy_tui.widgets.sessions_pane import SessionsPane
from skippy_tui.widgets.stages_pane import StagesPane


class FleetDashboardScreen(PaneScreen[FleetSnapshot]):
    """The dashboard of a fleet of runtimes."""

    BINDINGS = [
        Binding("0", "focus_pane(0)", "Nodes", show=False),
        Binding("1", "focus_pane(1)", "Panes", key_display="0-5"),
        Binding("n", "next_node", "Node filter"),
    ]

    def __init__(self, title: str, source: str) -> None:
        header = FleetHeader(title, source, id="node-header")
        nodes = NodesPane(id="nodes")
        models = ModelsPane(id="models", fleet=True)
        stages = StagesPane(id="stages", fleet=True)
        sessions = SessionsPane(id="sessions", fleet=True)
        health = HealthPane(id="health", fleet=True)
        events = EventsLog(id="events", fleet=True)
        super().__init__(header, (nodes, models, stages, sessions, health, events), events)
        self.add_class("-fleet")
        self.header = header
        self.nodes = nodes
        self.models = models
        self.stages = stages
        self.sessions = sessions
        self.health = health
        self.node_filter: str | None = None
        """The node the panes show (None: every node)."""
        self._shown = FleetSnapshot()
        self._live = FleetSnapshot()

    def on_mount(self) -> None:
        super().on_mount()
        self._set_scope()

    def show(self, snapshot: FleetSnapshot) -> bool:
        """Draw `snapshot` in every pane; False (nothing drawn) until all panes are mounted."""
        if not self.panes_mounted():
            return False
        self._shown = snapshot
        for pane in self.panes:
            pane.show_fleet(snapshot, self.node_filter)
        return True

    def show_header(self, shown: FleetSnapshot, live: FleetSnapshot) -> None:
        self._live = live
        if self.header.is_mounted:
            self.header.show(shown, live, self.node_filter)

    def set_node_filter(self, node: str | None) -> None:
        """Show only `node`'s rows (every node's when None), and say so in the titles."""
        self.node_filter = node
        self._set_scope()
        if self.panes_mounted():
            for pane in self.panes:
                pane.show_fleet(self._shown, node)
        if self.header.is_mounted:
            self.header.show(self._shown, self._live, node)

    def _set_scope(self) -> None:
        for pane in self.panes:
            if pane is not self.nodes:
                pane.set_scope(filter_label(self.node_filter))

    def action_next_node(self) -> None:
        """every node → each node in turn → every node."""
        names = self._live.names or self._shown.names
        if not names:
            return
        if self.node_filter not in names:
            self.set_node_filter(names[0])
        else:
            index = names.index(self.node_filter)
            self.set_node_filter(names[index + 1] if index + 1 < len(names) else None)
