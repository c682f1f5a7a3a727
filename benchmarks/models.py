"""The models the benchmarks run on: the tiny fixture and mid-size models made on demand."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
TINY: Final = REPO / "fixtures" / "tiny.gguf"
MID: Final = Path("/tmp/skippy-bench/bench-mid.gguf")
MID_SUCCESSOR: Final = Path("/tmp/skippy-bench/bench-mid-successor.gguf")
MODEL_NAMES: Final = ("tiny", "mid", "mid-successor")


def model_path(name: str) -> Path:
    """`tiny`, `mid` or `mid-successor`.

    `mid` is generated once with BENCH_MID and reused while its spec matches; `mid-successor`
    likewise with BENCH_MID_SUCCESSOR (same shapes and compute per token, but greedy output
    follows fixed word cycles, so a draft model or a batch shape cannot change it).
    """
    if name == "tiny":
        return TINY
    if name in ("mid", "mid-successor"):
        from skippyctl.fixtures.generate import BENCH_MID, BENCH_MID_SUCCESSOR, ensure_model

        path, spec = (MID, BENCH_MID) if name == "mid" else (MID_SUCCESSOR, BENCH_MID_SUCCESSOR)
        started = time.monotonic()
        ensure_model(path, spec)
        sys.stderr.write(f"{name} model ready at {path} ({time.monotonic() - started:.1f} s)\n")
        return path
    raise SystemExit(f"unknown model {name!r} ({', '.join(MODEL_NAMES)})")
