"""The ggml CPU kernels an engine can compute with, side by side: llama.cpp's stock library with
flash attention on (the default load) and off, and the batch-invariant library with it off (what
`load --flash-attn off` maps; skippyctl/engine/kernels.py).

    .venv/bin/python -m benchmarks.kernels [--model real] [--rounds 3] [--threads 2]

Each round runs one process per setup (the library is chosen when a process maps it), the order
rotating between rounds. A process loads the model with 8 sequences and times, in milliseconds:

- **decode**: one token of one sequence with 300 tokens in its KV cache (per token, over 64);
- **window of W**: W tokens of one sequence at once after 300 cached (a verify window of W − 1
  proposals), for W = 8, 16 and 64 (per window, over 8);
- **8 lanes**: one token of each of 8 sequences in one batch, each with 100 cached (per step,
  over 32);
- **prompt**: a 2,000-token prompt from an empty cache in batches of 512.

Reported: medians over the rounds, and each setup's median over the stock library's with flash
attention on (below 1 is faster). Token ids are a fixed pattern. Prints a table on stderr, one
JSON summary on stdout.
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

SETUPS: Final = {
    "stock, flash attention on": ("stock", True),
    "stock, flash attention off": ("stock", False),
    "invariant, flash attention off": ("invariant", False),
}
CACHED: Final = 300
LANES: Final = 8
PROMPT: Final = 2000
MICRO_BATCH: Final = 512
WINDOWS: Final = (8, 16, 64)


def measure(path: str, flash: bool, threads: int) -> dict[str, float]:
    """In this process: the model at ``path``, the timings of the module's docstring."""
    import llama_cpp

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept: C holds the pointer
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = LANES * (PROMPT + 64)
    params.n_seq_max = LANES
    params.kv_unified = False
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if flash
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    context = llama_cpp.llama_init_from_model(model, params)
    memory = llama_cpp.llama_get_memory(context)
    batch = llama_cpp.llama_batch_init(MICRO_BATCH, 0, 1)
    tokens = [100 + (i * 37) % 1000 for i in range(PROMPT)]

    def decode(rows: list[tuple[int, int]]) -> None:
        """``rows``: (position, sequence); logits for every row of a short batch, as a verify
        window or a step of lanes asks, else the last."""
        for i, (position, sequence) in enumerate(rows):
            batch.token[i] = tokens[(position + sequence) % PROMPT]
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = len(rows) <= max(WINDOWS) or i == len(rows) - 1
        batch.n_tokens = len(rows)
        if llama_cpp.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def fill(count: int, sequence: int = 0) -> None:
        for start in range(0, count, MICRO_BATCH):
            decode([(p, sequence) for p in range(start, min(count, start + MICRO_BATCH))])

    def timed(repeats: int, step: Any) -> float:
        began = time.perf_counter()
        for index in range(repeats):
            step(index)
        return (time.perf_counter() - began) * 1000 / repeats

    result: dict[str, float] = {}
    llama_cpp.llama_memory_clear(memory, True)
    fill(CACHED)
    result["decode"] = timed(64, lambda i: decode([(CACHED + i, 0)]))
    for width in WINDOWS:
        llama_cpp.llama_memory_clear(memory, True)
        fill(CACHED)
        result[f"window of {width}"] = timed(
            8, lambda i, w=width: decode([(CACHED + i * w + k, 0) for k in range(w)])
        )
    llama_cpp.llama_memory_clear(memory, True)
    for sequence in range(LANES):
        fill(100, sequence)
    result[f"{LANES} lanes"] = timed(32, lambda i: decode([(100 + i, s) for s in range(LANES)]))
    llama_cpp.llama_memory_clear(memory, True)
    began = time.perf_counter()
    fill(PROMPT)
    result["prompt"] = (time.perf_counter() - began) * 1000
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
    return result


def _child(library: str, flash: bool, path: str, threads: int) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.kernels", "--child", library, path]
    command += ["--threads", str(threads), "--flash", "on" if flash else "off"]
    done = subprocess.run(command, check=True, capture_output=True)
    figures: dict[str, float] = orjson.loads(done.stdout)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--flash", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        library, path = args.child
        if library == "invariant":
            from skippyctl.engine.kernels import preload_invariant_kernels

            problem = preload_invariant_kernels()
            if problem is not None:
                raise SystemExit(f"kernels: {problem}")
        figures = measure(path, args.flash == "on", args.threads)
        sys.stdout.write(orjson.dumps(figures).decode() + "\n")
        return 0
    path = str(model_path(args.model))
    names = list(SETUPS)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            library, flash = SETUPS[name]
            runs[name].append(_child(library, flash, path, args.threads))
        sys.stderr.write(f"round {index + 1} of {args.rounds}\n")
    cases = list(runs[names[0]][0])
    medians = {
        name: {case: statistics.median(run[case] for run in runs[name]) for case in cases}
        for name in names
    }
    summary: dict[str, Any] = {
        "model": os.path.basename(path),
        "threads": args.threads,
        "rounds": args.rounds,
        "ms": {name: {c: round(v, 2) for c, v in medians[name].items()} for name in names},
        "ranges": {
            name: {
                case: [
                    round(min(r[case] for r in runs[name]), 2),
                    round(max(r[case] for r in runs[name]), 2),
                ]
                for case in cases
            }
            for name in names
        },
    }
    base = names[0]
    sys.stderr.write(
        f"{'ms (ratio to ' + base + ')':>34}" + "".join(f"{c:>18}" for c in cases) + "\n"
    )
    for name in names:
        cells = "".join(
            f" {medians[name][c]:>10.2f} ({medians[name][c] / medians[base][c]:.2f})" for c in cases
        )
        sys.stderr.write(f"{name:>34}{cells}\n")
    summary["over_stock_flash_on"] = {
        name: {c: round(medians[name][c] / medians[base][c], 3) for c in cases} for name in names
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
