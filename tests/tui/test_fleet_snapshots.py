"""Snapshot tests (pytest-textual-snapshot) of the fleet dashboard: the Nodes pane with three
runtimes (one unreachable, with its reason), and the panes' node column, filtered and not.

The states are `skippy_tui.demo.fleet()` (fixed timestamps, no clock on screen). Update after an
intended change with `pytest tests/tui/test_fleet_snapshots.py --snapshot-update` and review the
SVGs under `tests/tui/__snapshots__/test_fleet_snapshots/`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skippy_tui.fleet_app import FleetDashboard

from .conftest import fleet_dashboard, settle

SnapCompare = Callable[..., bool]


def _settled_with(*keys: str) -> Callable[[Any], Any]:
    """Settle, press `keys`, settle again (waited for, not through `press=`: the filter redraws
    every pane)."""

    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
        app = pilot.app
        assert isinstance(app, FleetDashboard)
        await settle(pilot)

    return run_before


def test_nodes_pane_with_three_nodes_one_unreachable(snap_compare: SnapCompare) -> None:
    """Every pane at 120×40: Nodes on top (local up with a gap and a skipped record, gpu1 up
    after a restart, gpu2 down: node_unreachable, retry 3), then every pane with its node."""
    assert snap_compare(fleet_dashboard(), terminal_size=(120, 40), run_before=settle)


def test_panes_filtered_to_one_node(snap_compare: SnapCompare) -> None:
    """`n` twice: only gpu1's rows, `▸gpu1` in the Nodes pane, `node gpu1` in every title."""
    app = fleet_dashboard()
    assert snap_compare(app, terminal_size=(120, 40), run_before=_settled_with("n", "n"))


def test_sessions_pane_with_its_node_column_on_a_small_terminal(
    snap_compare: SnapCompare,
) -> None:
    """80×24: Nodes and Models on top, the Sessions pane (key 3) below with its node column."""
    app = fleet_dashboard()
    assert snap_compare(app, terminal_size=(80, 24), run_before=_settled_with("3"))
