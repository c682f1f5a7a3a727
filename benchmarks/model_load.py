"""Benchmark 3 of issue 6: time to `model_available` with the native event system on and off.

    .venv/bin/python -m benchmarks.model_load [--rounds 5] [--models tiny,mid] [--timeout 120]

For `fixtures/tiny.gguf` and the mid-size model (BENCH_MID, ~214 MB, generated on demand at
/tmp/skippy-bench/bench-mid.gguf and reused), each round starts a fresh in-process
`RuntimeHost`, calls `load_model` and waits until the reduced state says the model is
AVAILABLE; the time is the wall clock from `load_model` to that state. "on" is the normal
runtime with the native library, "off" is legacy mode (`SKIPPY_NATIVE_DISABLE=1`). The native
library is resolved at host start, so every round runs in its own subprocess of this script
with the variant's environment, and the variants strictly alternate (on, off, on, off, ...) so
drift on the noisy 2-core machine hits both alike. One unmeasured warm-up round per variant
and model goes first (page cache, imports).

Reports the median ms per variant with the spread (min..max), and the ratio of medians on/off
with the median and spread of the per-round ratios. Target (issue 6): on/off ≤ 1.02. Prints a
table on stderr and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson

from benchmarks.models import REPO, model_path

TARGET_RATIO: Final = 1.02
VARIANTS: Final = ("on", "off")


@dataclass(frozen=True)
class Row:
    model: str
    size_bytes: int
    rounds: int
    on_ms: float
    on_min_ms: float
    on_max_ms: float
    off_ms: float
    off_min_ms: float
    off_max_ms: float
    ratio_on_off: float
    paired_ratio_median: float
    paired_ratio_min: float
    paired_ratio_max: float
    meets_target: bool


def _child(path: str, timeout_s: float) -> int:
    """One measured load in this process; prints {"ms", "native", "state"} as JSON."""
    from skippyctl.reducer.state import SETTLED_MODEL_STATES, ModelState, RuntimeView
    from skippyctl.runtime.host import LoadRequest, RuntimeHost

    host = RuntimeHost().start()
    try:
        started = time.perf_counter()
        handle = host.load_model(LoadRequest(path))
        model_id = handle.model_id
        if handle.problem is not None or model_id is None:
            raise SystemExit(f"load refused: {handle.problem}")

        def settled(state: RuntimeView) -> bool:
            view = state.models.get(model_id)
            return view is not None and (
                view.state is ModelState.AVAILABLE or view.state in SETTLED_MODEL_STATES
            )

        view = host.pipeline.wait_state(settled, timeout_s)
        elapsed_ms = (time.perf_counter() - started) * 1000
        model = None if view is None else view.models.get(model_id)
        state = "timeout" if model is None else model.state.value
        native = host.native.library is not None
    finally:
        host.shutdown()
    sys.stdout.write(
        orjson.dumps({"ms": round(elapsed_ms, 3), "native": native, "state": state}).decode() + "\n"
    )
    return 0 if state == ModelState.AVAILABLE.value else 1


def _measure(path: Path, variant: str, timeout_s: float) -> float:
    env = dict(os.environ)
    env.pop("SKIPPY_NATIVE_DISABLE", None)
    if variant == "off":
        env["SKIPPY_NATIVE_DISABLE"] = "1"
    command = [sys.executable, "-m", "benchmarks.model_load", "--child", str(path)]
    command += ["--timeout", str(timeout_s)]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s + 60
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"{variant} round on {path.name} failed (exit {result.returncode}): "
            f"{lines[-1] if lines else ''} {result.stderr.strip()[-500:]}"
        )
    report = orjson.loads(lines[-1])
    if report["native"] != (variant == "on"):
        raise RuntimeError(f"{variant} round ran with native={report['native']}")
    return float(report["ms"])


def run(models: list[str], rounds: int, timeout_s: float) -> list[Row]:
    rows: list[Row] = []
    for name in models:
        path = model_path(name)
        for variant in VARIANTS:  # warm-up, not measured
            _measure(path, variant, timeout_s)
        times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                times[variant].append(_measure(path, variant, timeout_s))
        on, off = times["on"], times["off"]
        paired = [a / b for a, b in zip(on, off, strict=True)]
        ratio = statistics.median(on) / statistics.median(off)
        rows.append(
            Row(
                model=name,
                size_bytes=path.stat().st_size,
                rounds=rounds,
                on_ms=round(statistics.median(on), 2),
                on_min_ms=round(min(on), 2),
                on_max_ms=round(max(on), 2),
                off_ms=round(statistics.median(off), 2),
                off_min_ms=round(min(off), 2),
                off_max_ms=round(max(off), 2),
                ratio_on_off=round(ratio, 4),
                paired_ratio_median=round(statistics.median(paired), 4),
                paired_ratio_min=round(min(paired), 4),
                paired_ratio_max=round(max(paired), 4),
                meets_target=ratio <= TARGET_RATIO,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,mid", help="comma-separated: tiny, mid")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per load")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child, args.timeout)
    rows = run([m.strip() for m in args.models.split(",") if m.strip()], args.rounds, args.timeout)
    sys.stderr.write(
        f"{'model':>5} {'MB':>6} {'on ms (min..max)':>26} {'off ms (min..max)':>26} "
        f"{'on/off':>7} {'paired (min..max)':>24}  ≤ {TARGET_RATIO}\n"
    )
    for row in rows:
        on = f"{row.on_ms:.1f} ({row.on_min_ms:.1f}..{row.on_max_ms:.1f})"
        off = f"{row.off_ms:.1f} ({row.off_min_ms:.1f}..{row.off_max_ms:.1f})"
        low, high = row.paired_ratio_min, row.paired_ratio_max
        paired = f"{row.paired_ratio_median:.3f} ({low:.3f}..{high:.3f})"
        sys.stderr.write(
            f"{row.model:>5} {row.size_bytes / 1e6:>6.1f} {on:>26} {off:>26} "
            f"{row.ratio_on_off:>7.3f} {paired:>24}  {'yes' if row.meets_target else 'NO'}\n"
        )
    sys.stdout.write(
        orjson.dumps({"benchmark": "model_load", "rows": [asdict(r) for r in rows]}).decode() + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
