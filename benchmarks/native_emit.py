"""Benchmark 1 of issue 6: the native callback path (C producer → trampoline → shared ring).

    .venv/bin/python -m benchmarks.native_emit [--records 200000] [--rounds 5]

For 1, 2 and 4 C producer threads, idle and while a Python thread holds the GIL (through
ctypes.PyDLL), it reports per-emit latency (p50, p99, max, from the C histogram) and records
per second, as the median of `--rounds` rounds with the spread (min..max). Each emit goes into a
lane that is drained by nobody, so most are counted drops once the lane is full: that is the
path a saturated runtime takes, and it must stay just as cheap. Allocation- and lock-freedom of
the path is a property of the C code (no malloc/pthread_mutex in ingress.c/trampoline.c,
checked by `make -C native test`), not measured here.

Target (issue 6): p99 ≤ 1 µs. Prints a table on stderr and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict, dataclass

import orjson

from skippyctl.native.abi import Kind
from skippyctl.native.ingress import EngineAdapter, ProducerThreads, SharedIngress
from skippyctl.native.library import load_native_library

TARGET_P99_NS = 1000


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="per thread and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
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
    sys.stdout.write(
        orjson.dumps({"benchmark": "native_emit", "rows": [asdict(r) for r in rows]}).decode()
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
