"""The most any speculation could give on this machine: a step of S lanes whose every proposal
is right, against a plain step of S lanes, timed with the kernels the default load computes
with (the batch-invariant library, flash attention off, one KV stream per lane).

    .venv/bin/python -m benchmarks.spec_ceiling [--model real] [--rounds 3] [--threads 2]
        [--sessions 1,4,8] [--windows 2,4,8,16,32]

A verify step decodes each lane's pending token and its window of W proposals at once. If every
proposal were right, each lane would commit W + 1 tokens in that step, so the step's tokens/s,
against the plain step's, is what a perfect proposer could add: no window policy, proposer or
draft model can do better at that batch (a real one is right less often and pays for the rest
of its window too). Reported per session count: the plain step's ms and tokens/s, each window's
ms and its tokens/s ratio to plain, and the ceiling — the best ratio over the windows.

Each round is one process (the library is chosen when a process maps it); every lane holds
300 cached tokens, and each timed step's tokens leave the KV after it, so every step runs at
the same depth. Medians over the rounds. Prints a table on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Final

import orjson

from benchmarks.models import model_path

CACHED: Final = 300
REPEATS: Final = 12
CONTEXT_PER_LANE: Final = 512


def measure(path: str, sessions: list[int], windows: list[int], threads: int) -> dict[str, float]:
    """In this process: ``{"S=…/W=…": ms per step}``, W=0 for the plain step."""
    import llama_cpp

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept: C holds the pointer
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    lanes = max(sessions)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = lanes * CONTEXT_PER_LANE
    params.n_seq_max = lanes
    params.kv_unified = False
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    context = llama_cpp.llama_init_from_model(model, params)
    memory = llama_cpp.llama_get_memory(context)
    batch = llama_cpp.llama_batch_init(CONTEXT_PER_LANE, 0, 1)
    tokens = [100 + (i * 37) % 1000 for i in range(CONTEXT_PER_LANE)]

    def decode(rows: list[tuple[int, int]], all_logits: bool) -> None:
        for i, (position, sequence) in enumerate(rows):
            batch.token[i] = tokens[(position + sequence) % CONTEXT_PER_LANE]
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = all_logits or i == len(rows) - 1
        batch.n_tokens = len(rows)
        if llama_cpp.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")

    for sequence in range(lanes):
        decode([(p, sequence) for p in range(CACHED)], all_logits=False)
    result: dict[str, float] = {}
    for count in sessions:
        for window in [0, *windows]:
            rows = [(CACHED + k, s) for s in range(count) for k in range(window + 1)]
            times = []
            for _ in range(REPEATS):
                began = time.perf_counter()
                decode(rows, all_logits=True)  # a step asks for every lane's logits
                times.append(time.perf_counter() - began)
                for sequence in range(count):
                    llama_cpp.llama_memory_seq_rm(memory, sequence, CACHED, -1)
            result[f"S={count}/W={window}"] = statistics.median(times) * 1000
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
    return result


def _child(path: str, sessions: str, windows: str, threads: int) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.spec_ceiling", "--child", path]
    command += ["--sessions", sessions, "--windows", windows, "--threads", str(threads)]
    done = subprocess.run(command, check=True, capture_output=True)
    figures: dict[str, float] = orjson.loads(done.stdout)
    return figures


def _counts(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        return []  # refused by the caller with the others


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", default="1,4,8", help="comma-separated lane counts")
    parser.add_argument("--windows", default="2,4,8,16,32", help="proposals per lane")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sessions, windows = _counts(args.sessions), _counts(args.windows)
    if not sessions or not windows or min(sessions + windows) < 1:
        parser.error("--sessions and --windows take comma-separated positive counts")
    if max(sessions) * (max(windows) + 1) > CONTEXT_PER_LANE:
        parser.error(f"a step of --sessions × (--windows + 1) tokens must fit {CONTEXT_PER_LANE}")
    if args.child:
        from skippyctl.engine.kernels import preload_invariant_kernels

        problem = preload_invariant_kernels()
        if problem is not None:
            raise SystemExit(f"spec_ceiling: {problem}")
        figures = measure(args.child, sessions, windows, args.threads)
        sys.stdout.write(orjson.dumps(figures).decode() + "\n")
        return 0
    path = str(model_path(args.model))
    runs = []
    for index in range(args.rounds):
        runs.append(_child(path, args.sessions, args.windows, args.threads))
        sys.stderr.write(f"round {index + 1} of {args.rounds}\n")
    ms = {case: statistics.median(run[case] for run in runs) for case in runs[0]}
    rows: list[dict[str, Any]] = []
    for count in sessions:
        plain = ms[f"S={count}/W=0"]
        plain_rate = count / plain * 1000
        ratios = {}
        for window in windows:
            step = ms[f"S={count}/W={window}"]
            ratios[window] = (count * (window + 1) / step * 1000) / plain_rate
        best = max(ratios, key=lambda w: ratios[w])
        rows.append(
            {
                "sessions": count,
                "plain_step_ms": round(plain, 2),
                "plain_tokens_per_s": round(plain_rate, 1),
                "window_step_ms": {str(w): round(ms[f"S={count}/W={w}"], 2) for w in windows},
                "all_right_ratio": {str(w): round(r, 3) for w, r in ratios.items()},
                "ceiling": round(ratios[best], 3),
                "ceiling_window": best,
            }
        )
    out = sys.stderr
    out.write(f"model {os.path.basename(path)}, {args.threads} threads, {args.rounds} rounds\n")
    out.write(f"{'S':>3} {'plain ms':>9} {'tok/s':>7}  " + " ".join(f"W={w:<6}" for w in windows))
    out.write("  ceiling\n")
    for row in rows:
        cells = " ".join(f"{row['all_right_ratio'][str(w)]:<8.3f}" for w in windows)
        out.write(f"{row['sessions']:>3} {row['plain_step_ms']:>9.2f} ")
        out.write(f"{row['plain_tokens_per_s']:>7.1f}  {cells}  {row['ceiling']:.3f}\n")
    summary = {
        "model": os.path.basename(path),
        "threads": args.threads,
        "rounds": args.rounds,
        "rows": rows,
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
