"""Concurrent sessions over HTTP: skippy against llama.cpp's `llama-server` and `llama_cpp.server`.

    .venv/bin/python -m benchmarks.concurrent [--rounds N] [--sessions 1,2,4,8] [--tokens N]
        [--requests R] [--model mid|tiny|real] [--context-per-session N] [--threads T]
        [--contenders skippy,skippy-watched,llama-server,llama_cpp.server] [--watch-events]
        [--skippy-defaults]
        [--skippy-base DIR] [--skippy-spec MODE] [--skippy-flash-attn MODE]

For every S in --sessions, each contender is started fresh (benchmarks/servers.py: same model,
threads, flash attention, S parallel sequences with the same context each, split KV), warmed up
with one request, driven by S concurrent sessions each sending R sequential streaming
`/v1/completions` of --tokens tokens (benchmarks/loadgen.py: identical bodies, greedy,
end-of-generation banned), and stopped. Measured per contender and S: aggregate tokens/s (all
completion tokens / wall time of the S-session run, prefill included), request latency and TTFT
(send → first chunk with text) p50/p95 over all requests of all rounds.

Rounds alternate the order: group g (one S in one round) runs the contenders in the g-th of all
their orders, so over 6 groups every pair runs in either order equally often, and drift on this
noisy 2-core machine hits all alike. Each ratio skippy / peer is given as the ratio of the
median rates and as the median (min..max) of the per-round ratios; a target counts as met only
when both statistics reach it.

Targets (issue 12), for the peer llama-server: aggregate tokens/s ≥ 1.00× at 1, 4 and 8
sessions and TTFT p50 ≤ llama-server's; `--watch-events` repeats the run with a live SSE
subscriber reading skippy's event stream; the contender `skippy-watched` is skippy with that
subscriber in the same rounds as `skippy` without it (both ratios to the peer are targeted, and
`skippy-watched / skippy` is the subscriber's own cost). `--skippy-defaults` loads skippy
without --lanes and --ctx, as an operator would (target: 4 sessions ≥ 1.8× one session).
`--skippy-spec MODE` loads skippy (and skippy-base) with `--spec MODE` (default: the load's
default, `auto`), and `--skippy-flash-attn MODE` with `--flash-attn MODE` (against the
contender `llama-server-fa-off`: llama-server with `-fa off`).

The contender `llama-server-again` is llama-server once more, in the same rounds: its ratios to
`llama-server` are what an identical server gets here, the benchmark's own noise.

`--skippy-base DIR` with the contender `skippy-base` runs skippy from another checkout (e.g.
`git worktree add DIR <previous head>`, its native library built with `python setup.py
build_ext --inplace` there) in the same rounds: `skippy / skippy-base` is a change's effect,
measured side by side.

Prints a table and the verdicts on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson

from benchmarks.loadgen import (
    RunSample,
    Workload,
    banned_tokens,
    percentile,
    run_sessions,
    warm_up,
)
from benchmarks.models import model_path
from benchmarks.servers import (
    LLAMA_SERVER,
    LLAMA_SERVER_AGAIN,
    LLAMA_SERVER_FA_OFF,
    SERVER_NAMES,
    SKIPPY,
    SKIPPY_BASE,
    SKIPPY_WATCHED,
    ServerSpec,
    start,
)

DEFAULT_TOKENS: Final = {"tiny": 256, "mid": 128, "real": 128}
DEFAULT_REQUESTS: Final = 2
DEFAULT_CONTEXT_PER_SESSION: Final = 512
TARGET_PEER: Final = LLAMA_SERVER
TARGET_RATE: Final = 1.00
TARGET_RATE_SESSIONS: Final = (1, 4, 8)
TARGET_DEFAULTS_SCALING: Final = 1.8
"""With `--skippy-defaults`: 4 sessions ≥ 1.8 × one session."""


@dataclass(frozen=True, slots=True)
class Row:
    server: str
    sessions: int
    rounds: int
    requests: int
    tokens_per_request: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    latency_p50_ms: float
    latency_p95_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    events_seen: int
    ttft_first_p50_ms: float | None = None
    """TTFT p50 of each session's first request (its whole prompt is prefilled) ..."""
    ttft_later_p50_ms: float | None = None
    """... and of its later ones (they share the session's prefix). The p50 over all requests
    falls where the two meet when a session makes two requests, so it says more about how many
    samples each side has than about either (section 5 of docs/BENCHMARKS.md)."""


