"""How fast the CLI answers a script: `skippyctl --version` and `skippyctl ps --json`, whole
processes, against a running runtime (issue 25).

    .venv/bin/python -m benchmarks.cli_startup [--runs 15] [--warmup 2] [--pycache both]
                                               [--baseline DIR] [--libraries]

It starts a runtime (`skippyctl runtime start`, `SKIPPY_RUNTIME_DIR` a temporary directory,
`SKIPPY_PORT=0`), loads `fixtures/tiny.gguf` (so `ps --json` has a model to report), then times
each command from its start to its exit as a child process — interpreter start, imports, the
HTTP round trips and the output included — and stops the runtime.

Method, and why (2 shared cores: a single run moves by ±30 %):

- The floor is `python -c pass` with the same interpreter and environment: what no command can
  go below. The runs go in turn (floor, `--version`, floor, `ps --json`, ...) after unmeasured
  warm-up runs, and each command's time is also divided by the floor run just before it
  (paired ratios), which keeps the ratio meaningful while the machine's speed drifts.
- Reported per command: median, min and max wall ms, the median of the paired ratios, the
  median time above the floor, and the target. Quote the median.
- `--baseline DIR` times the CLI of another checkout (a `git archive` of the previous head, say:
  its sources on PYTHONPATH) in the same turns, against the same runtime: before and after side
  by side, with the ratio of their medians.
- `--libraries` also times what each library the CLI may import costs on its own (`python -c
  "import typer"`, ...; httpx with a client made, as a command makes one), above the floor.
- Bytecode: this project's sandbox runs with PYTHONDONTWRITEBYTECODE=1, so every run compiles
  the skippyctl modules it imports from source (the installed dependencies have their
  bytecode). `--pycache off` measures that; `--pycache on` gives the runs a bytecode cache
  (PYTHONPYCACHEPREFIX, as an installed package has); `both` (the default) measures each.

Targets (issue 25): `--version` ≤ 150 ms, `ps --json` ≤ 250 ms, whole process. Prints a table on
stderr and one JSON summary on stdout. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson

from benchmarks.models import REPO, TINY

TARGETS_MS: Final = {"--version": 150.0, "ps --json": 250.0}
COMMANDS: Final = {"--version": ("--version",), "ps --json": ("ps", "--json")}
BYTECODE_CACHE: Final = Path("/tmp/skippy-bench/pycache-cli")


LIBRARIES: Final = {
    "typer": "import typer",
    "click": "import click",
    "rich": "import rich.console",
    "httpx (+ a client)": "import httpx; httpx.Client(base_url='http://127.0.0.1:1')",
    "http.client": "import http.client",
    "orjson": "import orjson",
    "pydantic": "import pydantic",
}
"""What `--libraries` times: each statement in a fresh interpreter, against the floor."""


@dataclass(frozen=True, slots=True)
class Row:
    command: str
    checkout: str
    pycache: bool
    runs: int
    median_ms: float
    min_ms: float
    max_ms: float
    floor_median_ms: float
    above_floor_ms: float
    paired_ratio_median: float
    target_ms: float
    meets_target: bool


def _skippyctl() -> list[str]:
    """The console script an operator runs, beside this interpreter (else `python -m`)."""
    script = Path(sys.executable).with_name("skippyctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "skippyctl"]


def _environment(runtime_dir: Path, pycache: bool, checkout: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, SKIPPY_RUNTIME_DIR=str(runtime_dir), SKIPPY_PORT="0")
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    if pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(BYTECODE_CACHE)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def _timed(command: list[str], env: dict[str, str]) -> float:
    """Wall ms from starting `command` to reaping it; its output is read and dropped."""
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, timeout=60)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode()[-400:]}"
        )
    return elapsed_ms


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.decode()[-400:]}")


def measure(
    runs: int, warmup: int, pycache: bool, runtime_dir: Path, checkouts: dict[str, Path | None]
) -> list[Row]:
    """Every command of every checkout, each run after a floor run, in turn."""
    envs = {label: _environment(runtime_dir, pycache, path) for label, path in checkouts.items()}
    floor = [sys.executable, "-c", "pass"]
    cases = [(name, label) for name in COMMANDS for label in checkouts]
    for _ in range(warmup):
        for name, label in cases:
            _timed(floor, envs[label])
            _timed([*_skippyctl(), *COMMANDS[name]], envs[label])
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    floors: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(runs):
        for name, label in cases:
            floors[name, label].append(_timed(floor, envs[label]))
            times[name, label].append(_timed([*_skippyctl(), *COMMANDS[name]], envs[label]))
    rows = []
    for name, label in cases:
        ms, base = times[name, label], floors[name, label]
        pairs = list(zip(ms, base, strict=True))
        median = statistics.median(ms)
        rows.append(
            Row(
                command=name,
                checkout=label,
                pycache=pycache,
                runs=runs,
                median_ms=round(median, 1),
                min_ms=round(min(ms), 1),
                max_ms=round(max(ms), 1),
                floor_median_ms=round(statistics.median(base), 1),
                above_floor_ms=round(statistics.median(a - b for a, b in pairs), 1),
                paired_ratio_median=round(statistics.median(a / b for a, b in pairs), 2),
                target_ms=TARGETS_MS[name],
                meets_target=median <= TARGETS_MS[name],
            )
        )
    return rows


def libraries(runs: int) -> dict[str, float]:
    """Median ms above the floor of importing each library alone (no bytecode question: the
    installed libraries have theirs)."""
    env = dict(os.environ)
    floor = [sys.executable, "-c", "pass"]
    above: dict[str, list[float]] = {name: [] for name in LIBRARIES}
    for _ in range(runs):
        for name, statement in LIBRARIES.items():
            base = _timed(floor, env)
            above[name].append(_timed([sys.executable, "-c", statement], env) - base)
    return {name: round(statistics.median(ms), 1) for name, ms in above.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pycache", choices=("off", "on", "both"), default="both")
    parser.add_argument("--baseline", type=Path, help="another checkout's CLI, side by side")
    parser.add_argument("--libraries", action="store_true", help="also time each library")
    args = parser.parse_args(argv)
    variants = {"off": (False,), "on": (True,), "both": (False, True)}[args.pycache]
    checkouts: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        checkouts["baseline"] = args.baseline.resolve()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="skippy-cli-bench-") as directory:
        runtime_dir = Path(directory) / "runtime"
        env = _environment(runtime_dir, pycache=False)
        _run([*_skippyctl(), "runtime", "start"], env, "runtime start")
        try:
            _run([*_skippyctl(), "load", str(TINY)], env, "load tiny.gguf")
            for pycache in variants:
                rows += measure(args.runs, args.warmup, pycache, runtime_dir, checkouts)
        finally:
            _run([*_skippyctl(), "runtime", "stop"], env, "runtime stop")
    head = f"{'command':>10} {'checkout':>8} {'pycache':>7} {'median':>8} {'min..max':>15} "
    sys.stderr.write(head + f"{'floor':>6} {'above':>6} {'x floor':>7} {'target':>7}\n")
    for row in rows:
        sys.stderr.write(
            f"{row.command:>10} {row.checkout:>8} {'on' if row.pycache else 'off':>7} "
            f"{row.median_ms:>6.1f}ms "
            f"{row.min_ms:>6.1f}..{row.max_ms:<6.1f}ms {row.floor_median_ms:>4.1f}ms "
            f"{row.above_floor_ms:>4.1f}ms {row.paired_ratio_median:>6.2f}x "
            f"{row.target_ms:>5.0f}ms {'met' if row.meets_target else 'MISSED'}\n"
        )
    ratios = {
        f"{row.command}, pycache {'on' if row.pycache else 'off'}": round(
            row.median_ms / base.median_ms, 3
        )
        for row in rows
        for base in rows
        if row.checkout == "this"
        and base.checkout == "baseline"
        and (base.command, base.pycache) == (row.command, row.pycache)
    }
    for case, ratio in ratios.items():
        sys.stderr.write(f"this / baseline, {case}: {ratio:.3f}\n")
    summary: dict[str, object] = {
        "rows": [asdict(row) for row in rows],
        "this_over_baseline": ratios,
    }
    if args.libraries:
        costs = libraries(args.runs)
        for name, ms in costs.items():
            sys.stderr.write(f"import {name}: {ms:.1f} ms above the floor (median)\n")
        summary["libraries_ms_above_floor"] = costs
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
