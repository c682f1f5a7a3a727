"""`python -m skippy_tui --replay FILE [--speed X]`: the dashboard over a recorded NDJSON stream.

The file is what `skippyctl … --json` writes (one `event_record` per line). `--speed` scales the
recorded pacing (2 = twice as fast; `inf` = as fast as possible). `--demo` plays a built-in
scripted tour instead (skippy_tui.demo). Without either there is no source yet: the live runtime
source arrives with the runtime's HTTP/SSE API. `main(argv)` is what `skippyctl tui --replay`
calls; it returns the process exit code.
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
    parser.add_argument("--title", default="skippy", help="title shown in the header")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replay is None and not args.demo:
        parser.error("--replay FILE or --demo is required (no live runtime source yet)")

    from skippy_tui.app import SkippyDashboard
    from skippy_tui.sources import EventSource, ReplaySource, ScriptedSource

    source: EventSource
    if args.replay is not None:
        path: Path = args.replay
        if not path.is_file():
            parser.error(f"no such file: {path}")
        source = ReplaySource(path, speed=args.speed)
    else:
        from skippy_tui.demo import demo_script

        pace_s = 0.15 / args.speed if args.speed != math.inf else 0.0
        source = ScriptedSource(demo_script(pace_s), announce_end=True, description="demo")
    SkippyDashboard(source, title=args.title).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
