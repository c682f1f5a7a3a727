"""Render the dashboard's README screenshots: deterministic scenarios to `screenshots/*.svg`.

Usage: `.venv/bin/python scripts/screenshots.py [OUTPUT_DIR]` (default: `screenshots/`).

Each shot runs the real app headless (`App.run_test`) over a `skippy_tui.demo` scenario, whose
events carry fixed timestamps, waits until the scripted source has delivered everything, draws the
final snapshot, optionally presses keys, and exports the screen as SVG. Running it twice produces
the same files.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("skippy_tui") is None:  # not installed: run from a checkout
    sys.path.insert(0, str(ROOT))

from skippy_tui import demo  # noqa: E402  (after the checkout fallback above)
from skippy_tui.app import DashboardBase, SkippyDashboard  # noqa: E402
from skippy_tui.fleet_app import FleetDashboard  # noqa: E402
from skippy_tui.fleet_source import FleetScriptedSource  # noqa: E402
from skippy_tui.sources import ScriptedSource  # noqa: E402
from skippyctl.events.envelope import Event  # noqa: E402

WIDE = (120, 40)
SMALL = (80, 24)
SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Shot:
    name: str
    scenario: Callable[[], list[Event]]
    size: tuple[int, int] = WIDE
    keys: Sequence[str] = ()
    caption: str = ""


SHOTS = (
    Shot("loading", demo.loading, caption="a model loading its weights"),
    Shot("available", demo.available, caption="a model available"),
    Shot("failed", demo.failed, caption="a second model failed to load"),
    Shot("sessions", demo.sessions, caption="sessions and in-flight requests"),
    Shot("pressure", demo.pressure, caption="drops under pressure"),
    Shot("topology", demo.topology, caption="a model split over three stages"),
    Shot(
        "filtered",
        demo.failed,
        keys=("slash", *"model:broken", "enter"),
        caption="events filtered by model",
    ),
    Shot("paused", demo.sessions, keys=("p",), caption="paused"),
    Shot("help", demo.available, keys=("question_mark",), caption="help"),
    Shot("small-stages", demo.topology, SMALL, ("2",), "80×24, stages pane"),
    Shot("small-events", demo.failed, SMALL, ("5",), "80×24, events pane"),
)


async def render(shot: Shot) -> str:
    source = ScriptedSource(demo.script(shot.scenario()), description="demo")
    return await _shoot(shot, SkippyDashboard(source, title="skippy"), source.done, "")


async def _shoot(shot: Shot, app: DashboardBase[Any], done: threading.Event, kind: str) -> str:
    """Run `app` headless until its scripted source `done`, press the shot's keys, export."""
    async with app.run_test(size=shot.size) as pilot:
        if not await asyncio.to_thread(done.wait, SETTLE_TIMEOUT_S):
            raise RuntimeError(f"{shot.name}: the scripted source did not finish")
        app.poll()
        await pilot.pause()
        if shot.keys:
            await pilot.press(*shot.keys)
            await pilot.pause()
        return app.export_screenshot(title=f"skippy {kind}dashboard — {shot.caption or shot.name}")


FLEET_SHOTS = (
    Shot("fleet", lambda: [], caption="three runtimes: one restarted, one unreachable"),
    Shot("fleet-gpu1", lambda: [], keys=("n", "n"), caption="the fleet filtered to node gpu1"),
)
"""Shots of `tui --fleet` over `skippy_tui.demo.fleet()` (their `scenario` is unused)."""


async def render_fleet(shot: Shot) -> str:
    source = FleetScriptedSource(
        demo.fleet_script(), nodes=demo.FLEET_NODES, description="demo fleet"
    )
    return await _shoot(shot, FleetDashboard(source, title="skippy fleet"), source.done, "fleet ")


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    shots = [(shot, render) for shot in SHOTS] + [(shot, render_fleet) for shot in FLEET_SHOTS]
    for shot, draw in shots:
        path = out / f"{shot.name}.svg"
        path.write_text(asyncio.run(draw(shot)), encoding="utf-8")
        sys.stdout.write(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
