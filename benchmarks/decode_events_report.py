"""The report of `benchmarks/decode_events.py`: per-variant rows from the measured samples, the
table for people (stderr) and the rows of the JSON summary.

Contract: a row holds the median over rounds with the spread (min..max); against the events-off
baseline, the ratio of medians and the median and spread of the per-round paired ratios; and,
where the issue's targets apply (not to the baseline nor the opt-in debug class), each ratio
against its target (decode tokens/s ≥ ``TARGET_TOKENS_PER_S``, TTFT ≤ ``TARGET_TTFT`` of events
off).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from benchmarks.decode_events_requests import Sample
from benchmarks.decode_events_runtimes import VARIANTS

TARGET_TOKENS_PER_S: Final = 0.99
"""events on / events off, decode tokens/s: at least this."""
TARGET_TTFT: Final = 1.02
"""events on / events off, time to first token: at most this."""


@dataclass(frozen=True)
class Row:
    variant: str
    label: str
    sessions: int
    rounds: int
    tokens: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    ttft_ms: float
    ttft_min_ms: float
    ttft_max_ms: float
    tokens_per_s_vs_off: float | None
    tokens_per_s_paired_median: float | None
    tokens_per_s_paired_min: float | None
    tokens_per_s_paired_max: float | None
    ttft_vs_off: float | None
    ttft_paired_median: float | None
    ttft_paired_min: float | None
    ttft_paired_max: float | None
    host_cpu_ms: float
    engine_cpu_ms: float
    target_applies: bool
    tokens_per_s_ok: bool | None
    ttft_ok: bool | None


def _paired(values: list[float], base: list[float]) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(values, base, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def rows_of(samples: dict[str, list[Sample]], sessions: int, rounds: int, tokens: int) -> list[Row]:
    rows: list[Row] = []
    labels = {v.name: v for v in VARIANTS}
    base = samples.get("off", [])
    for name, values in samples.items():
        if not values:
            continue
        variant = labels[name]
        rates = [s.tokens_per_s for s in values]
        ttfts = [s.ttft_ms for s in values]
        vs_rate = vs_ttft = None
        rate_paired: tuple[float | None, ...] = (None, None, None)
        ttft_paired: tuple[float | None, ...] = (None, None, None)
        rate_ok = ttft_ok = None
        target = variant.target and name != "off"
        if name != "off" and base:
            vs_rate = statistics.median(rates) / statistics.median(s.tokens_per_s for s in base)
            vs_ttft = statistics.median(ttfts) / statistics.median(s.ttft_ms for s in base)
            rate_paired = _paired(rates, [s.tokens_per_s for s in base])
            ttft_paired = _paired(ttfts, [s.ttft_ms for s in base])
            if target:
                rate_ok = vs_rate >= TARGET_TOKENS_PER_S
                ttft_ok = vs_ttft <= TARGET_TTFT

        def r4(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        rows.append(
            Row(
                variant=name,
                label=variant.label,
                sessions=sessions,
                rounds=rounds,
                tokens=tokens,
                tokens_per_s=round(statistics.median(rates), 2),
                tokens_per_s_min=round(min(rates), 2),
                tokens_per_s_max=round(max(rates), 2),
                ttft_ms=round(statistics.median(ttfts), 2),
                ttft_min_ms=round(min(ttfts), 2),
                ttft_max_ms=round(max(ttfts), 2),
                tokens_per_s_vs_off=r4(vs_rate),
                tokens_per_s_paired_median=r4(rate_paired[0]),
                tokens_per_s_paired_min=r4(rate_paired[1]),
                tokens_per_s_paired_max=r4(rate_paired[2]),
                ttft_vs_off=r4(vs_ttft),
                ttft_paired_median=r4(ttft_paired[0]),
                ttft_paired_min=r4(ttft_paired[1]),
                ttft_paired_max=r4(ttft_paired[2]),
                host_cpu_ms=round(statistics.median(s.host_cpu_ms for s in values), 1),
                engine_cpu_ms=round(statistics.median(s.engine_cpu_ms for s in values), 1),
                target_applies=target,
                tokens_per_s_ok=rate_ok,
                ttft_ok=ttft_ok,
            )
        )
    return rows


def _verdict(ok: bool | None, applies: bool) -> str:
    if not applies:
        return "—"
    return "yes" if ok else "NO"


def table(rows: list[Row], write: Callable[[str], Any]) -> None:
    write(
        f"{'variant':<30} {'sess':>4} {'tokens/s (min..max)':>24} {'TTFT ms (min..max)':>24} "
        f"{'tok/s ÷ off (paired)':>26} {'≥ 0.99':>6} {'TTFT ÷ off (paired)':>26} {'≤ 1.02':>6} "
        f"{'host CPU ms':>11} {'engine CPU ms':>13}\n"
    )
    for row in rows:
        rate = f"{row.tokens_per_s:.1f} ({row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f})"
        ttft = f"{row.ttft_ms:.1f} ({row.ttft_min_ms:.1f}..{row.ttft_max_ms:.1f})"
        if row.tokens_per_s_vs_off is None or row.ttft_vs_off is None:
            vs_rate = vs_ttft = "baseline"
        else:
            vs_rate = (
                f"{row.tokens_per_s_vs_off:.3f} ({row.tokens_per_s_paired_min:.3f}.."
                f"{row.tokens_per_s_paired_max:.3f})"
            )
            vs_ttft = (
                f"{row.ttft_vs_off:.3f} ({row.ttft_paired_min:.3f}..{row.ttft_paired_max:.3f})"
            )
        write(
            f"{row.label:<30} {row.sessions:>4} {rate:>24} {ttft:>24} {vs_rate:>26} "
            f"{_verdict(row.tokens_per_s_ok, row.target_applies):>6} {vs_ttft:>26} "
            f"{_verdict(row.ttft_ok, row.target_applies):>6} {row.host_cpu_ms:>11.1f} "
            f"{row.engine_cpu_ms:>13.1f}\n"
        )
