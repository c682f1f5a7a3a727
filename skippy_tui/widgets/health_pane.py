"""Pane 4, Event health: is the event system keeping up, and what did it give up?

Shows the runtime's own health totals (drops by delivery class, coalesced, sampled, subscriber lag
and disconnects, unknown native events, sequence gaps, reducer errors), ingress pressure reports,
the client reducer's own rejections, and records the client could not decode — then two
sparklines over the last `RATE_WINDOW_S` seconds of event time: events/s and drops/s. Nonzero drop
counts are drawn as alerts; the pane gets the `-alert` class while any were reported.
"""

from __future__ import annotations

from typing import Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from skippy_tui import format as fmt
from skippy_tui.store import DEFAULT_RATE_WINDOW_S, DashboardSnapshot, RateSample
from skippy_tui.widgets.pane import Pane
from skippyctl.output.codec import RECORD_SKIPS

RATE_WINDOW_S: Final = DEFAULT_RATE_WINDOW_S


LABEL_WIDTH: Final = 13
VALUE_WIDTH: Final = 6


def _n(value: int, alert: str = "bold red") -> Text:
    return Text(fmt.compact(value), style=alert if value else "")


def health_table(snapshot: DashboardSnapshot) -> RenderableType:
    """The counters as a four-column grid (label, value, label, value) and, when the runtime
    reported it, the ingress queue's last depth; a pure function of the snapshot."""
    health = snapshot.view.event_system
    counters = snapshot.view.counters
    ingress = snapshot.ingress
    skipped_records = sum(n for reason, n in snapshot.skipped.items() if reason in RECORD_SKIPS)
    skipped_fields = sum(n for reason, n in snapshot.skipped.items() if reason not in RECORD_SKIPS)
    red, amber = "bold red", "yellow"
    rows: tuple[tuple[str, Text, str, Text], ...] = (
        ("term. drops", _n(health.dropped_terminal, red), "coalesced", _n(health.coalesced, "")),
        ("state drops", _n(health.dropped_state, red), "sampled", _n(health.sampled, amber)),
        (
            "prog. drops",
            _n(health.dropped_progress, red),
            "ingress press",
            _n(ingress.reports, amber),
        ),
        (
            "diag drops",
            _n(health.dropped_diagnostic, red),
            "subs lagging",
            _n(health.lagging_subscribers, amber),
        ),
        (
            "native drops",
            _n(health.dropped_native, red),
            "subs dropped",
            _n(health.disconnected_subscribers, red),
        ),
        (
            "unknown nat.",
            _n(health.unknown_native, amber),
            "seq gaps",
            _n(health.sequence_gaps, amber),
        ),
        (
            "reducer errs",
            _n(health.reducer_errors, amber),
            "local rejects",
            _n(counters.rejected_transitions, amber),
        ),
        (
            "events",
            _n(snapshot.events_total, ""),
            "skipped recs",
            _n(skipped_records + skipped_fields, amber),
        ),
    )
    grid = Table.grid(padding=(0, 1))
    for _ in range(2):
        grid.add_column(style="grey62", no_wrap=True, width=LABEL_WIDTH)
        grid.add_column(justify="right", no_wrap=True, width=VALUE_WIDTH)
    for left, left_value, right, right_value in rows:
        grid.add_row(left, left_value, right, right_value)
    if ingress.last_depth is None:
        return grid
    depth = Text("ingress queue ", style="grey62")
    depth.append(f"{ingress.last_depth:,}")
    if ingress.last_capacity:
        share = 100 * ingress.last_depth / ingress.last_capacity
        depth.append(f" / {ingress.last_capacity:,} ({share:.0f}%)")
    return Group(grid, depth)


def series(rates: tuple[RateSample, ...], drops: bool, window: int = RATE_WINDOW_S) -> list[float]:
    """The last `window` per-second values, zero-padded in front so the x axis is time."""
    values = [float(s.drops if drops else s.events) for s in rates[-window:]]
    return [0.0] * (window - len(values)) + values


def _rate_label(values: list[float], unit: str) -> str:
    last = int(values[-1]) if values else 0
    peak = int(max(values)) if values else 0
    return f"{last:,}{unit} max {peak:,}"


class HealthPane(Pane):
    """Event-system health counters and rate sparklines."""

    NUMBER = 4
    TITLE = "Event health"
    can_focus = True

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._counters = Static(id="health-counters")
        self._events_spark = Sparkline([], id="events-spark")
        self._drops_spark = Sparkline([], id="drops-spark")
        self._events_rate = Static("", classes="spark-value")
        self._drops_rate = Static("", classes="spark-value")
        self._version = -1

    def compose(self) -> ComposeResult:
        yield self._counters
        with Horizontal(classes="spark-row"):
            yield Static("events/s", classes="spark-label")
            yield self._events_spark
            yield self._events_rate
        with Horizontal(classes="spark-row"):
            yield Static("drops/s", classes="spark-label")
            yield self._drops_spark
            yield self._drops_rate

    def main_widget(self) -> HealthPane:
        return self

    def show(self, snapshot: DashboardSnapshot) -> None:
        if snapshot.version == self._version:
            return
        self._version = snapshot.version
        self._counters.update(health_table(snapshot))
        events = series(snapshot.rates, drops=False)
        drops = series(snapshot.rates, drops=True)
        self._events_spark.data = events
        self._drops_spark.data = drops
        self._events_rate.update(_rate_label(events, "/s"))
        self._drops_rate.update(_rate_label(drops, "/s"))
        health = snapshot.view.event_system
        self.set_class(
            bool(
                health.dropped_terminal
                or health.dropped_state
                or health.dropped_progress
                or health.dropped_diagnostic
                or health.dropped_native
                or any(s.drops for s in snapshot.rates)
            ),
            "-alert",
        )
