"""Snapshot tests (pytest-textual-snapshot) of every pane in its main states.

States are the deterministic `skippy_tui.demo` scenarios (fixed timestamps, no clock on screen).
Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and
review the SVGs under `tests/tui/__snapshots__/`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from skippy_tui import demo
from skippy_tui.app import SkippyDashboard
from skippy_tui.screens.help import HelpScreen
from skippy_tui.sources import ReplaySource
from skippyctl.events.envelope import Event

from .conftest import SETTLE_TIMEOUT_S, dashboard, settle

DATA = Path(__file__).parent / "data"

SnapCompare = Callable[..., bool]

SCENARIOS: dict[str, Callable[[], list[Event]]] = {
    "loading": demo.loading,
    "available": demo.available,
    "failed": demo.failed,
    "sessions": demo.sessions,
    "pressure": demo.pressure,
    "topology": demo.topology,
}


@pytest.mark.parametrize("state", list(SCENARIOS))
def test_dashboard_in_state(snap_compare: SnapCompare, state: str) -> None:
    """All five panes at 120×40."""
    app = dashboard(SCENARIOS[state]())
    assert snap_compare(app, terminal_size=(120, 40), run_before=settle)


@pytest.mark.parametrize(
    ("state", "key"),
    [
        ("loading", "1"),
        ("topology", "2"),
        ("sessions", "3"),
        ("pressure", "4"),
        ("failed", "5"),
    ],
)
def test_each_pane_on_a_small_terminal(snap_compare: SnapCompare, state: str, key: str) -> None:
    """80×24: Models on top and the pane selected with its number key below."""
    app = dashboard(SCENARIOS[state]())
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle, press=[key])


def test_paused_banner(snap_compare: SnapCompare) -> None:
    app = dashboard(demo.sessions())

    async def pause(pilot: Any) -> None:
        # Pressed here and waited for, not through `press=`: on a loaded machine the screenshot
        # was once taken before the banner was laid out.
        await settle(pilot)
        await pilot.press("p")
        for _ in range(200):
            if pilot.app.paused and pilot.app.dashboard.banner.display:
                break
            await pilot.pause(0.01)
        assert pilot.app.paused, "the dashboard did not pause"
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 40), run_before=pause)


def test_help_screen(snap_compare: SnapCompare) -> None:
    app = dashboard(demo.available())

    async def open_help(pilot: Any) -> None:
        # Wait for the modal to be mounted, laid out and focused rather than for a fixed number of
        # idle ticks: on a loaded CI machine the screenshot was once taken a step too early.
        await settle(pilot)
        await pilot.press("question_mark")
        for _ in range(200):
            screen = pilot.app.screen
            if (
                isinstance(screen, HelpScreen)
                and screen.focused is not None
                and screen.query_one("#help-text").size.height > 0
            ):
                break
            await pilot.pause(0.01)
        assert isinstance(pilot.app.screen, HelpScreen), "the help screen did not open"
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=open_help)


def test_events_filtered_by_model(snap_compare: SnapCompare) -> None:
    app = dashboard(demo.failed())

    async def filter_broken(pilot: Any) -> None:
        await settle(pilot)
        await pilot.press("slash", *"model:broken", "enter")

    assert snap_compare(app, terminal_size=(120, 40), run_before=filter_broken)


@pytest.mark.parametrize(("size", "press"), [((120, 40), []), ((80, 24), ["2"])])
def test_a_recorded_split_load_with_a_lost_stage(
    snap_compare: SnapCompare, size: tuple[int, int], press: list[str]
) -> None:
    """`split-2-lost.ndjson`: the events of a real split load of tiny.gguf over two `stage serve`
    workers, then a request during which stage #1's worker was killed (SIGKILL): the Stages pane
    shows the topology's two stages with their layers and memory, stage #1 lost in the error
    style, and no "local stage" row."""
    source = ReplaySource(DATA / "split-2-lost.ndjson", speed=math.inf)
    app = SkippyDashboard(source, title="skippy")

    async def replayed(pilot: Any) -> None:
        assert await asyncio.to_thread(source.done.wait, SETTLE_TIMEOUT_S)
        app.poll()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=replayed, press=press)
