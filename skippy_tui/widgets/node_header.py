"""The header line: title, node state, model availability, the source and its connection.

Contract: `show(shown, live)` draws one line: node state and model counts from `shown` (the
snapshot the panes show, frozen while paused, so the line agrees with them) and the connection
from `live` (whether the runtime is reachable is never frozen). When the source reports the
runtime down the line says "runtime down — reconnecting" instead of a node state: the last reduced
state is then stale, not "down" (a loading model stays "loading").
"""

from __future__ import annotations

from collections.abc import Collection

from rich.text import Text
from textual.widgets import Static

from skippy_tui import format as fmt
from skippy_tui.store import Connection, DashboardSnapshot
from skippyctl.reducer.state import LOADING_MODEL_STATES, SERVING_MODEL_STATES, ModelView


def header_text(
    title: str, source: str, snapshot: DashboardSnapshot, live: DashboardSnapshot | None = None
) -> Text:
    """The header as text (a pure function): state from `snapshot`, connection from `live`."""
    view = snapshot.view
    live = live if live is not None else snapshot
    text = Text()
    text.append(f" {title} ", style="bold reverse")
    text.append("  ")
    if live.connection is Connection.DOWN:
        attempt = f" (attempt {live.reconnect_attempt})" if live.reconnect_attempt else ""
        text.append(f"runtime down — reconnecting{attempt}", style="bold white on red")
    else:
        text.append("node ", style="grey62")
        text.append(view.node.value, style=fmt.NODE_STYLES[view.node])
    append_model_counts(text, view.models.values())
    text.append("  │  ", style="grey37")
    text.append(source, style="grey62")
    if live.connection is Connection.CONNECTING:
        text.append(" · connecting…", style="cyan")
    elif live.connection is Connection.ENDED:
        text.append(" · ended", style="grey62")
    return text


def append_model_counts(text: Text, models: Collection[ModelView]) -> None:
    """`  │  N serving · N loading · N models` (loading only when some are)."""
    serving = sum(1 for m in models if m.state in SERVING_MODEL_STATES)
    loading = sum(1 for m in models if m.state in LOADING_MODEL_STATES)
    text.append("  │  ", style="grey37")
    text.append(f"{serving} serving", style="green" if serving else "grey62")
    if loading:
        text.append(f" · {loading} loading", style="cyan")
    text.append(f" · {len(models)} model{'' if len(models) == 1 else 's'}", style="grey62")


class NodeHeader(Static):
    """One line at the top of the dashboard."""

    def __init__(self, title: str, source: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.source = source
        self._drawn: tuple[int, int] = (-1, -1)

    def show(self, shown: DashboardSnapshot, live: DashboardSnapshot) -> None:
        key = (shown.version, live.version)
        if key == self._drawn:
            return
        self._drawn = key
        self.update(header_text(self.title, self.source, shown, live))
        self.set_class(live.connection is Connection.DOWN, "-down")
