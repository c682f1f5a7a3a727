"""llama.cpp's flash attention on this machine's CPU: what one `llama_decode` costs with it and
without it, for the shapes skippy serves (`load --flash-attn`).

    .venv/bin/python -m benchmarks.flash_attn [--model real] [--rounds 5] [--threads 2]
        [--contexts 300,1100] [--windows 1,16,32,63,64] [--prompt 2000] [--invariant-kernels]

Two contexts of the model (one with flash attention, one without), each one sequence, the same
threads, side by side in one process. Each round, for each in turn (the order alternating):

- **decode**: with `--contexts` N tokens in its KV cache, one token decoded — a plain decode
  step at that context;
- **window**: with 300 tokens in its KV cache, a batch of W tokens — a verify window of W − 1
  proposals (`--windows`);
- **prompt**: a `--prompt`-token prompt from an empty cache, in batches of 512 (llama.cpp's
  micro-batch).

Reported: the median milliseconds of each and their ratio (without / with: below 1 means
without is faster). Token ids are a fixed pattern; attention does not depend on their values.

Prints a table on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import orjson

from benchmarks.models import model_path

MICRO_BATCH: Final = 512
WINDOW_CONTEXT: Final = 300


def _tokens(count: int) -> Any:
    import llama_cpp

    return (llama_cpp.llama_token * count)(*[100 + (i * 37) % 1000 for i in range(count)])


class Context:
    """One sequence of the model with flash attention on or off."""

    def __init__(self, model: Any, flash: bool, n_ctx: int, threads: int) -> None:
        import llama_cpp

        self._llama = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.pointer = llama_cpp.llama_init_from_model(model, params)
        if not self.pointer:
            raise RuntimeError("llama_init_from_model failed")

    def decode(self, tokens: Any, start: int, count: int) -> None:
        llama = self._llama
        view = ctypes.cast(ctypes.addressof(tokens) + start * 4, ctypes.POINTER(llama.llama_token))
        if llama.llama_decode(self.pointer, llama.llama_batch_get_one(view, count)) != 0:
            raise RuntimeError("llama_decode failed")

    def fill(self, tokens: Any, count: int) -> None:
        """An empty cache, then ``count`` tokens in it (in micro-batches)."""
        self._llama.llama_memory_clear(self._llama.llama_get_memory(self.pointer), True)
        for start in range(0, count, MICRO_BATCH):
            self.decode(tokens, start, min(MICRO_BATCH, count - start))

    def free(self) -> None:
        self._llama.llama_free(self.pointer)


Step = Callable[["Context"], None]


def _timed(context: Context, prepare: Step, run: Step) -> float:
    prepare(context)
    started = time.perf_counter()
    run(context)
    return (time.perf_counter() - started) * 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="300,1100")
    parser.add_argument("--windows", default="1,16,32,63,64")
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument(
        "--invariant-kernels",
        action="store_true",
        help="both contexts on the ggml CPU library with batch-invariant products, as skippy's "
        "engines with --flash-attn off (skippyctl/engine/kernels.py)",
    )
    args = parser.parse_args(argv)
    contexts = [int(n) for n in args.contexts.split(",") if n.strip()]
    windows = [int(n) for n in args.windows.split(",") if n.strip()]
    if args.invariant_kernels:
        from skippyctl.engine.kernels import preload_invariant_kernels

        problem = preload_invariant_kernels()
        if problem is not None:
            parser.error(problem)

    import llama_cpp

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept: C holds the pointer
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    path = model_path(args.model)
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    if not model:
        raise RuntimeError(f"cannot load {path.name}")
    longest = max([*contexts, WINDOW_CONTEXT + max(windows, default=1), args.prompt]) + 1
    tokens = _tokens(longest)
    both = {flash: Context(model, flash, longest + 64, args.threads) for flash in (True, False)}

    def filled(count: int) -> Step:
        return lambda context: context.fill(tokens, count)

    def batch(at: int, count: int) -> Step:
        return lambda context: context.decode(tokens, at, count)

    cases: list[tuple[str, Step, Step]] = [
        (f"decode at {n}", filled(n), batch(n, 1)) for n in contexts
    ]
    cases += [(f"window of {w}", filled(WINDOW_CONTEXT), batch(WINDOW_CONTEXT, w)) for w in windows]
    if args.prompt > 0:
        cases.append((f"prompt of {args.prompt}", filled(0), filled(args.prompt)))
    times: dict[str, dict[bool, list[float]]] = {name: {True: [], False: []} for name, *_ in cases}
    for index in range(args.rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        for name, prepare, run in cases:
            for flash in order:
                times[name][flash].append(_timed(both[flash], prepare, run))
        sys.stderr.write(f"round {index + 1} of {args.rounds}\n")
    summary: dict[str, Any] = {"model": path.name, "threads": args.threads, "cases": {}}
    sys.stderr.write(f"{'':>20} {'with (ms)':>10} {'without':>10} {'without/with':>13}\n")
    for name, *_ in cases:
        with_fa = statistics.median(times[name][True])
        without = statistics.median(times[name][False])
        ratio = without / with_fa
        summary["cases"][name] = {
            "with_ms": round(with_fa, 2),
            "without_ms": round(without, 2),
            "without_over_with": round(ratio, 3),
        }
        sys.stderr.write(f"{name:>20} {with_fa:10.2f} {without:10.2f} {ratio:13.3f}\n")
    for context in both.values():
        context.free()
    llama_cpp.llama_model_free(model)
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