@dataclass(frozen=True, slots=True)
class Ratio:
    """`server` / `peer` at `sessions`."""

    peer: str
    sessions: int
    rate: float
    """Ratio of the median aggregate tokens/s."""
    rate_paired_median: float
    rate_paired_min: float
    rate_paired_max: float
    ttft_p50: float
    """skippy's TTFT p50 / the peer's (below 1: skippy answers first)."""
    target: float | None
    meets_target: bool | None
    ttft_meets_target: bool | None
    ttft_first_p50: float | None = None
    """The same for each session's first requests ..."""
    ttft_later_p50: float | None = None
    """... and for the later ones (None with one request per session)."""
    server: str = SKIPPY
    """The numerator: skippy, or llama-server-again (against llama-server: the noise)."""


OPT_IN_CONTENDERS: Final = (SKIPPY_BASE, SKIPPY_WATCHED, LLAMA_SERVER_AGAIN, LLAMA_SERVER_FA_OFF)
"""Run only when --contenders names them."""


def _orders(contenders: tuple[str, ...]) -> list[tuple[str, ...]]:
    return list(itertools.permutations(contenders))


def _measure(name: str, spec: ServerSpec, work: Workload, sessions: int, watch: bool) -> RunSample:
    with tempfile.TemporaryDirectory(prefix="skippy-concurrent-") as temp:
        server = start(name, spec, Path(temp))
        try:
            warm_up(server, work)
            sample = asyncio.run(
                run_sessions(
                    server,
                    work,
                    sessions,
                    watch_events=name == SKIPPY_WATCHED
                    or (watch and name in (SKIPPY, SKIPPY_BASE)),
                )
            )
        finally:
            server.stop()
    sys.stderr.write(
        f"  {name:>16} S={sessions}: {sample.tokens_per_s:8.1f} tok/s "
        f"({sample.tokens} tokens in {sample.wall_s:.2f} s)\n"
    )
    return sample


def _paired(ours: list[float], theirs: list[float]) -> tuple[float, float, float, float]:
    """Ratio of the medians, then median, min and max of the per-round ratios."""
    paired = [a / b for a, b in zip(ours, theirs, strict=True)]
    return (
        statistics.median(ours) / statistics.median(theirs),
        statistics.median(paired),
        min(paired),
        max(paired),
    )


@dataclass(frozen=True, slots=True)
class Plan:
    contenders: tuple[str, ...]
    sessions: tuple[int, ...]
    rounds: int
    work: Workload
    path: Path
    context_per_session: int
    threads: int
    watch_events: bool
    skippy_defaults: bool
    skippy_base: Path | None = None
    skippy_spec: str | None = None
    skippy_flash_attn: str | None = None

    def skippy_load_args(self) -> tuple[str, ...]:
        spec = ("--spec", self.skippy_spec) if self.skippy_spec else ()
        flash = ("--flash-attn", self.skippy_flash_attn) if self.skippy_flash_attn else ()
        return (*spec, *flash)


