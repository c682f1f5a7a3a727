"""Benchmark 3 of issue 6: time to `model_available` with the native event system on and off.

    .venv/bin/python -m benchmarks.model_load [--rounds 5] [--models tiny,mid] [--timeout 120]
                                              [--no-bytecode-cache]

For `fixtures/tiny.gguf` and the mid-size model (BENCH_MID, ~214 MB, generated on demand at
/tmp/skippy-bench/bench-mid.gguf and reused), each round starts a fresh in-process
`RuntimeHost`, calls `load_model` and waits until the reduced state says the model is
AVAILABLE; the time is the wall clock from `load_model` to that state (engine process start,
`llama_model_load_from_file`, context creation). "on" is the normal runtime with the native
library, "off" is legacy mode (`SKIPPY_NATIVE_DISABLE=1`). The native library is resolved at
host start, so every round runs in its own subprocess of this script with the variant's
environment.

Method, and why (this machine has 2 cores shared with other work, so one load varies by ±30%):

- One unmeasured warm-up round per variant and model goes first (page cache, bytecode cache).
- Rounds run in ABBA order (on, off, off, on, ...): with strict alternation "on" always ran
  first in its pair, so any drift or first-of-pair effect landed on one variant only.
- Python bytecode is cached for the rounds (PYTHONPYCACHEPREFIX under /tmp/skippy-bench), as
  for an installed package. Without a cache (PYTHONDONTWRITEBYTECODE=1, as in this sandbox)
  every engine process recompiles the skippyctl modules it imports from source, and the native
  variant imports more of them, so the ratio then measures the compiler, not the event system.
  `--no-bytecode-cache` measures that condition anyway.
- Reported: median ms per variant with the spread (min..max), the median time to the engine's
  hello (process start and imports, inside the measured time), the ratio of medians on/off
  (the target figure) and the median and spread of the per-round paired ratios.

Target (issue 6): on/off ≤ 1.02. Prints a table on stderr and one JSON summary on stdout.
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
BYTECODE_CACHE: Final = Path("/tmp/skippy-bench/pycache")


@dataclass(frozen=True, slots=True)
class Round:
    """One measured load (one subprocess)."""

    ms: float
    engine_start_ms: float | None


@dataclass(frozen=True)
class Row:
    model: str
    size_bytes: int
    rounds: int
    bytecode_cache: bool
    on_ms: float
    on_min_ms: float
    on_max_ms: float
    off_ms: float
    off_min_ms: float
    off_max_ms: float
    on_engine_start_ms: float | None
    off_engine_start_ms: float | None
    ratio_on_off: float
    paired_ratio_median: float
    paired_ratio_min: float
    paired_ratio_max: float
    target_ratio: float
    meets_target: bool


def _child(path: str, timeout_s: float) -> int:
    """One measured load in this process; prints {"ms", "engine_start_ms", "native", "state"}."""
    from skippyctl.config.load_options import LoadOptions
    from skippyctl.config.runtime_settings import read_runtime_settings
    from skippyctl.events.catalog import EventId
    from skippyctl.pipeline.dispatch import SubscriptionClosed
    from skippyctl.reducer.state import SETTLED_MODEL_STATES, ModelState, RuntimeView
    from skippyctl.runtime.host import RuntimeHost

    # This child is a process entry: it reads its settings (the variant's SKIPPY_NATIVE_DISABLE).
    host = RuntimeHost(settings=read_runtime_settings()).start()
    try:
        started_ns = time.monotonic_ns()
        started = time.perf_counter()
        handle = host.load_model(LoadOptions(path))
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
        engine_start_ms: float | None = None
        # Read from the replay buffer afterwards: no extra subscriber during the measured load.
        events = host.pipeline.subscribe("benchmark", max_queue_size=1 << 16, replay=True)
        try:
            while (item := events.get(0)) is not None:
                if item.event.id is EventId.ENGINE_PROCESS_STARTED:
                    engine_start_ms = round((item.event.mono_ns - started_ns) / 1e6, 3)
        except SubscriptionClosed:
            pass
    finally:
        host.shutdown()
    report: dict[str, object] = {"ms": round(elapsed_ms, 3), "engine_start_ms": engine_start_ms}
    report |= {"native": native, "state": state}
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    return 0 if state == ModelState.AVAILABLE.value else 1


def _environment(variant: str, bytecode_cache: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SKIPPY_NATIVE_DISABLE", None)
    if variant == "off":
        env["SKIPPY_NATIVE_DISABLE"] = "1"
    if bytecode_cache:
        # Inherited by the engine processes the host starts.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE_CACHE)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def _measure(path: Path, variant: str, timeout_s: float, bytecode_cache: bool) -> Round:
    command = [sys.executable, "-m", "benchmarks.model_load", "--child", str(path)]
    command += ["--timeout", str(timeout_s)]
    result = subprocess.run(
        command,
        cwd=REPO,
        env=_environment(variant, bytecode_cache),
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
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
    start = report.get("engine_start_ms")
    return Round(float(report["ms"]), None if start is None else float(start))


def _order(round_index: int) -> tuple[str, str]:
    """ABBA: on, off, then off, on, then on, off, ..."""
    return VARIANTS if round_index % 2 == 0 else (VARIANTS[1], VARIANTS[0])


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def run(models: list[str], rounds: int, timeout_s: float, bytecode_cache: bool) -> list[Row]:
    rows: list[Row] = []
    for name in models:
        path = model_path(name)
        for variant in VARIANTS:  # warm-up, not measured
            _measure(path, variant, timeout_s, bytecode_cache)
        measured: dict[str, list[Round]] = {variant: [] for variant in VARIANTS}
        for index in range(rounds):
            for variant in _order(index):
                measured[variant].append(_measure(path, variant, timeout_s, bytecode_cache))
                sys.stderr.write(".")
                sys.stderr.flush()
        sys.stderr.write("\n")
        on = [r.ms for r in measured["on"]]
        off = [r.ms for r in measured["off"]]
        paired = [a / b for a, b in zip(on, off, strict=True)]
        ratio = statistics.median(on) / statistics.median(off)
        rows.append(
            Row(
                model=name,
                size_bytes=path.stat().st_size,
                rounds=rounds,
                bytecode_cache=bytecode_cache,
                on_ms=round(statistics.median(on), 2),
                on_min_ms=round(min(on), 2),
                on_max_ms=round(max(on), 2),
                off_ms=round(statistics.median(off), 2),
                off_min_ms=round(min(off), 2),
                off_max_ms=round(max(off), 2),
                on_engine_start_ms=_median_or_none([r.engine_start_ms for r in measured["on"]]),
                off_engine_start_ms=_median_or_none([r.engine_start_ms for r in measured["off"]]),
                ratio_on_off=round(ratio, 4),
                paired_ratio_median=round(statistics.median(paired), 4),
                paired_ratio_min=round(min(paired), 4),
                paired_ratio_max=round(max(paired), 4),
                target_ratio=TARGET_RATIO,
                meets_target=ratio <= TARGET_RATIO,
            )
        )
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,mid", help="comma-separated: tiny, mid")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per load")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="compile every module from source in every process (PYTHONDONTWRITEBYTECODE=1)",
    )
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child, args.timeout)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = run(models, args.rounds, args.timeout, not args.no_bytecode_cache)
    cache = "bytecode cached" if not args.no_bytecode_cache else "no bytecode cache"
    sys.stderr.write(f"{args.rounds} rounds per variant, ABBA order, {cache}\n")
    sys.stderr.write(
        f"{'model':>5} {'MB':>6} {'on ms (min..max)':>24} {'off ms (min..max)':>24} "
        f"{'hello on/off ms':>16} {'on/off':>7} {'paired (min..max)':>24}  target\n"
    )
    for row in rows:
        on = f"{row.on_ms:.1f} ({row.on_min_ms:.1f}..{row.on_max_ms:.1f})"
        off = f"{row.off_ms:.1f} ({row.off_min_ms:.1f}..{row.off_max_ms:.1f})"
        hello = f"{_ms(row.on_engine_start_ms)}/{_ms(row.off_engine_start_ms)}"
        low, high = row.paired_ratio_min, row.paired_ratio_max
        paired = f"{row.paired_ratio_median:.3f} ({low:.3f}..{high:.3f})"
        verdict = "met" if row.meets_target else "NOT met"
        sys.stderr.write(
            f"{row.model:>5} {row.size_bytes / 1e6:>6.1f} {on:>24} {off:>24} {hello:>16} "
            f"{row.ratio_on_off:>7.3f} {paired:>24}  ≤ {TARGET_RATIO}: {verdict}\n"
        )
    sys.stdout.write(
        orjson.dumps({"benchmark": "model_load", "rows": [asdict(r) for r in rows]}).decode() + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
