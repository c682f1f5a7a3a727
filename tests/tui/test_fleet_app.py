"""Pilot tests of the fleet dashboard over scripted fleet sources: the Nodes pane, the node
column, the node filter, and load/unload on the filtered node."""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import orjson
import pytest
from textual.widgets import DataTable

from skippy_tui import demo
from skippy_tui.app import NOT_CONNECTED
from skippy_tui.fleet_app import CHOOSE_NODE, FleetDashboard
from skippy_tui.fleet_source import FleetReplaySource, NodeDown, NodeItem, NodeUp
from skippy_tui.screens.help import HelpScreen
from skippy_tui.screens.load_model import LoadModelScreen
from skippy_tui.screens.unload_model import UnloadModelScreen
from skippy_tui.widgets.pane import Pane
from skippyctl.client.fleet import node_status_record
from skippyctl.output.codec import event_record

from .conftest import SETTLE_TIMEOUT_S, cell_text, column_texts, fleet_dashboard, settle

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def _table(pane: Pane) -> DataTable[object]:
    return pane.query_one(DataTable)


def _header(app: FleetDashboard) -> str:
    return str(app.dashboard.header.render())


async def test_the_nodes_pane_has_a_row_per_node_with_its_reachability_and_stream() -> None:
    app = fleet_dashboard()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = _table(app.dashboard.nodes)
        assert column_texts(nodes, "Node") == [" local", " gpu1", " gpu2"]
        assert cell_text(nodes, "gpu2", "Reachability") == "down: node_unreachable (retry 3)"
        assert cell_text(nodes, "gpu2", "Stream") == "reconnecting"
        assert cell_text(nodes, "gpu2", "Version") == "–"
        assert cell_text(nodes, "local", "Reachability") == "up · accepting"
        assert cell_text(nodes, "local", "Version") == demo.FLEET_VERSION
        assert cell_text(nodes, "local", "Models") == "1/1"
        assert cell_text(nodes, "local", "Stream") == "live · 1 gap · 1 skipped"
        assert cell_text(nodes, "gpu1", "Load") == "3/4 lanes · 2 queued"
        assert cell_text(nodes, "gpu1", "Stream") == "live · 1 restart"
        assert cell_text(nodes, "gpu1", "Seen at") == "09:00:02"
        assert app.dashboard.nodes.border_subtitle == "2/3 up · 1 down"
        header = _header(app)
        assert "fleet 2/3 up · 1 down" in header
        assert "showing all nodes" in header
        assert "2 serving · 2 models" in header


async def test_every_pane_has_a_node_column_and_n_cycles_the_node_filter() -> None:
    app = fleet_dashboard()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.dashboard
        models = _table(screen.models)
        assert column_texts(models, "Node") == ["local", "gpu1"]
        assert column_texts(models, "Model") == ["tiny", "tiny"]
        assert cell_text(models, "gpu1/tiny", "Lanes") == "3/4"
        sessions = screen.sessions.query_one("#sessions-table", DataTable)
        assert set(column_texts(sessions, "Node")) == {"gpu1"}
        assert column_texts(_table(screen.stages), "Node") == ["local", "gpu1"]
        assert screen.models.border_title == "1 Models · all nodes"
        assert {node for _, _, node in screen.events.lines.rows} == {"local", "gpu1"}

        for expected in ("local", "gpu1", "gpu2", None):
            await pilot.press("n")
            await pilot.pause()
            assert screen.node_filter == expected
            scope = "all nodes" if expected is None else f"node {expected}"
            assert f"showing {scope}" in _header(app)
            for pane in screen.panes:
                if pane is not screen.nodes:
                    assert pane.border_title == f"{pane.NUMBER} {pane.TITLE} · {scope}"
            if expected is not None:
                assert set(column_texts(models, "Node")) <= {expected}
                assert {node for _, _, node in screen.events.lines.rows} <= {expected}
            selected = [t for t in column_texts(_table(screen.nodes), "Node") if t[0] == "▸"]
            assert selected == ([] if expected is None else [f"▸{expected}"])
        assert column_texts(models, "Node") == ["local", "gpu1"]
        # gpu2 was never reached: filtered to it, the panes are empty and say so.
        await pilot.press("n", "n", "n")
        await pilot.pause()
        assert screen.node_filter == "gpu2"
        assert models.row_count == 0
        assert screen.models.border_subtitle == "no models"


async def test_the_events_filter_takes_a_node_term() -> None:
    app = fleet_dashboard()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"node:loc", "enter")
        await pilot.pause()
        rows = app.dashboard.events.lines.rows
        assert rows and {node for _, _, node in rows} == {"local"}
        assert len(rows) == len(demo.available())


async def test_number_keys_reach_the_nodes_pane_and_help_names_the_fleet_keys() -> None:
    app = fleet_dashboard()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.dashboard
        assert screen.current_pane() is screen.nodes
        for key, pane in zip("012345", screen.panes, strict=True):
            await pilot.press(key)
            assert screen.current_pane() is pane
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen) and app.screen.fleet