def run(plan: Plan) -> tuple[list[Row], list[Ratio]]:
    samples: dict[str, dict[int, list[RunSample]]] = {
        name: {s: [] for s in plan.sessions} for name in plan.contenders
    }
    orders = _orders(plan.contenders)
    group = 0
    for index in range(plan.rounds):
        sys.stderr.write(f"round {index + 1}/{plan.rounds}\n")
        for sessions in plan.sessions:
            spec = ServerSpec(
                plan.path,
                sessions,
                plan.context_per_session,
                plan.threads,
                plan.skippy_defaults,
                skippy_base=plan.skippy_base,
                skippy_load_args=plan.skippy_load_args(),
            )
            for name in orders[group % len(orders)]:
                samples[name][sessions].append(
                    _measure(name, spec, plan.work, sessions, plan.watch_events)
                )
            group += 1
    rows: list[Row] = []
    ttft_p50: dict[tuple[str, int], float] = {}
    turn_p50: dict[tuple[str, int, str], float] = {}
    for name in plan.contenders:
        for sessions in plan.sessions:
            runs = samples[name][sessions]
            rates = [sample.tokens_per_s for sample in runs]
            latencies = [r.latency_s * 1000 for sample in runs for r in sample.requests]
            ttfts = [r.ttft_s * 1000 for sample in runs for r in sample.requests]
            ttft_p50[name, sessions] = percentile(ttfts, 50)
            for turn, first in (("first", True), ("later", False)):
                of_turn = [
                    r.ttft_s * 1000
                    for sample in runs
                    for r in sample.requests
                    if (r.turn == 0) == first
                ]
                if of_turn:
                    turn_p50[name, sessions, turn] = percentile(of_turn, 50)
            rows.append(
                Row(
                    server=name,
                    sessions=sessions,
                    rounds=plan.rounds,
                    requests=len(latencies),
                    tokens_per_request=plan.work.tokens,
                    tokens_per_s=round(statistics.median(rates), 1),
                    tokens_per_s_min=round(min(rates), 1),
                    tokens_per_s_max=round(max(rates), 1),
                    latency_p50_ms=round(percentile(latencies, 50), 1),
                    latency_p95_ms=round(percentile(latencies, 95), 1),
                    ttft_p50_ms=round(ttft_p50[name, sessions], 1),
                    ttft_p95_ms=round(percentile(ttfts, 95), 1),
                    events_seen=sum(sample.events_seen for sample in runs),
                    ttft_first_p50_ms=_rounded(turn_p50.get((name, sessions, "first"))),
                    ttft_later_p50_ms=_rounded(turn_p50.get((name, sessions, "later"))),
                )
            )
    ratios: list[Ratio] = []
    pairs = [
        (SKIPPY, peer)
        for peer in plan.contenders
        if SKIPPY in plan.contenders and peer != SKIPPY_WATCHED
    ]
    if SKIPPY_WATCHED in plan.contenders:
        pairs += [(SKIPPY_WATCHED, peer) for peer in plan.contenders]
    if LLAMA_SERVER_AGAIN in plan.contenders and LLAMA_SERVER in plan.contenders:
        pairs.append((LLAMA_SERVER_AGAIN, LLAMA_SERVER))
    for ours_name, peer in pairs:
        if peer == ours_name:
            continue
        for sessions in plan.sessions:
            ours = [s.tokens_per_s for s in samples[ours_name][sessions]]
            theirs = [s.tokens_per_s for s in samples[peer][sessions]]
            rate, paired, low, high = _paired(ours, theirs)
            ttft = ttft_p50[ours_name, sessions] / ttft_p50[peer, sessions]
            targeted = (
                ours_name in (SKIPPY, SKIPPY_WATCHED)
                and peer == TARGET_PEER
                and sessions in TARGET_RATE_SESSIONS
            )
            ratios.append(
                Ratio(
                    peer=peer,
                    sessions=sessions,
                    rate=round(rate, 3),
                    rate_paired_median=round(paired, 3),
                    rate_paired_min=round(low, 3),
                    rate_paired_max=round(high, 3),
                    ttft_p50=round(ttft, 3),
                    target=TARGET_RATE if targeted else None,
                    meets_target=min(rate, paired) >= TARGET_RATE if targeted else None,
                    ttft_meets_target=ttft <= 1.0 if targeted else None,
                    ttft_first_p50=_turn_ratio(turn_p50, ours_name, peer, sessions, "first"),
                    ttft_later_p50=_turn_ratio(turn_p50, ours_name, peer, sessions, "later"),
                    server=ours_name,
                )
            )
    return rows, ratios


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _turn_ratio(
    turn_p50: dict[tuple[str, int, str], float], server: str, peer: str, sessions: int, turn: str
) -> float | None:
    ours, theirs = turn_p50.get((server, sessions, turn)), turn_p50.get((peer, sessions, turn))
    return None if ours is None or theirs is None else round(ours / theirs, 3)


def _pair(first: float | None, later: float | None, digits: int) -> str:
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return f"{shown(first)}/{shown(later)}"


def _defaults_scaling(rows: list[Row]) -> float | None:
    """skippy's 4-session aggregate / its 1-session rate, when both were measured."""
    rate = {row.sessions: row.tokens_per_s for row in rows if row.server == SKIPPY}
    return rate[4] / rate[1] if 1 in rate and 4 in rate else None


