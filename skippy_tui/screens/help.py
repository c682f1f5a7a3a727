"""The `?` help screen: keys, panes, and what the colours mean. Escape, `?` or `q` close it.
The fleet dashboard's (`HelpScreen(fleet=True)`) begins with its own keys and panes."""

from __future__ import annotations

from typing import Final

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: Final = (
    ("p", "pause / resume drawing (PAUSED banner; events keep being reduced, bounded)"),
    ("/", "filter the events log (text, cat:…, id:…, model:…, sev:warning, reason:…)"),
    ("escape", "in the filter: clear it"),
    ("tab / shift+tab", "focus the next / previous pane"),
    ("1 – 5", "focus Models, Stages, Sessions, Event health, Events"),
    (": or ctrl+p", "command palette: load model…, unload model…"),
    ("?", "this help"),
    ("q", "quit"),
)

PANES: Final = (
    ("1 Models", "state, load phase and progress, device, memory, context, lanes, queue, decode"),
    ("2 Stages", "each split model's topology and stages with links; others: one process"),
    ("3 Sessions", "sessions and in-flight requests: lane, state, tokens, TTFT, queue wait"),
    ("4 Event health", "drops by class, coalescing, sampling, lag, rejections; events/s, drops/s"),
    ("5 Events", "recent events, newest first, coloured by severity"),
)

FLEET_KEYS: Final = (
    ("n", "node filter: every node → each node in turn → every node (titles say which)"),
    ("0", "focus Nodes"),
    ("node:NAME", "in the events filter: that node's events"),
)

FLEET_PANES: Final = (
    ("0 Nodes", "each runtime: reachable or down (reason, retry), version, models, load, stream"),
    ("1 – 5", "as for one runtime, with a node column; load/unload act on the filtered node"),
)

STATES: Final = (
    ("loading", "cyan", "requested, loading weights, initializing serving — never 'down'"),
    ("available", "green", "serving requests"),
    ("degraded", "yellow", "serving with reduced capacity or health"),
    ("unavailable", "red", "cannot serve (the reason code says why)"),
    ("failed", "bold red", "the load failed (the reason code says why)"),
    ("unloading", "magenta", "draining sessions before unload"),
)


def help_text(fleet: bool = False) -> Table:
    """The help as a table; the fleet dashboard's keys and panes first when `fleet`."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row(Text("Keys", style="bold underline"), "")
    for key, what in (*FLEET_KEYS, *KEYS) if fleet else KEYS:
        table.add_row(Text(key, style="bold cyan"), what)
    table.add_row("", "")
    table.add_row(Text("Panes", style="bold underline"), "")
    for name, what in (*FLEET_PANES, *PANES) if fleet else PANES:
        table.add_row(name, what)
    table.add_row("", "")
    table.add_row(Text("Model states", style="bold underline"), "")
    for name, style, what in STATES:
        table.add_row(Text(name, style=style), what)
    return table


class HelpScreen(ModalScreen[None]):
    """A modal summary of keys and panes."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def __init__(self, fleet: bool = False) -> None:
        super().__init__()
        self.fleet = fleet

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = (
                "skippy fleet dashboard — help" if self.fleet else ("skippy dashboard — help")
            )
            body.border_subtitle = "escape closes"
            yield Static(help_text(self.fleet), id="help-text")
