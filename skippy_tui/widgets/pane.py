"""`Pane`: the titled, numbered container every dashboard pane derives from.

Contract: a pane draws only from a `DashboardSnapshot` passed to `show` (on the UI thread, from
the app's poll timer); it never reads the store or a source itself. `show` must be cheap when the
inputs it depends on did not change (panes compare the immutable views by identity).
Columns and other children are set up in `on_mount` (they need the running app), and the screen
only calls `show` once every pane is mounted. `focus_pane` focuses the pane's main widget, which
is how keys `1`–`5` and tab move between panes.
"""

from __future__ import annotations

from typing import ClassVar

from textual.containers import Vertical
from textual.widget import Widget

from skippy_tui.store import DashboardSnapshot


class Pane(Vertical):
    """A bordered pane with a numbered title ("1 Models")."""

    NUMBER: ClassVar[int] = 0
    TITLE: ClassVar[str] = ""
    DETAIL: ClassVar[bool] = True
    """Detail panes share the lower area on a small terminal; only one is shown there."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="pane -detail" if self.DETAIL else "pane")
        self.border_title = f"{self.NUMBER} {self.TITLE}"

    def show(self, snapshot: DashboardSnapshot) -> None:
        """Draw `snapshot`; subclasses override."""

    def main_widget(self) -> Widget:
        """The widget that takes focus for this pane (the pane itself when nothing inside can)."""
        for child in self.query("*"):
            if child.focusable and child.display:
                return child
        return self

    def focus_pane(self) -> None:
        self.main_widget().focus()
