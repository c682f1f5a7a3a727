"""skippy_tui: the Textual dashboard of skippyctl (ARCHITECTURE.md §6 "TUI").

Public API:

- `SkippyDashboard(source, control=None, title=...)` (`skippy_tui.app`): the app.
- `EventSource`, `ScriptedSource`, `ReplaySource`, `PushSource` and the connection facts
  `RuntimeDown`, `RuntimeBack`, `DecodeSkipped`, `SourceEnded`, and `LoadableModels`
  (`skippy_tui.sources`).
- `RuntimeControl` (`skippy_tui.control`): load/unload seam for the command palette.
- The fleet dashboard: `FleetDashboard(source, control=None, title=...)` (`skippy_tui.fleet_app`)
  over a `FleetEventSource` (`skippy_tui.fleet_source`: `FleetReplaySource`,
  `FleetScriptedSource`; `skippy_tui.fleet_live.FleetLiveSource`), reduced by
  `skippy_tui.fleet_store.FleetStore`; `FleetControl` (`skippy_tui.control`) for load/unload.
- `event_from_record`, `decode_record`, `decode_line`: `--json` record → `Event` (the wire
  codec's, `skippyctl.output.codec`, re-exported: one decoder for every client).

Only this package imports Textual; it imports skippyctl's core (events, reducer, output), never its
CLI. The app is imported lazily, so `skippy_tui.sources` and `.store` can be used without loading
Textual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skippy_tui.control import RuntimeControl
from skippy_tui.sources import (
    DecodeSkipped,
    EventSource,
    LoadableModels,
    PushSource,
    ReplaySource,
    RuntimeBack,
    RuntimeDown,
    ScriptedSource,
    SourceEnded,
)
from skippyctl.output.codec import decode_line, decode_record, event_from_record

if TYPE_CHECKING:
    from skippy_tui.app import SkippyDashboard
    from skippy_tui.fleet_app import FleetDashboard

__all__ = [
    "DecodeSkipped",
    "EventSource",
    "FleetDashboard",
    "LoadableModels",
    "PushSource",
    "ReplaySource",
    "RuntimeBack",
    "RuntimeControl",
    "RuntimeDown",
    "ScriptedSource",
    "SkippyDashboard",
    "SourceEnded",
    "decode_line",
    "decode_record",
    "event_from_record",
]


def __getattr__(name: str) -> Any:
    if name == "SkippyDashboard":
        from skippy_tui.app import SkippyDashboard

        return SkippyDashboard
    if name == "FleetDashboard":
        from skippy_tui.fleet_app import FleetDashboard

        return FleetDashboard
    raise AttributeError(name)
