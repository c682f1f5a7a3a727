"""`FleetDashboard`: the dashboard over a `FleetEventSource` — several runtimes, one screen.

Data flow: as the single-runtime dashboard's (skippy_tui.app), with a `FleetStore` — one
`SnapshotStore` per node and each node's stream health — polled every `POLL_INTERVAL_S`; the
screen (skippy_tui.screens.fleet_dashboard) adds the Nodes pane and a node column to every pane,
and `n` cycles the node filter.

Pause (`p`) freezes the panes; the header's reachability stays live.

Control: "Load model…" and "Unload model…" act on the node the filter selects, through the
`FleetControl` given to the constructor; with every node shown they refuse (`CHOOSE_NODE`),
since no node is implied; without a control they say "not connected".
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from skippy_tui.app import NOT_CONNECTED, DashboardBase, unloadable_models
from skippy_tui.control import FleetControl
from skippy_tui.fleet_source import FleetEventSource
from skippy_tui.fleet_store import FleetSnapshot, FleetStore
from skippy_tui.screens.fleet_dashboard import FleetDashboardScreen
from skippy_tui.screens.help import HelpScreen
from skippy_tui.screens.load_model import LoadModelScreen
from skippy_tui.screens.unload_model import UnloadModelScreen

CHOOSE_NODE: Final = (
    "The dashboard shows every node: press n until it shows the one to act on, then try again."
)


class FleetDashboard(DashboardBase[FleetSnapshot]):
    """Nodes, then models, stages, sessions, event health and recent events of every node."""

    def __init__(
        self,
        source: FleetEventSource,
        control: FleetControl | None = None,
        title: str = "skippy fleet",
        *,
        store: FleetStore | None = None,
    ) -> None:
        the_store = store if store is not None else FleetStore(source.nodes)
        super().__init__(
            FleetDashboardScreen(title, source.description),
            title,
            source,
            the_store,
            FleetSnapshot(),
        )
        self.dashboard: FleetDashboardScreen
        self.source: FleetEventSource = source
        self.store: FleetStore = the_store
        self.control = control

    def _help_screen(self) -> HelpScreen:
        return HelpScreen(fleet=True)

    def _target(self, title: str) -> str | None:
        """The node a control action is for, or None after saying why there is none."""
        if self.control is None:
            self.notify(NOT_CONNECTED, title=title, severity="warning")
            return None
        node = self.dashboard.node_filter
        if node is None:
            self.notify(CHOOSE_NODE, title=title, severity="warning")
        return node

    def action_load_model(self) -> None:
        node = self._target("Load model")
        if node is None:
            return
        self.push_screen(LoadModelScreen(node), callback=lambda path: self._load_chosen(node, path))

    def action_unload_model(self) -> None:
        node = self._target("Unload model")
        if node is None:
            return
        shown = self.store.snapshot().node(node)
        ids = unloadable_models(shown.dashboard.view) if shown is not None else []
        if not ids:
            self.notify(f"No model is loaded or loading on {node}.", title="Unload model")
            return
        self.push_screen(
            UnloadModelScreen(ids, node), callback=lambda choice: self._unload_chosen(node, choice)
        )

    def _load_chosen(self, node: str, path: str | None) -> None:
        control = self.control
        if path is None or control is None:
            return
        self._control_call(lambda: control.load(node, path), f"load {Path(path).name} on {node}")

    def _unload_chosen(self, node: str, choice: tuple[str, bool] | None) -> None:
        control = self.control
        if choice is None or control is None:
            return
        model_id, force = choice
        verb = "force unload" if force else "unload"
        self._control_call(
            lambda: control.unload(node, model_id, force), f"{verb} {model_id} on {node}"
        )
