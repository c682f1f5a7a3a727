"""Speculative decoding over HTTP: skippy's `--spec ngram` against off, and against llama-server.

    .venv/bin/python -m benchmarks.speculation [--rounds N] [--sessions 1,4] [--tokens N]
        [--models mid-f16-successor,mid-f16] [--threads T] [--llama-server-types …] [--plugin]

For each model and S in --sessions, every variant is started fresh (benchmarks/servers.py: same
model, threads, flash attention, S parallel sequences, 512 + --tokens context each, split KV),
warmed up, driven by S concurrent sessions each sending one streaming greedy `/v1/completions`
of --tokens tokens (end-of-generation banned), and stopped. Variants: skippy with speculation
off and with `--spec ngram`, llama-server without and with each `--spec-type` given. Rounds
alternate the order of the variants (round r runs them rotated by r), so drift on this noisy
machine hits all alike. Reported per model, S and variant: the median aggregate tokens/s, and
the paired per-round ratios of skippy ngram / skippy off, and skippy ngram / the best
llama-server n-gram type.

Targets (issue 14): on the successor model (`mid-f16-successor`: 1024 hidden, 8 layers, F16, the
issue's shape; its greedy output cycles, so proposals match), skippy ngram ≥ 2.5 × skippy off and
≥ 1.0 × llama-server's best n-gram mode, with 1 and 4 sessions; on its random twin `mid-f16`,
skippy ngram ≥ 0.97 × skippy off (speculation must cost nothing when it fails).

With --plugin, two more skippy variants: `--spec plugin` with the C example plugin
(examples/plugins/c, built here), the same prompt lookup in its own process, asked once per
step under the default deadline — its ratio to in-process `--spec ngram` is what the plugin
boundary costs (target ≥ 0.97) —, and the same with `--spec-runahead-tokens 64` (a query asks
for 64 tokens past the window: the next window when this one verifies whole, no query then).
With --draft (successor models only), `load --draft` with a one-layer draft of the model (the
same vocabulary and cycles; its 32000 × 1024 output layer is most of its cost).

With --wire-stages N, every skippy variant serves the model split over N local `stage serve`
workers, each behind a `stage relay` with issue 13's wire model (3 ms + exp(5 ms) jitter + 2 % ×
40 ms stalls; benchmarks/stages.py), and llama-server is left out: what run-ahead windows
(`runahead / plugin`) and speculation itself (`plugin / off`) do when every decode step pays
the links' round trips.

Prints a table and the verdicts on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson

from benchmarks.loadgen import Workload, banned_tokens, run_sessions, warm_up
from benchmarks.models import model_path
from benchmarks.servers import LLAMA_SERVER, SKIPPY, ServerSpec, start
from benchmarks.stages import StageWorker, Wire

SKIPPY_OFF: Final = "skippy"
SKIPPY_NGRAM: Final = "skippy --spec ngram"
SKIPPY_PLUGIN: Final = "skippy --spec plugin (C)"
SKIPPY_PLUGIN_AHEAD: Final = "skippy plugin runahead 64"
SKIPPY_DRAFT: Final = "skippy --draft (1 layer)"
RUNAHEAD_TOKENS: Final = 64
TARGET_PLUGIN: Final = 0.97
DEFAULT_LLAMA_SERVER_TYPES: Final = ("ngram-simple", "ngram-map-k", "ngram-mod")
TARGET_SPEEDUP: Final = 2.5
TARGET_PEER: Final = 1.0
TARGET_NO_MATCH: Final = 0.97
SUCCESSOR_MODELS: Final = ("mid-f16-successor", "mid-successor")
PROMPT_ROOM: Final = 512


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    server: str
    skippy_args: tuple[str, ...] = ()
    llama_server_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    """As :attr:`Verdict.model`."""
    sessions: int
    variant: str
    rounds: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float


@dataclass(frozen=True, slots=True)
class Verdict:
    model: str
    """The model, or what else the runs are told apart by (benchmarks/spec_auto.py: the
    workload)."""
    sessions: int
    what: str
    ratio_of_medians: float
    paired_median: float
    paired_min: float
    paired_max: float
    target: float
    met: bool


def variants(
    types: tuple[str, ...], plugin: Path | None = None, draft: Path | None = None
) -> list[Variant]:
    found = [
        Variant(SKIPPY_OFF, SKIPPY, skippy_args=("--spec", "off")),
        Variant(SKIPPY_NGRAM, SKIPPY, skippy_args=("--spec", "ngram")),
        Variant(LLAMA_SERVER, LLAMA_SERVER),
    ]
    if plugin is not None:
        plugged = ("--spec", "plugin", "--plugin", str(plugin))
        ahead = (*plugged, "--spec-runahead-tokens", str(RUNAHEAD_TOKENS))
        found[2:2] = [
            Variant(SKIPPY_PLUGIN, SKIPPY, skippy_args=plugged),
            Variant(SKIPPY_PLUGIN_AHEAD, SKIPPY, skippy_args=ahead),
        ]
    if draft is not None:
        found.insert(2, Variant(SKIPPY_DRAFT, SKIPPY, skippy_args=("--draft", str(draft))))
    found += [
        Variant(f"llama-server {t}", LLAMA_SERVER, llama_server_args=("--spec-type", t))
        for t in types
    ]
    return found


def _measure(
    variant: Variant, path: Path, sessions: int, tokens: int, threads: int, wire_stages: int = 0
) -> float:
    work = Workload(requests=1, tokens=tokens, banned=banned_tokens(path))
    with (
        tempfile.TemporaryDirectory(prefix="skippy-spec-") as temp,
        contextlib.ExitStack() as stack,
    ):
        stage_args: tuple[str, ...] = ()
        if wire_stages:
            log = stack.enter_context(open(Path(temp) / "stages.log", "wb"))
            workers = [StageWorker(1, log, Wire()) for _ in range(wire_stages)]
            for worker in workers:
                stack.callback(worker.stop)
            stage_args = tuple(a for w in workers for a in ("--stage", w.wait_ready()))
        spec = ServerSpec(
            path,
            sessions,
            PROMPT_ROOM + tokens,
            threads,
            skippy_load_args=(*variant.skippy_args, *stage_args),
            llama_server_args=variant.llama_server_args,
        )
        server = start(variant.server, spec, Path(temp))
        try:
            warm_up(server, work)
            sample = asyncio.run(run_sessions(server, work, sessions))
        finally:
            server.stop()
    sys.stderr.write(
        f"  {variant.name:>26} S={sessions}: {sample.tokens_per_s:8.1f} tok/s "
        f"({sample.tokens} tokens in {sample.wall_s:.2f} s)\n"
    )
    return sample.tokens_per_s


def verdict(
    model: str, sessions: int, what: str, ours: list[float], theirs: list[float], target: float
) -> Verdict:
    paired = [a / b for a, b in zip(ours, theirs, strict=True)]
    of_medians = statistics.median(ours) / statistics.median(theirs)
    return Verdict(
        model,
        sessions,
        what,
        round(of_medians, 3),
        round(statistics.median(paired), 3),
        round(min(paired), 3),
        round(max(paired), 3),
        target,
        of_medians >= target and statistics.median(paired) >= target,
    )


def run(
    models: tuple[str, ...],
    sessions: tuple[int, ...],
    rounds: int,
    tokens: int,
    threads: int,
    types: tuple[str, ...],
    plugin: Path | None = None,
    skippy_only: bool = False,
    draft: bool = False,
    wire_stages: int = 0,
) -> tuple[list[Row], list[Verdict]]:
    rows: list[Row] = []
    verdicts: list[Verdict] = []
    for model in models:
        path = model_path(model)
        successor = model in SUCCESSOR_MODELS
        # On a model where proposals rarely match only the cost of trying matters: skippy alone.
        # The one-layer draft of the successor model (same vocabulary and cycles).
        draft_path = model_path("mid-f16-successor-draft") if draft and successor else None
        chosen = variants(types, plugin, draft_path)
        if skippy_only or wire_stages or not successor:
            chosen = [v for v in chosen if v.server == SKIPPY]
        for count in sessions:
            rates: dict[str, list[float]] = {v.name: [] for v in chosen}
            for index in range(rounds):
                sys.stderr.write(f"{model} S={count} round {index + 1}/{rounds}\n")
                order = chosen[index % len(chosen) :] + chosen[: index % len(chosen)]
                for variant in order:
                    rates[variant.name].append(
                        _measure(variant, path, count, tokens, threads, wire_stages)
                    )
            for name, values in rates.items():
                rows.append(
                    Row(
                        model,
                        count,
                        name,
                        rounds,
                        round(statistics.median(values), 1),
                        round(min(values), 1),
                        round(max(values), 1),
                    )
                )
            on, off = rates[SKIPPY_NGRAM], rates[SKIPPY_OFF]
            if SKIPPY_DRAFT in rates:
                verdicts.append(
                    verdict(model, count, "draft / off", rates[SKIPPY_DRAFT], off, TARGET_SPEEDUP)
                )
            if SKIPPY_PLUGIN in rates:
                verdicts.append(
                    verdict(model, count, "plugin / ngram", rates[SKIPPY_PLUGIN], on, TARGET_PLUGIN)
                )
                ahead = rates[SKIPPY_PLUGIN_AHEAD]
                verdicts.append(verdict(model, count, "runahead / ngram", ahead, on, TARGET_PLUGIN))
                verdicts.append(
                    verdict(
                        model, count, "runahead / plugin", ahead, rates[SKIPPY_PLUGIN], TARGET_PEER
                    )
                )
                if wire_stages:
                    verdicts.append(
                        verdict(
                            model, count, "plugin / off", rates[SKIPPY_PLUGIN], off, TARGET_SPEEDUP
                        )
                    )
            if successor:
                verdicts.append(verdict(model, count, "ngram / off", on, off, TARGET_SPEEDUP))
                peers = [name for name in rates if name.startswith("llama-server ")]
                if peers:
                    best = max(peers, key=lambda name: statistics.median(rates[name]))
                    verdicts.append(
                        verdict(model, count, f"ngram / {best}", on, rates[best], TARGET_PEER)
                    )
            else:
                verdicts.append(verdict(model, count, "ngram / off", on, off, TARGET_NO_MATCH))
    return rows, verdicts


def build_example_plugin(directory: Path) -> Path:
    """The C example plugin, compiled against this checkout's plugin ABI header."""
    root = Path(__file__).resolve().parents[1]
    out = directory / "ngram_plugin.so"
    subprocess.run(
        [
            "cc",
            "-std=c11",
            "-O2",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            f"-I{root / 'native' / 'include'}",
            "-o",
            str(out),
            str(root / "examples" / "plugins" / "c" / "ngram_plugin.c"),
        ],
        check=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", default="1,4")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--models", default="mid-f16-successor,mid-f16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server-types", default=",".join(DEFAULT_LLAMA_SERVER_TYPES))
    parser.add_argument(
        "--plugin", action="store_true", help="also measure --spec plugin with the C example"
    )
    parser.add_argument(
        "--skippy-only", action="store_true", help="leave llama-server out (no peer build)"
    )
    parser.add_argument(
        "--draft",
        action="store_true",
        help="also measure --draft with a one-layer draft of the successor model",
    )
    parser.add_argument(
        "--wire-stages",
        type=int,
        default=0,
        help="serve skippy over N local stages behind the wire model (llama-server left out)",
    )
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    sessions = tuple(int(s) for s in args.sessions.split(",") if s)
    types = tuple(t for t in args.llama_server_types.split(",") if t)
    with tempfile.TemporaryDirectory(prefix="skippy-plugin-") as built:
        plugin = build_example_plugin(Path(built)) if args.plugin else None
        rows, verdicts = run(
            models,
            sessions,
            args.rounds,
            args.tokens,
            args.threads,
            types,
            plugin,
            args.skippy_only,
            args.draft,
            args.wire_stages,
        )
    sys.stderr.write(f"\n{'model':>14} {'S':>2} {'variant':>26} {'tok/s':>8} {'min..max':>15}\n")
    for row in rows:
        spread = f"{row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f}"
        sys.stderr.write(
            f"{row.model:>14} {row.sessions:>2} {row.variant:>26} {row.tokens_per_s:8.1f} "
            f"{spread:>15}\n"
        )
    sys.stderr.write("\n")
    for v in verdicts:
        mark = "met" if v.met else "NOT met"
        sys.stderr.write(
            f"{v.model} S={v.sessions} {v.what}: {v.ratio_of_medians:.3f} (paired "
            f"{v.paired_median:.3f}, {v.paired_min:.3f}..{v.paired_max:.3f}) target "
            f"≥ {v.target}: {mark}\n"
        )
    sys.stdout.write(
        orjson.dumps(
            {"rows": [asdict(r) for r in rows], "verdicts": [asdict(v) for v in verdicts]}
        ).decode()
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
