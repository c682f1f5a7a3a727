"""What one decode step costs by what it holds, with one KV stream per lane and with a unified KV.

    .venv/bin/python -m benchmarks.step_passes [--model real|mid|tiny] [--repeats 5]
        [--threads 2]

One llama context of 4 sequences, 512 cells each (the given threads, llama.cpp's defaults
otherwise), as the engine makes it for `load --lanes 4 --ctx 2048`. Every sequence first holds a
33-token prompt; then each composition below is decoded `--repeats` times (the sequences'
positions move on, as in serving) and its median time printed, for a split KV (`kv_unified`
false, the engine's default) and a unified one. `forward_passes` is the engine's count of
llama.cpp's micro-batches for the composition under a split KV
(`llama_batch_allocr::split_equal`): the compositions show why the engine decodes prompts that
complete in a step alone when decoding lanes would add a pass to it
(`decode_core._prompts_first`): compare "1 decoding + 3 prompts × 2" with "3 prompts × 2"
followed by "4 decoding".

Prints a table on stderr and one JSON summary on stdout. Times are this machine's: compare
within a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Final

import orjson

from benchmarks.models import model_path
from skippyctl.engine.batch import forward_passes

PROMPT_TOKENS: Final = 33
LANES: Final = 4
CELLS_PER_LANE: Final = 512
COMPOSITIONS: Final[tuple[tuple[str, tuple[tuple[int, int], ...]], ...]] = (
    ("1 decoding", ((0, 1),)),
    ("1 prompt × 2", ((0, 2),)),
    ("1 prompt × 9", ((0, 9),)),
    ("4 decoding", ((0, 1), (1, 1), (2, 1), (3, 1))),
    ("3 decoding, lanes 0 2 3", ((0, 1), (2, 1), (3, 1))),
    ("3 prompts × 2", ((1, 2), (2, 2), (3, 2))),
    ("1 decoding + 3 prompts × 2", ((0, 1), (1, 2), (2, 2), (3, 2))),
    ("2 prompts × 9", ((1, 9), (2, 9))),
)


def _context(llama: Any, model: Any, unified: bool, threads: int) -> Any:
    params = llama.llama_context_default_params()
    params.n_ctx = LANES * CELLS_PER_LANE
    params.n_seq_max = LANES
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = unified
    context = llama.llama_init_from_model(model, params)
    if not context:
        raise SystemExit("llama.cpp could not make the context")
    return context


def _measure(llama: Any, model: Any, unified: bool, threads: int, repeats: int) -> dict[str, float]:
    context = _context(llama, model, unified, threads)
    batch = llama.llama_batch_init(512, 0, 1)
    positions = [0] * LANES
    vocab_tokens = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model)))

    def decode(rows: tuple[tuple[int, int], ...]) -> float:
        n = 0
        for seq, tokens in rows:
            for i in range(tokens):
                batch.token[n] = (100 + positions[seq]) % vocab_tokens
                batch.pos[n] = positions[seq]
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = i == tokens - 1
                positions[seq] += 1
                n += 1
        batch.n_tokens = n
        started = time.perf_counter()
        if llama.llama_decode(context, batch) != 0:
            raise SystemExit("llama_decode failed")
        return (time.perf_counter() - started) * 1000.0

    try:
        for seq in range(LANES):
            decode(((seq, PROMPT_TOKENS),))
        medians = {}
        for name, rows in COMPOSITIONS:
            decode(rows)  # unmeasured: the graph for this shape is built once
            medians[name] = statistics.median(decode(rows) for _ in range(repeats))
        return medians
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("real", "mid", "tiny"), default="real")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)
    llama: Any = llama_cpp
    llama.llama_backend_init()
    path = model_path(args.model)
    model = llama.llama_model_load_from_file(os.fsencode(path), llama.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {path}")
    try:
        split = _measure(llama, model, False, args.threads, args.repeats)
        unified = _measure(llama, model, True, args.threads, args.repeats)
    finally:
        llama.llama_model_free(model)
    sys.stderr.write(
        f"model {args.model}, {args.threads} threads, {LANES} lanes × {CELLS_PER_LANE} cells, "
        f"median of {args.repeats} decodes (ms)\n"
        f"{'step holds':>28} {'passes':>6} {'split':>8} {'unified':>8}\n"
    )
    rows = []
    for name, composition in COMPOSITIONS:
        passes = forward_passes(composition)
        sys.stderr.write(f"{name:>28} {passes:>6} {split[name]:8.1f} {unified[name]:8.1f}\n")
        rows.append(
            {
                "step": name,
                "forward_passes_split": passes,
                "split_ms": round(split[name], 2),
                "unified_ms": round(unified[name], 2),
            }
        )
    sys.stdout.write(orjson.dumps({"model": args.model, "steps": rows}).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
