"""`Pane`: the titled, numbered container every dashboard pane derives from.

Contract: a pane draws only from a snapshot passed to `show` (one runtime's `DashboardSnapshot`)
or `show_fleet` (a `FleetSnapshot` and the node filter), on the UI thread, from the app's poll
timer; it never reads the store or a source itself. `show` must be cheap when the inputs it
depends on did not change (panes compare the immutable views by identity). Columns and other
children are set up in `on_mount` (they need the running app), and the screen only calls `show`
once every pane is mounted. `focus_pane` focuses the pane's main widget, which is how number
keys and tab move between panes.

Fleet mode (`fleet=True`, the fleet dashboard's panes): a table pane gains a first column, the
node, and draws the rows of every node the filter selects (`show_parts`: the same rows as one
runtime's, each keyed and labelled with its node). A pane built without it draws exactly as the
single-runtime dashboard always did: `show(snapshot)` is `show_parts` of one part without a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final

from rich.text import Text
from textual.containers import Vertical
from textual.widget import Widget

from skippy_tui.fleet_store import FleetSnapshot
from skippy_tui.store import Connection, DashboardSnapshot

NODE_COLUMN: Final = "Node"
NODE_STYLE: Final = "magenta"
NODE_DOWN_STYLE: Final = "bold red"

NodePart = tuple[str | None, DashboardSnapshot]
"""One runtime's snapshot and its node's name (None: the single-runtime dashboard, no node
column)."""


def node_cell(name: str, snapshot: DashboardSnapshot) -> Text:
    """A row's node; in the error style while the node is down (its rows are then its last
    known state)."""
    down = snapshot.connection is Connection.DOWN
    # A span, not the text's base style: `Text` equality ignores the base style, and the tables
    # redraw only cells that compare unequal (`KeyedRows`).
    return Text().append(name, style=NODE_DOWN_STYLE if down else NODE_STYLE)


def row_key(name: str | None, key: str) -> str:
    """A row's key, made unique across nodes (no node name holds a `/`)."""
    return key if name is None else f"{name}/{key}"


def same_inputs(inputs: Sequence[object], drawn: Sequence[object] | None) -> bool:
    """Whether `inputs` are the very objects last drawn (immutable views compared by identity)."""
    return (
        drawn is not None
        and len(inputs) == len(drawn)
        and all(a is b for a, b in zip(inputs, drawn, strict=True))
    )


class Pane(Vertical):
    """A bordered pane with a numbered title ("1 Models")."""

    NUMBER: ClassVar[int] = 0
    TITLE: ClassVar[str] = ""
    DETAIL: ClassVar[bool] = True
    """Detail panes share the lower area on a small terminal; only one is shown there."""

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, classes="pane -detail" if self.DETAIL else "pane")
        self.fleet = fleet
        self.border_title = f"{self.NUMBER} {self.TITLE}"

    def set_scope(self, scope: str | None) -> None:
        """Say in the title which nodes the pane shows (`1 Models · gpu1`)."""
        title = f"{self.NUMBER} {self.TITLE}"
        self.border_title = title if scope is None else f"{title} · {scope}"

    def show(self, snapshot: DashboardSnapshot) -> None:
        """Draw one runtime's `snapshot` (no node column)."""
        self.show_parts(((None, snapshot),))

    def show_fleet(self, fleet: FleetSnapshot, node_filter: str | None) -> None:
        """Draw the nodes `node_filter` selects (every node when None), with their node."""
        self.show_parts(tuple((node.name, node.dashboard) for node in fleet.shown(node_filter)))

    def show_parts(self, parts: Sequence[NodePart]) -> None:
        """Draw `parts`; subclasses override."""

    def main_widget(self) -> Widget:
        """The widget that takes focus for this pane (the pane itself when nothing inside can)."""
        for child in self.query("*"):
            if child.focusable and child.display:
                return child
        return self

    def focus_pane(self) -> None:
        self.main_widget().focus()
