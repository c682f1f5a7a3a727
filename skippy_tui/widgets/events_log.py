"""Pane 5, Events: the recent events, newest first, coloured by severity, with a filter.

Each row: UTC time, severity, event id, model, then the reason code (when there is one) and the
summary rendered from typed fields by `skippyctl.output.summary.render_summary` (the same text as
`--json`'s `summary`). At most `MAX_LOG_ROWS` matching rows are kept from the store's bounded
recent-events buffer; only the visible ones are rendered (see `EventLines`).

`/` (a dashboard binding) calls `open_filter`: an input appears; typing filters live (see
`skippy_tui.filtering` for the syntax), enter returns to the log keeping the filter, escape clears
it. The filter never changes what is reduced or buffered, only what is drawn.

In the fleet dashboard the rows are the fleet log's (every node's events in arrival order), each
with its node after the time; the node filter and the text filter (`node:NAME` among its terms)
both apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from skippy_tui.filtering import EventFilter
from skippy_tui.fleet_store import FleetSnapshot
from skippy_tui.store import DashboardSnapshot
from skippy_tui.widgets.event_lines import EventLines, NodeRow, Row, header_line
from skippy_tui.widgets.pane import Pane

MAX_LOG_ROWS: Final = 1000


def matching(
    snapshot: DashboardSnapshot, flt: EventFilter, limit: int = MAX_LOG_ROWS
) -> Iterator[Row]:
    """(sequence number, event) of the newest matching events, newest first, at most `limit`."""
    recent = snapshot.recent
    first = snapshot.events_total - len(recent) + 1
    shown = 0
    for index in range(len(recent) - 1, -1, -1):
        if shown >= limit:
            return
        event = recent[index]
        if flt.matches(event):
            shown += 1
            yield Row(first + index, event)


def matching_fleet(
    snapshot: FleetSnapshot,
    flt: EventFilter,
    node_filter: str | None = None,
    limit: int = MAX_LOG_ROWS,
) -> Iterator[NodeRow]:
    """The newest matching events of the fleet log (of `node_filter` only, when given), newest
    first, at most `limit`, each with its fleet-wide sequence number and its node."""
    recent = snapshot.recent
    first = snapshot.events_total - len(recent) + 1
    shown = 0
    for index in range(len(recent) - 1, -1, -1):
        if shown >= limit:
            return
        node, event = recent[index]
        if (node_filter is None or node == node_filter) and flt.matches(event, node):
            shown += 1
            yield NodeRow(first + index, event, node)


class EventsLog(Pane):
    """Recent events with a live filter."""

    NUMBER = 5
    TITLE = "Events"

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, fleet=fleet)
        self.lines = EventLines(id="events-lines")
        self._input = Input(
            placeholder="filter: text, cat:…, id:…, model:…, sev:warning, reason:…",
            id="events-filter",
        )
        self.filter = EventFilter()
        self._snapshot = DashboardSnapshot()
        self._fleet = FleetSnapshot()
        self._node_filter: str | None = None
        self._drawn: tuple[int, str, str | None] = (-1, "", None)

    def compose(self) -> ComposeResult:
        yield self._input
        yield Static(header_line(self.fleet), id="events-header")
        yield self.lines

    def on_mount(self) -> None:
        self._input.display = False

    def main_widget(self) -> EventLines:
        return self.lines

    def open_filter(self) -> None:
        self._input.display = True
        self._input.focus()

    def set_filter(self, text: str) -> None:
        self.filter = EventFilter.parse(text)
        self._draw()

    def action_clear_filter(self) -> None:
        self._input.value = ""
        self._input.display = False
        self.set_filter("")
        self.lines.focus()

    @on(Input.Changed, "#events-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.set_filter(event.value)

    @on(Input.Submitted, "#events-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.set_filter(event.value)
        if not self.filter.active:
            self._input.display = False
        self.lines.focus()

    def show(self, snapshot: DashboardSnapshot) -> None:
        self._snapshot = snapshot
        self._draw()

    def show_fleet(self, fleet: FleetSnapshot, node_filter: str | None) -> None:
        self._fleet = fleet
        self._node_filter = node_filter
        self._draw()

    def _draw(self) -> None:
        version = self._fleet.version if self.fleet else self._snapshot.version
        key = (version, self.filter.text, self._node_filter)
        if key == self._drawn:
            return
        self._drawn = key
        rows: list[Row | NodeRow]
        if self.fleet:
            rows = list(matching_fleet(self._fleet, self.filter, self._node_filter))
            held = len(self._fleet.recent)
        else:
            rows = list(matching(self._snapshot, self.filter))
            held = len(self._snapshot.recent)
        self.lines.set_rows(rows)
        if self.filter.active:
            self.border_subtitle = f"filter: {self.filter.text} · {len(rows):,} of {held:,}"
        else:
            self.border_subtitle = f"{len(rows):,} of {held:,} held"
