"""The models the benchmarks run on: the tiny fixture and the mid-size model made on demand."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
TINY: Final = REPO / "fixtures" / "tiny.gguf"
MID: Final = Path("/tmp/skippy-bench/bench-mid.gguf")


def model_path(name: str) -> Path:
    """`tiny` or `mid` (generated once with BENCH_MID and reused while its spec matches)."""
    if name == "tiny":
        return TINY
    if name == "mid":
        from skippyctl.fixtures.generate import BENCH_MID, ensure_model

        started = time.monotonic()
        ensure_model(MID, BENCH_MID)
        sys.stderr.write(f"mid model ready at {MID} ({time.monotonic() - started:.1f} s)\n")
        return MID
    raise SystemExit(f"unknown model {name!r} (tiny, mid)")
