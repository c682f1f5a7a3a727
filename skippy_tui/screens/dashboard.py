"""The main screen: header, PAUSED banner, the panes, footer; pane focus and layout.

Layout (app.tcss): on a large terminal a grid — Models across the top, Stages | Sessions, then
Event health | Events. On a small one (narrower than `WIDE_MIN_COLUMNS` or shorter than
`TALL_MIN_ROWS`, e.g. 80×24) Models stays on top and the four detail panes share the space below,
one at a time: the focused one (Events by default). Keys `1`–`5`, tab and shift+tab move focus
between panes in both layouts, bringing a hidden detail pane into view.

`PaneScreen` is what the single-runtime screen (`DashboardScreen`, here) and the fleet's
(`skippy_tui.screens.fleet_dashboard`) share: the banner, the body of panes, focus and layout.

Contract: `show(snapshot)` fans a snapshot out to the panes (UI thread only); `show_header`
updates only the header, whose connection status the app keeps live while paused.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.events import DescendantFocus
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from skippy_tui.store import DashboardSnapshot
from skippy_tui.widgets.events_log import EventsLog
from skippy_tui.widgets.health_pane import HealthPane
from skippy_tui.widgets.models_pane import ModelsPane
from skippy_tui.widgets.node_header import NodeHeader
from skippy_tui.widgets.pane import Pane
from skippy_tui.widgets.paused_banner import PausedBanner
from skippy_tui.widgets.sessions_pane import SessionsPane
from skippy_tui.widgets.stages_pane import StagesPane

WIDE_MIN_COLUMNS: Final = 100
SnapshotT = TypeVar("SnapshotT")
"""What a dashboard screen draws: one runtime's snapshot, or a fleet's."""
TALL_MIN_ROWS: Final = 32
DEFAULT_DETAIL: Final = "events"


class PaneScreen(Screen[None], Generic[SnapshotT]):
    """A header, the PAUSED banner, a body of numbered panes and the footer; a subclass draws
    its kind of snapshot (`show`, `show_header`)."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_MIN_COLUMNS, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_MIN_ROWS, "-tall")]

    BINDINGS = [
        Binding("tab", "next_pane", "Next pane", show=False),
        Binding("shift+tab", "previous_pane", "Previous pane", show=False),
        Binding("1", "focus_pane(1)", "Panes", key_display="1-5"),
        Binding("2", "focus_pane(2)", "Stages", show=False),
        Binding("3", "focus_pane(3)", "Sessions", show=False),
        Binding("4", "focus_pane(4)", "Health", show=False),
        Binding("5", "focus_pane(5)", "Events", show=False),
        Binding("slash", "filter", "Filter"),
    ]

    def __init__(self, header: Widget, panes: tuple[Pane, ...], events: EventsLog) -> None:
        """`panes` in focus order (the first is focused at start); `events` is among them."""
        super().__init__(id="dashboard")
        self.header_line = header
        self.banner = PausedBanner(id="paused-banner")
        self.panes = panes
        self.events = events

    def compose(self) -> ComposeResult:
        yield self.header_line
        yield self.banner
        with Container(id="body"):
            yield from self.panes
        yield Footer()

    def on_mount(self) -> None:
        self.banner.display = False
        self._show_detail(self.events)
        self.panes[0].focus_pane()

    def show(self, snapshot: SnapshotT) -> bool:
        """Draw `snapshot` in every pane; False (nothing drawn) until all panes are mounted."""
        raise NotImplementedError

    def show_header(self, shown: SnapshotT, live: SnapshotT) -> None:
        """The header: what the panes show (`shown`, frozen while paused) and the live state."""
        raise NotImplementedError

    def panes_mounted(self) -> bool:
        return all(pane.is_mounted for pane in self.panes)

    def current_pane(self) -> Pane | None:
        node: Widget | None = self.focused
        while node is not None:
            if isinstance(node, Pane):
                return node
            parent = node.parent
            node = parent if isinstance(parent, Widget) else None
        return None

    def _show_detail(self, pane: Pane) -> None:
        """Make `pane` the detail pane shown on a small terminal (no effect on a large one)."""
        if not pane.DETAIL:
            return
        for other in self.panes:
            other.set_class(other is pane, "-shown")

    def _focus(self, pane: Pane) -> None:
        self._show_detail(pane)
        pane.focus_pane()

    def action_focus_pane(self, number: int) -> None:
        pane = next((p for p in self.panes if number == p.NUMBER), None)
        if pane is not None:
            self._focus(pane)

    def _step(self, delta: int) -> None:
        current = self.current_pane()
        index = self.panes.index(current) if current is not None else -delta
        self._focus(self.panes[(index + delta) % len(self.panes)])

    def action_next_pane(self) -> None:
        self._step(1)

    def action_previous_pane(self) -> None:
        self._step(-1)

    def action_filter(self) -> None:
        self._show_detail(self.events)
        self.events.open_filter()

    @on(DescendantFocus)
    def _track_focus(self, event: DescendantFocus) -> None:
        pane = self.current_pane()
        if pane is not None:
            self._show_detail(pane)


class DashboardScreen(PaneScreen[DashboardSnapshot]):
    """The dashboard of one runtime."""

    def __init__(self, title: str, source: str) -> None:
        header = NodeHeader(title, source, id="node-header")
        models = ModelsPane(id="models")
        stages = StagesPane(id="stages")
        sessions = SessionsPane(id="sessions")
        health = HealthPane(id="health")
        events = EventsLog(id="events")
        super().__init__(header, (models, stages, sessions, health, events), events)
        self.header = header
        self.models = models
        self.stages = stages
        self.sessions = sessions
        self.health = health

    def show(self, snapshot: DashboardSnapshot) -> bool:
        """Draw `snapshot` in every pane; False (nothing drawn) until all panes are mounted."""
        if not self.panes_mounted():
            return False
        for pane in self.panes:
            pane.show(snapshot)
        return True

    def show_header(self, shown: DashboardSnapshot, live: DashboardSnapshot) -> None:
        if self.header.is_mounted:
            self.header.show(shown, live)
