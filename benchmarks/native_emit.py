"""Benchmark 1 of issue 6: the native callback path (C producer → trampoline → shared ring).

    .venv/bin/python -m benchmarks.native_emit [--records 200000] [--rounds 5]
                                               [--audit-records 1000000]

For 1, 2 and 4 C producer threads, idle and while a Python thread holds the GIL (through
ctypes.PyDLL), it reports per-emit latency (p50, p99, max, from the C histogram) and records
per second, as the median of `--rounds` rounds with the spread (min..max). Each emit goes into a
lane that is drained by nobody, so most are counted drops once the lane is full: that is the
path a saturated runtime takes, and it must stay just as cheap.

Allocations and lock acquisitions on the path are counted, not assumed: the emit-path audit
(native/tests/emit_path_audit.c, built here with `make -C native`, no sanitizers) runs
`--audit-records` calls per thread from 1, 2 and 4 C threads through every emit path and counts
each allocator call and each lock/wait call made inside the measured region of each producer
thread; a self-check first proves the counters fire. `--audit-records 0` skips it.

Targets (issue 6): p99 ≤ 1 µs; allocations and lock acquisitions 0. Prints tables on stderr and
one JSON summary on stdout. Exit status 1 when the audit counts anything or cannot run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from skippyctl.native.abi import Kind
from skippyctl.native.ingress import EngineAdapter, ProducerThreads, SharedIngress
from skippyctl.native.library import load_native_library

TARGET_P99_NS = 1000
NATIVE_DIR: Final = Path(__file__).resolve().parents[1] / "native"
AUDIT_BINARY: Final = "build/emit_path_audit"
AUDIT_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class Row:
    threads: int
    gil_held: bool
    p50_ns: float
    p99_ns: float
    p99_min_ns: int
    p99_max_ns: int
    max_ns: int
    records_per_s: float
    meets_target: bool


def _round(
    adapter: EngineAdapter, threads: int, records: int, gil_held: bool
) -> tuple[int, int, int, float]:
    producers = ProducerThreads(
        adapter, threads=threads, records_per_thread=records, kind=Kind.DIAGNOSTIC_WARNING_RAISED
    )
    if gil_held:
        producers.hold_gil_until_done(60.0)
    report = producers.join()
    rate = report.records_attempted / (report.elapsed_ns / 1e9) if report.elapsed_ns else 0.0
    return report.latency_p50_ns, report.latency_p99_ns, report.latency_max_ns, rate


def run(records: int, rounds: int) -> list[Row]:
    library = load_native_library()
    rows: list[Row] = []
    with SharedIngress.create(library=library) as ring, EngineAdapter(ring) as adapter:
        for gil_held in (False, True):
            for threads in (1, 2, 4):
                results = [_round(adapter, threads, records, gil_held) for _ in range(rounds)]
                p99s = [r[1] for r in results]
                rows.append(
                    Row(
                        threads=threads,
                        gil_held=gil_held,
                        p50_ns=statistics.median(r[0] for r in results),
                        p99_ns=statistics.median(p99s),
                        p99_min_ns=min(p99s),
                        p99_max_ns=max(p99s),
                        max_ns=max(r[2] for r in results),
                        records_per_s=round(statistics.median(r[3] for r in results), 1),
                        meets_target=statistics.median(p99s) <= TARGET_P99_NS,
                    )
                )
    return rows


@dataclass(frozen=True)
class AuditRow:
    """Counts inside the measured region of `threads` producer threads (summed over them)."""

    threads: int
    calls: int
    allocations: int
    lock_acquisitions: int
    sleeps: int
    other_syscalls: int
    futex_wakes: int
    voluntary_context_switches: int
    meets_target: bool


@dataclass(frozen=True)
class Audit:
    records_per_thread: int
    self_check_ok: bool
    atomics_lock_free: bool
    paths_per_thread: int
    paths_missing: list[str]
    rows: list[AuditRow]
    ok: bool


class AuditError(Exception):
    """The audit could not be built or run, or printed no summary."""


def run_audit(records: int) -> Audit:
    """Builds the audit with make and runs it; exit 1 (forbidden calls counted) still parses."""
    try:
        subprocess.run(
            ["make", "-s", "-C", str(NATIVE_DIR), AUDIT_BINARY],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=AUDIT_TIMEOUT_S,
        )
        result = subprocess.run(
            [str(NATIVE_DIR / AUDIT_BINARY), "--records", str(records)],
            capture_output=True,
            text=True,
            timeout=AUDIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise AuditError(f"emit-path audit could not be built or run: {error}") from error
    sys.stderr.write(result.stderr)
    if result.returncode not in (0, 1) or not result.stdout.strip():
        raise AuditError(f"emit-path audit is broken (exit {result.returncode})")
    raw: dict[str, Any] = orjson.loads(result.stdout.splitlines()[-1])
    rows = [
        AuditRow(
            threads=run["threads"],
            calls=run["emits"],
            allocations=run["allocations"],
            lock_acquisitions=run["lock_acquisitions"],
            sleeps=run["sleeps"],
            other_syscalls=run["other_syscalls"],
            futex_wakes=run["futex_wakes"],
            voluntary_context_switches=run["voluntary_context_switches"],
            meets_target=run["allocations"] == 0 and run["lock_acquisitions"] == 0,
        )
        for run in raw["runs"]
    ]
    return Audit(
        records_per_thread=raw["records_per_thread"],
        self_check_ok=raw["self_check"]["ok"],
        atomics_lock_free=all(run["atomics_lock_free"] for run in raw["runs"]),
        paths_per_thread=raw["paths_per_thread"],
        paths_missing=sorted({path for run in raw["runs"] for path in run["paths_missing"]}),
        rows=rows,
        ok=raw["ok"],
    )


def _write_audit(audit: Audit) -> None:
    sys.stderr.write(
        f"\nemit-path audit: {audit.records_per_thread} calls per thread over "
        f"{audit.paths_per_thread} paths; self-check "
        f"{'ok' if audit.self_check_ok else 'FAILED'}; atomics lock-free: "
        f"{'yes' if audit.atomics_lock_free else 'NO'}"
        + (f"; paths not reached: {', '.join(audit.paths_missing)}" if audit.paths_missing else "")
        + "\n"
    )
    sys.stderr.write(
        f"{'threads':>7} {'calls':>9} {'allocations':>11} {'lock acquisitions':>17} "
        f"{'sleeps':>6} {'futex wakes':>11}  target 0\n"
    )
    for row in audit.rows:
        sys.stderr.write(
            f"{row.threads:>7} {row.calls:>9} {row.allocations:>11} {row.lock_acquisitions:>17} "
            f"{row.sleeps:>6} {row.futex_wakes:>11}  {'yes' if row.meets_target else 'NO'}\n"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="per thread and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--audit-records",
        type=int,
        default=1_000_000,
        help="emit-path audit calls per thread (>= 1000; 0 skips the audit)",
    )
    args = parser.parse_args(argv)
    audit: Audit | None = None
    if args.audit_records:
        try:
            audit = run_audit(args.audit_records)
        except AuditError as error:
            sys.stderr.write(f"{error}\n")
            return 1
    rows = run(args.records, args.rounds)
    sys.stderr.write(
        f"{'threads':>7} {'GIL held':>8} {'p50 ns':>7} {'p99 ns (min..max)':>20} "
        f"{'max ns':>10} {'records/s':>12}  p99 ≤ 1 µs\n"
    )
    for row in rows:
        sys.stderr.write(
            f"{row.threads:>7} {str(row.gil_held):>8} {row.p50_ns:>7.0f} "
            f"{row.p99_ns:>7.0f} ({row.p99_min_ns}..{row.p99_max_ns}){'':>4} {row.max_ns:>10} "
            f"{row.records_per_s:>12.0f}  {'yes' if row.meets_target else 'NO'}\n"
        )
    if audit is not None:
        _write_audit(audit)
    summary: dict[str, Any] = {"benchmark": "native_emit", "rows": [asdict(r) for r in rows]}
    if audit is not None:
        summary["emit_path_audit"] = asdict(audit)
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0 if audit is None or audit.ok else 1


if __name__ == "__main__":
    sys.exit(main())