def _report(plan: Plan, model: str, rows: list[Row], ratios: list[Ratio]) -> None:
    write = sys.stderr.write
    write(
        f"model {model}: {plan.work.tokens} tokens per request, {plan.work.requests} requests "
        f"per session, {plan.threads} threads, {plan.context_per_session}-token context per "
        f"session{', skippy with a live SSE subscriber' if plan.watch_events else ''}"
        f"{', skippy with default load flags' if plan.skippy_defaults else ''}\n"
    )
    write(
        f"{'server':>16} {'S':>2} {'req':>4} {'tokens/s (min..max)':>26} {'lat p50 ms':>10} "
        f"{'lat p95 ms':>10} {'TTFT p50':>9} {'TTFT p95':>9} {'first/later p50':>16}\n"
    )
    for row in rows:
        rate = f"{row.tokens_per_s:.1f} ({row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f})"
        write(
            f"{row.server:>16} {row.sessions:>2} {row.requests:>4} {rate:>26} "
            f"{row.latency_p50_ms:>10.1f} {row.latency_p95_ms:>10.1f} "
            f"{row.ttft_p50_ms:>9.1f} {row.ttft_p95_ms:>9.1f} "
            f"{_pair(row.ttft_first_p50_ms, row.ttft_later_p50_ms, 1):>16}\n"
        )
    write(
        f"{'server / peer':>36} {'S':>2} {'tok/s':>7} {'paired (min..max)':>24} {'TTFT p50':>9} "
        f"{'first/later':>13}\n"
    )
    for ratio in ratios:
        paired = (
            f"{ratio.rate_paired_median:.3f} ({ratio.rate_paired_min:.3f}.."
            f"{ratio.rate_paired_max:.3f})"
        )
        verdict = ""
        if ratio.target is not None:
            verdict = (
                f"  tok/s ≥ {ratio.target:.2f}: {'yes' if ratio.meets_target else 'NO'}; "
                f"TTFT ≤ 1: {'yes' if ratio.ttft_meets_target else 'NO'}"
            )
        write(
            f"{ratio.server + ' / ' + ratio.peer:>36} {ratio.sessions:>2} {ratio.rate:>7.3f} "
            f"{paired:>24} "
            f"{ratio.ttft_p50:>9.3f} {_pair(ratio.ttft_first_p50, ratio.ttft_later_p50, 3):>13}"
            f"{verdict}\n"
        )
    scaling = _defaults_scaling(rows)
    if scaling is not None:
        line = f"skippy 4 sessions / 1 session: {scaling:.2f}×"
        if plan.skippy_defaults:
            met = "yes" if scaling >= TARGET_DEFAULTS_SCALING else "NO"
            line += f" with default load flags, target ≥ {TARGET_DEFAULTS_SCALING}: {met}"
        write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", default="1,2,4,8", help="comma-separated session counts")
    parser.add_argument(
        "--tokens", type=int, help="tokens per request (default: 256 tiny, 128 mid and real)"
    )
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per session")
    parser.add_argument("--model", choices=("mid", "tiny", "real"), default="mid")
    parser.add_argument(
        "--context-per-session", type=int, default=DEFAULT_CONTEXT_PER_SESSION, metavar="N"
    )
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    parser.add_argument(
        "--contenders",
        default=",".join(n for n in SERVER_NAMES if n not in OPT_IN_CONTENDERS),
    )
    parser.add_argument(
        "--watch-events", action="store_true", help="a live SSE subscriber on skippy's events"
    )
    parser.add_argument(
        "--skippy-defaults", action="store_true", help="load skippy without --lanes/--ctx"
    )
    parser.add_argument(
        "--skippy-base",
        type=Path,
        metavar="DIR",
        help="the checkout the contender skippy-base runs (e.g. the previous head's worktree)",
    )
    parser.add_argument(
        "--skippy-spec",
        choices=("off", "auto", "ngram"),
        help="load skippy with --spec MODE (default: the load's default)",
    )
    parser.add_argument(
        "--skippy-flash-attn",
        choices=("off", "auto", "on"),
        help="load skippy with --flash-attn MODE (default: the load's default)",
    )
    args = parser.parse_args(argv)
    sessions = tuple(sorted({int(s) for s in args.sessions.split(",") if s.strip()}))
    contenders = tuple(dict.fromkeys(c.strip() for c in args.contenders.split(",") if c.strip()))
    if not sessions or min(sessions) < 1 or args.rounds < 1 or args.requests < 1:
        parser.error("need rounds, requests and session counts of at least 1")
    unknown = set(contenders) - set(SERVER_NAMES)
    if unknown or not contenders:
        parser.error(f"--contenders: choose from {', '.join(SERVER_NAMES)}")
    if (SKIPPY_BASE in contenders) != (args.skippy_base is not None):
        parser.error("the contender skippy-base and --skippy-base DIR go together")
    tokens = args.tokens or DEFAULT_TOKENS[args.model]
    if tokens + 64 > args.context_per_session:
        parser.error("--context-per-session must hold the prompt and --tokens")
    path = model_path(args.model)
    plan = Plan(
        contenders=contenders,
        sessions=sessions,
        rounds=args.rounds,
        work=Workload(args.requests, tokens, banned_tokens(path)),
        path=path,
        context_per_session=args.context_per_session,
        threads=args.threads,
        watch_events=args.watch_events,
        skippy_defaults=args.skippy_defaults,
        skippy_spec=args.skippy_spec,
        skippy_flash_attn=args.skippy_flash_attn,
        skippy_base=args.skippy_base,
    )
    try:
        rows, ratios = run(plan)
    except KeyboardInterrupt:  # every server was stopped on the way out
        sys.stderr.write("interrupted\n")
        return 130
    _report(plan, args.model, rows, ratios)
    summary = {
        "benchmark": "concurrent",
        "model": args.model,
        "tokens_per_request": tokens,
        "requests_per_session": args.requests,
        "threads": plan.threads,
        "context_per_session": plan.context_per_session,
        "watch_events": plan.watch_events,
        "skippy_defaults": plan.skippy_defaults,
        "rows": [asdict(r) for r in rows],
        "ratios": [asdict(r) for r in ratios],
        "skippy_4_over_1": _defaults_scaling(rows),
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
