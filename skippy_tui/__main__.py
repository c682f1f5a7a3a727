"""`python -m skippy_tui --replay FILE [--speed X] [--fleet]`: the dashboard over a recording.

The file is what `skippyctl … --json` writes (one `event_record` per line). `--speed` scales the
recorded pacing (2 = twice as fast; `inf` = as fast as possible). `--demo` plays a built-in
scripted tour instead (skippy_tui.demo). With `--fleet` the file is a fleet recording (what
`skippyctl events --follow --fleet --json` writes) played into the fleet dashboard, and `--demo`
plays three scripted runtimes. Without either there is no source: the live sources are
`skippyctl tui`'s. `main(argv)` is what `skippyctl tui --replay` calls; it returns the process
exit code.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path


def _speed(text: str) -> float:
    value = math.inf if text in ("inf", "max") else float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("speed must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m skippy_tui", description="The skippy Textual dashboard."
    )
    parser.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="NDJSON events recorded with `skippyctl … --json`",
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="X",
        help="replay speed factor (default 1; 'inf' for as fast as possible)",
    )
    parser.add_argument(
        "--demo", action="store_true", help="play a built-in scripted tour (no runtime needed)"
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="the fleet dashboard: --replay plays a fleet recording "
        "(`skippyctl events --follow --fleet --json`), --demo three scripted runtimes",
    )
    parser.add_argument("--title", default=None, help="title shown in the header")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replay is None and not args.demo:
        parser.error("--replay FILE or --demo is required (no live runtime source yet)")

    path: Path | None = args.replay
    if path is not None and not path.is_file():
        parser.error(f"no such file: {path}")
    pace_s = 0.15 / args.speed if args.speed != math.inf else 0.0
    if args.fleet:
        _run_fleet(path, args.speed, pace_s, args.title or "skippy fleet")
        return 0

    from skippy_tui.app import SkippyDashboard
    from skippy_tui.sources import EventSource, ReplaySource, ScriptedSource

    source: EventSource
    if path is not None:
        source = ReplaySource(path, speed=args.speed)
    else:
        from skippy_tui.demo import demo_script

        source = ScriptedSource(demo_script(pace_s), announce_end=True, description="demo")
    SkippyDashboard(source, title=args.title or "skippy").run()
    return 0


def _run_fleet(path: Path | None, speed: float, pace_s: float, title: str) -> None:
    """The fleet dashboard over a fleet recording (`path`) or the scripted fleet demo."""
    from skippy_tui.fleet_app import FleetDashboard
    from skippy_tui.fleet_source import FleetEventSource, FleetReplaySource, FleetScriptedSource

    source: FleetEventSource
    if path is not None:
        source = FleetReplaySource(path, speed=speed)
    else:
        from skippy_tui.demo import FLEET_NODES, fleet_script

        source = FleetScriptedSource(
            fleet_script(pace_s), nodes=FLEET_NODES, announce_end=True, description="fleet demo"
        )
    FleetDashboard(source, title=title).run()


if __name__ == "__main__":
    sys.exit(main())
