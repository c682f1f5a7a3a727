"""`EventLines`: the events log's body, a line-API scroll view that renders only visible rows.

Why not a DataTable: under a flood every poll replaces the rows, and a DataTable re-measures every
cell of every row on each rebuild; this view renders just the lines on screen, each line once per
(event, width), so a redraw costs the same whatever the event rate. Columns have fixed widths:
time, severity, event id, model, then the reason code and summary fill the rest of the line and
end in an ellipsis.

Contract: `set_rows(rows)` replaces the rows (newest first, each with its sequence number). A view
scrolled to the top keeps showing the newest; a view scrolled down keeps the same event at the top
of the screen as newer ones arrive. In the fleet dashboard a row also names its node, drawn in a
column of its own after the time (`header_line(fleet=True)`); sequence numbers are then the fleet
log's, unique across nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from skippy_tui import format as fmt
from skippyctl.events.envelope import Event
from skippyctl.output.summary import render_summary

EVENT_ID_WIDTH: Final = 26
MODEL_WIDTH: Final = 10
NODE_WIDTH: Final = 8
LINE_CACHE_SIZE: Final = 512


class Row(NamedTuple):
    """A line of the log: the event's sequence number (what keeps the view in place as newer
    events arrive) and the event."""

    seq: int
    event: Event


class NodeRow(NamedTuple):
    """A line of the fleet dashboard's log: a `Row` and the event's node."""

    seq: int
    event: Event
    node: str


def header_line(fleet: bool = False) -> Text:
    text = Text(style="bold")
    text.append(f"{'Time (UTC)':<12} ")
    if fleet:
        text.append(f"{'Node':<{NODE_WIDTH}} ")
    text.append(f"{'Sev':<3} {'Event':<{EVENT_ID_WIDTH}} ")
    text.append(f"{'Model':<{MODEL_WIDTH}} Reason · summary")
    return text


def event_line(event: Event, node: str | None = None) -> Text:
    """One event as a line of fixed-width columns (a pure function; the width is applied later),
    with its node after the time when it has one."""
    style = fmt.SEVERITY_STYLES[event.severity]
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(fmt.clock(event.wall_ns), style="grey62")
    text.append(" ")
    if node is not None:
        text.append(_fit(node, NODE_WIDTH), style="magenta")
        text.append(" ")
    text.append(fmt.SEVERITY_LABELS[event.severity], style=style)
    text.append(" ")
    text.append(_fit(event.id.value, EVENT_ID_WIDTH), style=style or "bold")
    text.append(" ")
    text.append(_fit(event.scope.model_id or "", MODEL_WIDTH), style="cyan")
    text.append(" ")
    summary = render_summary(event)
    if event.reason_code is not None and event.reason_code.value not in summary:
        text.append(event.reason_code.value, style="bold red")
        text.append(" · ")
    text.append(summary, style=style)
    return text


def _fit(value: str, width: int) -> str:
    return f"{value:<{width}}" if len(value) <= width else value[: width - 1] + "…"


class EventLines(ScrollView, can_focus=True):
    """Rows of events, newest first; only visible lines are rendered."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: tuple[Row | NodeRow, ...] = ()
        self._cache: LRUCache[tuple[int, int], Strip] = LRUCache(LINE_CACHE_SIZE)

    def set_rows(self, rows: Sequence[Row | NodeRow]) -> None:
        top = self.rows[int(self.scroll_y)].seq if self.scroll_y > 0 and self.rows else None
        self.rows = tuple(rows)
        self.virtual_size = Size(self._width(), len(self.rows))
        if top is not None:
            index = next((i for i, row in enumerate(self.rows) if row.seq <= top), 0)
            self.scroll_to(y=index, animate=False, immediate=True)
        self.refresh()

    def _width(self) -> int:
        """Columns available to text (no scrollbar, no padding): lines never scroll sideways."""
        return self.scrollable_content_region.width

    def on_resize(self) -> None:
        self.virtual_size = Size(self._width(), len(self.rows))

    def render_line(self, y: int) -> Strip:
        width = self._width()
        index = int(self.scroll_y) + y
        style = self.rich_style
        if index >= len(self.rows) or width <= 0:
            return Strip.blank(width, style)
        row = self.rows[index]
        key = (row.seq, width)
        strip = self._cache.get(key)
        if strip is None:
            text = event_line(row.event, row.node if isinstance(row, NodeRow) else None)
            text.truncate(width, overflow="ellipsis", pad=True)
            strip = Strip(text.render(self.app.console), width).simplify()
            self._cache[key] = strip
        return strip.apply_style(style)