async def test_a_node_that_goes_down_and_comes_back_recovers_by_itself() -> None:
    app = fleet_dashboard(
        [NodeUp("local", "rt-a", "0.1.0"), *(NodeItem("local", e) for e in demo.available())],
        nodes=["local"],
    )
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = _table(app.dashboard.nodes)
        app.store.deliver(NodeDown("local", "node_stream_closed", "closed", 1, 0.25))
        app.poll()
        await pilot.pause()
        assert cell_text(nodes, "local", "Reachability") == ("down: node_stream_closed (retry 1)")
        # Its last known rows stay, with the node drawn in the error style.
        models = _table(app.dashboard.models)
        assert cell_text(models, "local/tiny", "State") == "available"
        assert "red" in str(models.get_cell("local/tiny", "Node").spans[0].style)
        app.store.deliver(NodeUp("local", "rt-a", "0.1.0"))
        app.poll()
        await pilot.pause()
        assert cell_text(nodes, "local", "Reachability") == "up · accepting"
        assert cell_text(nodes, "local", "Stream") == "live"


class FakeFleetControl:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.called = threading.Event()

    def load(self, node: str, path: str) -> None:
        self.calls.append(("load", node, path))
        self.called.set()

    def unload(self, node: str, model_id: str, force: bool) -> None:
        self.calls.append(("unload", node, model_id, str(force)))
        self.called.set()


async def test_load_and_unload_refuse_while_every_node_is_shown() -> None:
    control = FakeFleetControl()
    app = fleet_dashboard(control=control)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_load_model()
        app.action_unload_model()
        await pilot.pause()
        assert [n.message for n in app._notifications] == [CHOOSE_NODE, CHOOSE_NODE]
        assert app.screen is app.dashboard
        assert control.calls == []


async def test_commands_without_a_control_say_not_connected() -> None:
    app = fleet_dashboard()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("n")
        app.action_load_model()
        await pilot.pause()
        assert [n.message for n in app._notifications] == [NOT_CONNECTED]


async def test_load_acts_on_the_node_the_filter_shows() -> None:
    control = FakeFleetControl()
    app = fleet_dashboard(control=control)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("n", "n")  # gpu1
        app.action_load_model()
        await pilot.pause()
        assert isinstance(app.screen, LoadModelScreen)
        assert app.screen.node == "gpu1"
        await pilot.press(*"models/tiny.gguf", "enter")
        assert await asyncio.to_thread(control.called.wait, 5)
        await pilot.pause(0.2)
        assert control.calls == [("load", "gpu1", "models/tiny.gguf")]
        assert any("load tiny.gguf on gpu1" in n.message for n in app._notifications)


async def test_unload_lists_the_filtered_nodes_models() -> None:
    control = FakeFleetControl()
    app = fleet_dashboard(control=control)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("n", "n", "n")  # gpu2: never reached, nothing to unload
        app.action_unload_model()
        await pilot.pause()
        assert app._notifications
        assert [n.message for n in app._notifications][-1] == (
            "No model is loaded or loading on gpu2."
        )
        await pilot.press("n", "n")  # all, then local
        assert app.dashboard.node_filter == "local"
        app.action_unload_model()
        await pilot.pause()
        assert isinstance(app.screen, UnloadModelScreen)
        assert (app.screen.model_ids, app.screen.node) == (("tiny",), "local")
        await pilot.click("#unload")
        assert await asyncio.to_thread(control.called.wait, 5)
        assert control.calls == [("unload", "local", "tiny", "False")]


async def test_a_fleet_recording_replays_into_the_fleet_dashboard(tmp_path: Path) -> None:
    lines = [orjson.dumps(node_status_record(NodeUp("gpu1", "rt-1", "0.1.0"), wall_s=1e9))]
    lines += [
        orjson.dumps({**event_record(e, seq=i), "node": "gpu1"})
        for i, e in enumerate(demo.failed())
    ]
    lines.append(
        orjson.dumps(node_status_record(NodeDown("gpu3", "tls_verify_failed", "bad cert", 4, 5.0)))
    )
    path = tmp_path / "fleet.ndjson"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = FleetReplaySource(path, speed=math.inf)
    app = FleetDashboard(source)
    async with app.run_test(size=SIZE) as pilot:
        assert await asyncio.to_thread(source.done.wait, SETTLE_TIMEOUT_S)
        app.poll()
        await pilot.pause()
        nodes = _table(app.dashboard.nodes)
        assert column_texts(nodes, "Node") == [" gpu1", " gpu3"]
        assert cell_text(nodes, "gpu1", "Models") == "1/2"
        assert cell_text(nodes, "gpu1", "Stream") == "ended"
        assert cell_text(nodes, "gpu3", "Reachability") == "down: tls_verify_failed (retry 4)"
        models = _table(app.dashboard.models)
        assert cell_text(models, "gpu1/broken", "Detail") == "model_format_or_load_failure"
        assert "fleet replay fleet.ndjson" in _header(app)
        assert " · ended" in _header(app)
