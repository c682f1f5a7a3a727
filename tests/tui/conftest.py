"""Helpers for dashboard tests: run the app over a scenario and wait until it has drawn it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable

from skippy_tui import demo
from skippy_tui.app import SkippyDashboard
from skippy_tui.control import FleetControl
from skippy_tui.demo import script
from skippy_tui.fleet_app import FleetDashboard
from skippy_tui.fleet_source import FleetScriptedSource, FleetSourceItem
from skippy_tui.sources import ScriptedSource, SourceItem
from skippyctl.events.envelope import Event

SETTLE_TIMEOUT_S = 20.0
SETTLE_FRAMES = 100
SETTLE_STABLE_FRAMES = 3
SETTLE_FRAME_S = 0.02


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio through anyio's pytest plugin (Textual needs asyncio)."""
    return "asyncio"


def dashboard(events: Sequence[Event], *, announce_end: bool = False) -> SkippyDashboard:
    """An app whose source delivers `events` at once (zero delays)."""
    source = ScriptedSource(script(events), announce_end=announce_end, description="scripted")
    return SkippyDashboard(source, title="skippy")


def scripted(items: Sequence[tuple[float, SourceItem]]) -> SkippyDashboard:
    return SkippyDashboard(ScriptedSource(items, description="scripted"), title="skippy")


def fleet_dashboard(
    items: Sequence[FleetSourceItem] | None = None,
    control: FleetControl | None = None,
    nodes: Sequence[str] = demo.FLEET_NODES,
) -> FleetDashboard:
    """A fleet dashboard whose source delivers `items` (default: `demo.fleet()`) at once."""
    script = [(0.0, item) for item in (demo.fleet() if items is None else items)]
    source = FleetScriptedSource(script, nodes=nodes, description="scripted fleet")
    return FleetDashboard(source, control, title="skippy fleet")


async def settle(pilot: Pilot[None]) -> None:
    """Wait until the scripted source has delivered everything, then draw the final snapshot."""
    app = pilot.app
    assert isinstance(app, SkippyDashboard | FleetDashboard)
    source = app.source
    assert isinstance(source, ScriptedSource | FleetScriptedSource)
    delivered = await asyncio.to_thread(source.done.wait, SETTLE_TIMEOUT_S)
    assert delivered, "the scripted source did not finish"
    app.poll()
    # Until the screen stops changing: a DataTable sizes its columns in a later refresh, and on a
    # loaded machine one pause had drawn the rows under a header still at its old widths.
    # One unchanged frame was not enough under a loaded run either (a header redrawn at its new
    # widths a few frames later): the screen must hold for SETTLE_STABLE_FRAMES in a row.
    previous = None
    stable = 0
    for _ in range(SETTLE_FRAMES):
        await pilot.pause(SETTLE_FRAME_S)
        screen = app.export_screenshot()
        stable = stable + 1 if screen == previous else 0
        if stable >= SETTLE_STABLE_FRAMES:
            return
        previous = screen
    raise AssertionError(f"the screen still changed after {SETTLE_FRAMES} frames")


def plain(renderable: object) -> str:
    """What a Rich renderable prints, as plain text."""
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(renderable)
    return out.getvalue()


def cell_text(table: DataTable[object], row_key: str, column_key: str) -> str:
    return str(table.get_cell(row_key, column_key))


def column_texts(table: DataTable[object], column_key: str) -> list[str]:
    return [str(value) for value in table.get_column(column_key)]
