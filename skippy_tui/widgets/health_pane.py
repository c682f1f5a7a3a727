"""Pane 4, Event health: is the event system keeping up, and what did it give up?

Shows the runtime's own health totals (drops by delivery class, coalesced, sampled, subscriber lag
and disconnects, unknown native events, sequence gaps, reducer errors), ingress pressure reports,
the client reducer's own rejections, and records the client could not decode — then two
sparklines over the last `RATE_WINDOW_S` seconds of event time: events/s and drops/s. Nonzero drop
counts are drawn as alerts; the pane gets the `-alert` class while any were reported.

In the fleet dashboard the counters are a grid with a row per node the filter selects (its
node first, then events, drops of every class summed, subscribers lagging or dropped, sequence
gaps, reducer errors and local rejections summed, records skipped), and the sparklines add up
those nodes' per-second counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from skippy_tui import format as fmt
from skippy_tui.fleet_store import FleetSnapshot, NodeSnapshot
from skippy_tui.store import DEFAULT_RATE_WINDOW_S, DashboardSnapshot, RateSample
from skippy_tui.widgets.pane import Pane, node_cell
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


FLEET_COLUMNS: Final = ("node", "events", "drops", "lag", "gaps", "rej.", "skips")
"""Short labels: the pane is 46 columns wide on a large terminal (`?` help says what they are)."""
NODE_LABEL_WIDTH: Final = 8


def drops_of(snapshot: DashboardSnapshot) -> int:
    """Events the runtime reported dropped, every delivery class and the native ring summed."""
    health = snapshot.view.event_system
    return (
        health.dropped_terminal
        + health.dropped_state
        + health.dropped_progress
        + health.dropped_diagnostic
        + health.dropped_native
    )


def node_health_row(name: str, snapshot: DashboardSnapshot) -> tuple[Text, ...]:
    """A node's counters in the fleet dashboard: events, drops (every class), subscribers
    lagging or dropped, sequence gaps, reducer errors and local rejections, records skipped."""
    health = snapshot.view.event_system
    rejects = health.reducer_errors + snapshot.view.counters.rejected_transitions
    return (
        node_cell(name, snapshot),
        _n(snapshot.events_total, ""),
        _n(drops_of(snapshot)),
        _n(health.lagging_subscribers + health.disconnected_subscribers, "yellow"),
        _n(health.sequence_gaps, "yellow"),
        _n(rejects, "yellow"),
        _n(sum(snapshot.skipped.values()), "yellow"),
    )


def fleet_health_table(nodes: Sequence[NodeSnapshot]) -> RenderableType:
    """The fleet's counters: a row per node (a pure function of the snapshots)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, max_width=NODE_LABEL_WIDTH, overflow="ellipsis")
    for _ in FLEET_COLUMNS[1:]:
        grid.add_column(justify="right", no_wrap=True)
    grid.add_row(*(Text(label, style="grey62") for label in FLEET_COLUMNS))
    for node in nodes:
        grid.add_row(*node_health_row(node.name, node.dashboard))
    return grid


def merged_rates(
    rates: Iterable[tuple[RateSample, ...]], window: int = RATE_WINDOW_S
) -> tuple[RateSample, ...]:
    """Several runtimes' per-second samples added up, second by second, over the `window`
    seconds up to the newest second any of them has (seconds none has count as zero)."""
    totals: dict[int, tuple[int, int]] = {}
    for samples in rates:
        for sample in samples:
            events, drops = totals.get(sample.second, (0, 0))
            totals[sample.second] = (events + sample.events, drops + sample.drops)
    if not totals:
        return ()
    last = max(totals)
    return tuple(
        RateSample(second, *totals.get(second, (0, 0)))
        for second in range(last - window + 1, last + 1)
    )


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

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, fleet=fleet)
        self._counters = Static(id="health-counters")
        self._events_spark = Sparkline([], id="events-spark")
        self._drops_spark = Sparkline([], id="drops-spark")
        self._events_rate = Static("", classes="spark-value")
        self._drops_rate = Static("", classes="spark-value")
        self._version = -1
        self._drawn: tuple[int, str | None] | None = None

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
        self._show_rates(snapshot.rates, alert=_alert(snapshot))

    def show_fleet(self, fleet: FleetSnapshot, node_filter: str | None) -> None:
        key = (fleet.version, node_filter)
        if key == self._drawn:
            return
        self._drawn = key
        nodes = fleet.shown(node_filter)
        self._counters.update(fleet_health_table(nodes))
        rates = merged_rates(n.dashboard.rates for n in nodes)
        self._show_rates(rates, alert=any(_alert(n.dashboard) for n in nodes))
        dropping = sum(1 for n in nodes if drops_of(n.dashboard))
        self.border_subtitle = f"{fmt.plural(dropping, 'node')} dropping" if dropping else ""

    def _show_rates(self, rates: Sequence[RateSample], alert: bool) -> None:
        events = series(tuple(rates), drops=False)
        drops = series(tuple(rates), drops=True)
        self._events_spark.data = events
        self._drops_spark.data = drops
        self._events_rate.update(_rate_label(events, "/s"))
        self._drops_rate.update(_rate_label(drops, "/s"))
        self.set_class(alert, "-alert")


def _alert(snapshot: DashboardSnapshot) -> bool:
    """Whether the runtime reported drops (in its totals or in the rate window)."""
    return bool(drops_of(snapshot) or any(s.drops for s in snapshot.rates))
