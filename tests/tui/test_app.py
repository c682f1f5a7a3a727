"""Pilot tests of the dashboard over scripted sources."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from skippy_tui import demo
from skippy_tui.app import NOT_CONNECTED, SkippyDashboard
from skippy_tui.screens.help import HelpScreen
from skippy_tui.screens.load_model import LoadModelScreen
from skippy_tui.screens.unload_model import UnloadModelScreen
from skippy_tui.sources import (
    LoadableModels,
    PushSource,
    ReplaySource,
    RuntimeBack,
    RuntimeDown,
    ScriptedSource,
)
from skippy_tui.store import DEFAULT_MAX_RECENT_EVENTS
from skippy_tui.widgets.events_log import MAX_LOG_ROWS
from skippy_tui.widgets.models_pane import MAX_LOADABLE_ROWS
from skippyctl.output.state_reader import LoadableEntry

from .conftest import cell_text, column_texts, dashboard, plain, scripted, settle

SIZE = (120, 40)
DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.anyio


def _models(app: SkippyDashboard) -> DataTable[object]:
    return app.dashboard.models.query_one("#models-table", DataTable)


def _header(app: SkippyDashboard) -> str:
    return str(app.dashboard.header.render())


async def test_loading_model_shows_phase_and_progress_and_is_never_down() -> None:
    app = dashboard(demo.loading())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = _models(app)
        assert cell_text(table, "tiny", "State") == "loading"
        detail = cell_text(table, "tiny", "Detail")
        assert "loading weights" in detail
        assert "█" in detail and "64%" in detail
        header = _header(app)
        assert "node starting" in header
        assert "down" not in header and "unavailable" not in header
        assert "1 loading" in header


async def test_available_model_shows_device_memory_context_and_lanes() -> None:
    app = dashboard(demo.available())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = _models(app)
        assert cell_text(table, "tiny", "State") == "available"
        assert cell_text(table, "tiny", "Device") == "CPU"
        assert cell_text(table, "tiny", "Weights") == "401.2 KiB"
        assert cell_text(table, "tiny", "Context") == "4,096"
        assert cell_text(table, "tiny", "Lanes") == "0/4"
        assert "node accepting" in _header(app)
        stages = app.dashboard.stages.query_one(DataTable)
        (row,) = column_texts(stages, "Model ▸ topology / stage")
        assert row == "tiny ▸ one process"  # no stage is made up for a model in one process
        assert column_texts(stages, "State") == ["ready"]
        assert app.dashboard.stages.border_subtitle == "1 model in one process"


async def test_failed_model_shows_its_reason_code() -> None:
    app = dashboard(demo.failed())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = _models(app)
        assert cell_text(table, "broken", "State") == "failed"
        assert cell_text(table, "broken", "Detail") == "model_format_or_load_failure"
        assert cell_text(table, "tiny", "State") == "available"
        newest = app.dashboard.events.lines.rows[0][1]
        assert newest.id.value == "model_load_failed"


async def test_several_sessions_and_requests_with_lanes_states_and_timings() -> None:
    app = dashboard(demo.sessions())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        sessions = app.dashboard.sessions.query_one("#sessions-table", DataTable)
        requests = app.dashboard.sessions.query_one("#requests-table", DataTable)
        assert column_texts(sessions, "Session") == ["s-alpha", "s-bravo", "s-charlie", "s-delta"]
        assert column_texts(sessions, "State") == ["active", "active", "active", "idle"]
        assert column_texts(requests, "State") == [
            "decode",
            "decode",
            "prefill",
            "queued",
            "queued",
        ]
        assert cell_text(requests, "req-0002", "Lane") == "0"
        assert cell_text(requests, "req-0002", "Gen") == "87"
        assert cell_text(requests, "req-0002", "TTFT") == "182 ms"
        assert cell_text(requests, "req-0002", "Wait") == "14 ms"
        models = _models(app)
        assert cell_text(models, "tiny", "Lanes") == "3/4"
        assert cell_text(models, "tiny", "Queue") == "2"
        assert cell_text(models, "tiny", "Decode") == "41.7 t/s"


async def test_drops_under_pressure_are_visible_in_the_health_pane() -> None:
    app = dashboard(demo.pressure())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        health = app.dashboard.health
        assert health.has_class("-alert")
        counters = plain(health.query_one("#health-counters", Static).content)
        assert "prog. drops" in counters and "1,008" in counters
        assert "subs lagging" in counters
        events_spark = health.query_one("#events-spark")
        drops_spark = health.query_one("#drops-spark")
        drops = list(drops_spark.data or [])  # type: ignore[attr-defined]  # Sparkline.data
        assert len(drops) == 60 and max(drops) > 0
        assert max(events_spark.data or [0]) > 40  # type: ignore[attr-defined]  # Sparkline.data


async def test_pause_freezes_the_panes_while_events_keep_being_reduced() -> None:
    source = PushSource()
    app = SkippyDashboard(source)
    events = demo.available()
    loading = [e for e in events if e.id.value != "native_model_load_completed"][:12]
    rest = events[len(loading) :]
    async with app.run_test(size=SIZE) as pilot:
        for event in loading:
            source.push(event)
        app.poll()
        await pilot.pause()
        table = _models(app)
        assert cell_text(table, "tiny", "State") == "loading"

        await pilot.press("p")
        assert app.paused
        banner = app.dashboard.banner
        assert banner.display and "PAUSED" in str(banner.render())

        arrived = threading.Event()

        def keep_arriving() -> None:
            for event in rest:
                source.push(event)
            arrived.set()

        threading.Thread(target=keep_arriving, name="test-arrivals").start()
        assert await asyncio.to_thread(arrived.wait, 5)
        await pilot.pause(0.4)  # several poll ticks
        assert app.store.snapshot().view.models["tiny"].state.value == "available"
        assert cell_text(_models(app), "tiny", "State") == "loading"  # frozen
        assert f"{len(rest)} events arrived" in str(banner.render())

        await pilot.press("p")
        await pilot.pause()
        assert not app.paused and not banner.display
        assert cell_text(_models(app), "tiny", "State") == "available"


async def test_slash_filter_narrows_the_log_and_escape_clears_it() -> None:
    app = dashboard(demo.failed())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        log = app.dashboard.events.lines
        everything = len(log.rows)
        await pilot.press("slash")
        filter_input = app.dashboard.events.query_one(Input)
        assert filter_input.display and filter_input.has_focus
        await pilot.press(*"model:broken")
        await pilot.pause()
        assert 0 < len(log.rows) < everything
        assert {event.scope.model_id for _, event in log.rows} == {"broken"}
        await pilot.press("enter")
        assert log.has_focus and filter_input.display  # the filter stays while it is active
        assert "filter: model:broken" in str(app.dashboard.events.border_subtitle)
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert len(log.rows) == everything and not filter_input.display


async def test_question_mark_opens_help_and_escape_closes_it() -> None:
    app = dashboard(demo.loading())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = plain(app.screen.query_one("#help-text", Static).content)
        assert "pause / resume" in help_text and "command palette" in help_text
        await pilot.press("escape")
        assert app.screen is app.dashboard


async def test_number_keys_and_tab_move_focus_between_panes() -> None:
    app = dashboard(demo.sessions())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.dashboard
        assert screen.current_pane() is screen.models
        for key, pane in zip("12345", screen.panes, strict=True):
            await pilot.press(key)
            assert screen.current_pane() is pane
        await pilot.press("tab")
        assert screen.current_pane() is screen.models
        await pilot.press("shift+tab")
        assert screen.current_pane() is screen.events


@pytest.mark.parametrize("scenario", [demo.sessions, demo.topology, demo.pressure])
async def test_small_terminal_shows_models_and_one_detail_pane_at_a_time(
    scenario: object,
) -> None:
    assert callable(scenario)
    app = dashboard(scenario())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.dashboard
        assert screen.has_class("-narrow") and screen.has_class("-short")
        for key in "23451":
            await pilot.press(key)
            await pilot.pause()
            shown = [pane for pane in screen.panes if pane.DETAIL and pane.display]
            assert len(shown) == 1
            if key != "1":
                assert shown[0] is screen.panes[int(key) - 1]
                assert shown[0].region.height > 5
        await pilot.press("tab", "tab", "question_mark", "escape", "p", "p")
        assert screen.models.display


async def test_runtime_down_is_shown_and_a_loading_model_stays_loading() -> None:
    items = [*demo.script(demo.loading()), (0.0, RuntimeDown(attempt=2))]
    app = scripted(items)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert "runtime down — reconnecting (attempt 2)" in _header(app)
        assert cell_text(_models(app), "tiny", "State") == "loading"
        app.store.deliver(RuntimeBack())
        app.poll()
        assert "node starting" in _header(app)


async def test_a_flood_of_events_keeps_the_app_responsive_and_memory_bounded() -> None:
    events = demo.flood(20_000)
    # The first event waits for the app to be up; the other 20,000 follow with zero delay.
    source = ScriptedSource([(0.5, events[0]), *demo.script(events[1:])])
    app = SkippyDashboard(source)
    async with app.run_test(size=SIZE) as pilot:
        while app.store.snapshot().events_total < 1000:
            await asyncio.sleep(0.005)
        assert not source.done.is_set()  # the key is pressed in the middle of the flood
        press = asyncio.create_task(pilot.press("p"))
        while not app.paused and not source.done.is_set():
            await asyncio.sleep(0.002)
        # Responsive: the key is handled while the flood still runs, not queued behind it
        # (measured against the flood itself, not a wall clock a loaded machine would miss).
        assert app.paused
        assert not source.done.is_set(), "the key waited for the flood to end"
        await press
        await pilot.press("p")
        assert await asyncio.to_thread(source.done.wait, 60)
        await pilot.pause(0.3)
        snapshot = app.store.snapshot()
        assert snapshot.events_total == len(events)
        assert len(snapshot.recent) == DEFAULT_MAX_RECENT_EVENTS
        assert snapshot.view.models["tiny"].completed_requests > 3000
        assert len(app.dashboard.events.lines.rows) == MAX_LOG_ROWS
        assert app.shown is snapshot  # the UI caught up with the last snapshot


async def test_commands_without_a_runtime_say_not_connected() -> None:
    app = dashboard(demo.available())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_load_model()
        app.action_unload_model()
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert messages == [NOT_CONNECTED, NOT_CONNECTED]
        assert app.screen is app.dashboard


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.called = threading.Event()

    def load(self, path: str) -> None:
        self.calls.append(("load", path))
        self.called.set()

    def unload(self, model_id: str, force: bool) -> None:
        self.calls.append(("unload", model_id, str(force)))
        self.called.set()


async def test_command_palette_loads_a_model_through_the_control() -> None:
    control = FakeControl()
    app = SkippyDashboard(ScriptedSource(demo.script(demo.available())), control)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("colon")
        await pilot.press(*"Load model")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, LoadModelScreen)
        await pilot.press(*"fixtures/tiny.gguf", "enter")
        assert await asyncio.to_thread(control.called.wait, 5)
        await pilot.pause(0.2)
        assert control.calls == [("load", "fixtures/tiny.gguf")]
        assert any("accepted" in n.message for n in app._notifications)


async def test_unload_dialog_lists_models_and_forces_when_asked() -> None:
    control = FakeControl()
    app = SkippyDashboard(ScriptedSource(demo.script(demo.failed())), control)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_unload_model()
        await pilot.pause()
        assert isinstance(app.screen, UnloadModelScreen)
        assert app.screen.model_ids == ("tiny",)  # the failed model is not unloadable
        await pilot.click("#unload-force")
        await pilot.click("#unload")
        assert await asyncio.to_thread(control.called.wait, 5)
        assert control.calls == [("unload", "tiny", "True")]


async def test_replay_of_a_real_load_shows_the_model_available() -> None:
    """`skippyctl load fixtures/tiny.gguf --json` output, recorded: a slice of the stream."""
    source = ReplaySource(DATA / "load-tiny.ndjson", speed=math.inf)
    app = SkippyDashboard(source)
    async with app.run_test(size=SIZE) as pilot:
        assert await asyncio.to_thread(source.done.wait, 10)
        await pilot.pause(0.3)
        snapshot = app.store.snapshot()
        assert snapshot.skipped == {}
        assert snapshot.view.counters.rejected_transitions == 0
        assert cell_text(_models(app), "tiny", "State") == "available"
        assert "node accepting" in _header(app)
        assert "ended" in _header(app)


async def test_loadable_models_are_rows_after_the_loaded_ones_until_they_load() -> None:
    listed = (
        LoadableEntry("tiny", "models_dir"),  # the client already sees it serving
        LoadableEntry("held", "preset", pinned=True),
        LoadableEntry("brief", "preset", idle_ttl_s=90),
        LoadableEntry("shelved", "hub_cache"),
    )
    app = scripted([*demo.script(demo.available()), (0.0, LoadableModels(listed))])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = _models(app)
        assert column_texts(table, "Model") == ["tiny", "held", "brief", "shelved"]
        assert cell_text(table, "tiny", "State") == "available"
        assert cell_text(table, "loadable/held", "State") == "loadable"
        assert cell_text(table, "loadable/held", "Detail") == "preset · pinned"
        assert cell_text(table, "loadable/brief", "Detail") == "preset · idle 1m30s"
        assert cell_text(table, "loadable/shelved", "Detail") == "hub_cache"
        assert cell_text(table, "loadable/shelved", "Device") == "–"
        assert app.dashboard.models.border_subtitle == "1/1 serving · 3 loadable"
        # The next reading: "held" loaded (the runtime no longer lists it).
        app.store.deliver(LoadableModels(listed[2:]))
        app.poll()
        await pilot.pause()
        assert column_texts(table, "Model") == ["tiny", "brief", "shelved"]
        app.store.deliver(LoadableModels(()))
        app.poll()
        await pilot.pause()
        assert column_texts(table, "Model") == ["tiny"]
        assert app.dashboard.models.border_subtitle == "1/1 serving"


async def test_a_long_loadable_list_is_cut_to_a_bounded_number_of_rows() -> None:
    many = tuple(LoadableEntry(f"m{i:03d}", "models_dir") for i in range(MAX_LOADABLE_ROWS + 6))
    app = scripted([(0.0, LoadableModels(many))])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        models = column_texts(_models(app), "Model")
        assert len(models) == MAX_LOADABLE_ROWS + 1
        assert models[-1] == "+6 more"
        assert app.dashboard.models.border_subtitle == f"{MAX_LOADABLE_ROWS + 6} loadable"


async def test_a_pinned_model_says_so_in_its_detail() -> None:
    from skippyctl.events.catalog import EventId
    from skippyctl.events.envelope import settings

    events = demo.available()
    requested = next(e for e in events if e.id is EventId.MODEL_LOAD_REQUESTED)
    events[events.index(requested)] = dataclasses.replace(
        requested, settings=settings((("pinned", True),))
    )
    app = scripted(demo.script(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        detail = cell_text(_models(app), "tiny", "Detail")
        assert detail.startswith("ready in ") and detail.endswith(" · pinned"), detail


async def test_a_models_serving_plugins_show_their_counters_in_its_detail() -> None:
    from skippyctl.engine.protocol_messages import PluginCounters, PluginReported
    from skippyctl.events.envelope import LogicalId
    from skippyctl.runtime.plugin_events import plugin_events

    tiny = LogicalId("tiny")
    events = demo.available()
    events += plugin_events(PluginReported("ngram", "loaded", "ok", 0), tiny)
    events += plugin_events(PluginCounters("ngram", 1234, 0, 0, 3, 1, 0, 2, 0, 0), tiny)
    events += plugin_events(PluginReported("crashy.so", "loaded", "ok", 0), tiny)
    events += plugin_events(PluginReported("crashy.so", "disabled", "crashed", 3), tiny)
    app = scripted(demo.script(events))
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot)
        detail = cell_text(_models(app), "tiny", "Detail")
        assert detail.startswith("ready in "), detail
        # sorted by plugin id: crashy.so first
        expected = " · crashy.so disabled · ngram: 1,234 sent, 3 late, 2 discarded, 1 failed"
        assert detail.endswith(expected), detail
