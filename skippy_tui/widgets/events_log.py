"""Pane 5, Events: the recent events, newest first, coloured by severity, with a filter.

Each row: UTC time, severity, event id, model, then the reason code (when there is one) and the
summary rendered from typed fields by `skippyctl.output.summary.render_summary` (the same text as
`--json`'s `summary`). At most `MAX_LOG_ROWS` matching rows are kept from the store's bounded
recent-events buffer; only the visible ones are rendered (see `EventLines`).

`/` (a dashboard binding) calls `open_filter`: an input appears; typing filters live (see
`skippy_tui.filtering` for the syntax), enter returns to the log keeping the filter, escape clears
it. The filter never changes what is reduced or buffered, only what is drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from skippy_tui.filtering import EventFilter
from skippy_tui.store import DashboardSnapshot
from skippy_tui.widgets.event_lines import EventLines, Row, header_line
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
            yield first + index, event


class EventsLog(Pane):
    """Recent events with a live filter."""

    NUMBER = 5
    TITLE = "Events"

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines = EventLines(id="events-lines")
        self._input = Input(
            placeholder="filter: text, cat:…, id:…, model:…, sev:warning, reason:…",
            id="events-filter",
        )
        self.filter = EventFilter()
        self._snapshot = DashboardSnapshot()
        self._drawn: tuple[int, str] = (-1, "")

    def compose(self) -> ComposeResult:
        yield self._input
        yield Static(header_line(), id="events-header")
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

    def _draw(self) -> None:
        snapshot = self._snapshot
        key = (snapshot.version, self.filter.text)
        if key == self._drawn:
            return
        self._drawn = key
        rows = list(matching(snapshot, self.filter))
        self.lines.set_rows(rows)
        held = len(snapshot.recent)
        if self.filter.active:
            self.border_subtitle = f"filter: {self.filter.text} · {len(rows):,} of {held:,}"
        else:
            self.border_subtitle = f"{len(rows):,} of {held:,} held"
