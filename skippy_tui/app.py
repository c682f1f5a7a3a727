"""`SkippyDashboard`: the Textual dashboard over an `EventSource`.

Data flow (ARCHITECTURE.md §6 "TUI"): the source's thread calls `SnapshotStore.deliver`, which
reduces each event with the core's pure reducer into a bounded client-side `RuntimeView` under a
lock. The UI never receives one message per event: a timer polls `store.snapshot()` every
`POLL_INTERVAL_S` and, unless paused, hands it to the panes, which redraw only what changed. At any
event rate the UI does bounded work per tick and memory stays flat.

Pause (`p`) stops applying snapshots to the panes — they freeze — while the store keeps reducing,
so resuming shows the current state at once. The header's connection status stays live.

Control: "Load model…" and "Unload model…" in the command palette (`:` or ctrl+p) call the
`RuntimeControl` given to the constructor on a worker thread and report the result as a
notification; without one they say "not connected".

`DashboardBase` is what this app and the fleet's (`skippy_tui.fleet_app.FleetDashboard`) share:
the keys, pause, help, the command palette's entries and running a control call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, Generic, Protocol, TypeVar

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from skippy_tui.control import RuntimeControl
from skippy_tui.screens.dashboard import DashboardScreen, PaneScreen
from skippy_tui.screens.help import HelpScreen
from skippy_tui.screens.load_model import LoadModelScreen
from skippy_tui.screens.unload_model import UnloadModelScreen
from skippy_tui.sources import EventSource
from skippy_tui.store import DashboardSnapshot, SnapshotStore
from skippyctl.reducer.state import SERVING_MODEL_STATES, ModelState, RuntimeView

POLL_INTERVAL_S: Final = 1 / 8
NOT_CONNECTED: Final = "Not connected to a runtime: this dashboard is read-only (replay or demo)."
CONTROL_GROUP: Final = "runtime-control"
# The reducer's table: unload_requested is accepted from a serving or unavailable model.
_UNLOADABLE: Final = SERVING_MODEL_STATES | {ModelState.UNAVAILABLE}


def unloadable_models(view: RuntimeView) -> list[str]:
    """The models of `view` an unload would be accepted for, by id."""
    return sorted(str(m.model_id) for m in view.models.values() if m.state in _UNLOADABLE)


class _Counted(Protocol):
    @property
    def events_total(self) -> int: ...


CountedT = TypeVar("CountedT", bound=_Counted)
_SnapshotT_co = TypeVar("_SnapshotT_co", bound=_Counted, covariant=True)


class _Store(Protocol[_SnapshotT_co]):
    """A dashboard's store (`SnapshotStore`, `FleetStore`): the source's sink, and snapshots."""

    def deliver(self, item: Any, /) -> None: ...
    def snapshot(self) -> _SnapshotT_co: ...


class _Source(Protocol):
    def start(self, sink: Any, /) -> None: ...
    def stop(self, timeout_s: float = ..., /) -> None: ...


class DashboardBase(App[None], Generic[CountedT]):
    """Keys, pause, help, polling and control plumbing shared by the dashboards: the source
    delivers to the store on its own thread, and a timer hands the store's snapshots to the
    screen. A subclass gives them, and what control does."""

    CSS_PATH = "app.tcss"
    TITLE = "skippy"

    BINDINGS = [
        Binding("p", "toggle_pause", "Pause"),
        Binding("colon", "command_palette", "Commands", key_display=":"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    paused: reactive[bool] = reactive(False)

    def __init__(
        self,
        dashboard: PaneScreen[CountedT],
        title: str,
        source: _Source,
        store: _Store[CountedT],
        empty: CountedT,
    ) -> None:
        super().__init__()
        self.title = title
        self.dashboard = dashboard
        self.source = source
        self.store = store
        self.shown: CountedT = empty
        """The snapshot the panes last drew (frozen while paused)."""
        self._paused_at_total = 0
        self._started = False

    def get_default_screen(self) -> Screen[Any]:
        return self.dashboard

    def on_mount(self) -> None:
        self._start_source()
        self._started = True
        self.set_interval(POLL_INTERVAL_S, self.poll, name="snapshot-poll")
        self.poll()

    def on_unmount(self) -> None:
        if self._started:
            self._stop_source()

    def _start_source(self) -> None:
        self.source.start(self.store.deliver)

    def _stop_source(self) -> None:
        self.source.stop()

    def _events_total(self) -> int:
        """Events delivered so far (the PAUSED banner counts those since the pause)."""
        return self.store.snapshot().events_total

    def poll(self) -> None:
        """Apply the store's latest snapshot (the only path from events to widgets)."""
        snapshot = self.store.snapshot()
        if self.paused:
            self.dashboard.show_header(self.shown, snapshot)
            self.dashboard.banner.show(snapshot.events_total - self._paused_at_total)
            return
        if snapshot is not self.shown and self.dashboard.show(snapshot):
            self.shown = snapshot
        self.dashboard.show_header(self.shown, snapshot)

    def watch_paused(self, paused: bool) -> None:
        self.dashboard.banner.display = paused
        self.dashboard.set_class(paused, "-paused")
        if paused:
            self._paused_at_total = self._events_total()
            self.dashboard.banner.show(0)
        else:
            self.poll()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(self._help_screen())

    def _help_screen(self) -> HelpScreen:
        return HelpScreen()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield SystemCommand(
            "Load model…", "Ask the runtime to load a GGUF model", self.action_load_model
        )
        yield SystemCommand(
            "Unload model…", "Ask the runtime to unload a model", self.action_unload_model
        )
        yield from super().get_system_commands(screen)

    def action_load_model(self) -> None:
        raise NotImplementedError

    def action_unload_model(self) -> None:
        raise NotImplementedError

    def _control_call(self, call: Callable[[], None], what: str) -> None:
        """Run a control call on a worker thread; its outcome arrives as a worker state change."""
        self.run_worker(call, name=what, group=CONTROL_GROUP, thread=True, exit_on_error=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.group != CONTROL_GROUP:
            return
        if event.state is WorkerState.SUCCESS:
            self.notify(f"Runtime accepted: {worker.name}", title="Runtime control")
        elif event.state is WorkerState.ERROR:
            self.notify(
                f"{worker.name} failed: {worker.error}", title="Runtime control", severity="error"
            )


class SkippyDashboard(DashboardBase[DashboardSnapshot]):
    """Models, stages, sessions, event health and recent events of one runtime."""

    def __init__(
        self,
        source: EventSource,
        control: RuntimeControl | None = None,
        title: str = "skippy",
        *,
        store: SnapshotStore | None = None,
    ) -> None:
        the_store = store if store is not None else SnapshotStore()
        super().__init__(
            DashboardScreen(title, source.description),
            title,
            source,
            the_store,
            DashboardSnapshot(),
        )
        self.dashboard: DashboardScreen
        self.source: EventSource = source
        self.store: SnapshotStore = the_store
        self.control = control

    def action_load_model(self) -> None:
        if self.control is None:
            self.notify(NOT_CONNECTED, title="Load model", severity="warning")
            return
        self.push_screen(LoadModelScreen(), callback=self._load_chosen)

    def action_unload_model(self) -> None:
        if self.control is None:
            self.notify(NOT_CONNECTED, title="Unload model", severity="warning")
            return
        ids = unloadable_models(self.store.snapshot().view)
        if not ids:
            self.notify("No model is loaded or loading.", title="Unload model")
            return
        self.push_screen(UnloadModelScreen(ids), callback=self._unload_chosen)

    def _load_chosen(self, path: str | None) -> None:
        control = self.control
        if path is None or control is None:
            return
        self._control_call(lambda: control.load(path), f"load {Path(path).name}")

    def _unload_chosen(self, choice: tuple[str, bool] | None) -> None:
        control = self.control
        if choice is None or control is None:
            return
        model_id, force = choice
        verb = "force unload" if force else "unload"
        self._control_call(lambda: control.unload(model_id, force), f"{verb} {model_id}")
