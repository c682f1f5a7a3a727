"""Benchmark 4 of issue 6: single-stream decode speed of the engine against plain llama.cpp.

    .venv/bin/python -m benchmarks.decode [--rounds 5] [--models tiny,mid] [--tokens N]

Same model, prompt, seed and thread count (os.cpu_count()) for three variants, greedy with every
end-of-generation token banned through logit_bias so each run makes exactly N tokens (default
512 on `fixtures/tiny.gguf`, 128 on the mid-size model BENCH_MID, generated on demand at
/tmp/skippy-bench/bench-mid.gguf):

- engine: `skippyctl.engine.generation.BatchEngine` (one lane) on a llama context created as the
  engine worker does; numbers from its `gen_done` (ttft_ms, decode_tokens_per_s).
- minimal: a bare llama.cpp loop in this script (llama_batch_get_one, logit-bias + greedy
  sampler chain, no detokenization).
- high-level: llama-cpp-python's `Llama(...).create_completion(..., temperature=0,
  logit_bias=..., max_tokens=N, stream=True)`; each streamed chunk is timed.

TTFT is the time from handing over the prompt text to the first sampled token; tokens/s is the
inter-token rate, (tokens - 1) / (last token - first token), for all three. Each run is its own
subprocess (the OpenMP teams of two llama contexts in one process slow each other down), with
one unmeasured warm-up generation before the measured one, and the order of the variants
rotates every round. Reports medians with the spread (min..max) and the ratios of medians
engine/minimal (target ≥ 0.95) and engine/high-level (target ≥ 1.00). Prints a table on stderr
and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from benchmarks.models import REPO, model_path

DEFAULT_TOKENS: Final = {"tiny": 512, "mid": 128}
VARIANTS: Final = ("engine", "minimal", "high-level")
TARGET_VS_MINIMAL: Final = 0.95
TARGET_VS_HIGH_LEVEL: Final = 1.00
PROMPT: Final = "The quick brown fox jumps over the lazy dog while the cat watches from the wall."
SEED: Final = 1234
WARMUP_TOKENS: Final = 8
MAX_CONTEXT_TOKENS: Final = 4096  # as the engine worker: min(training context, 4096)


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    tokens_per_s: float
    tokens: int


@dataclass(frozen=True)
class Row:
    model: str
    tokens: int
    rounds: int
    variant: str
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    ttft_ms: float
    ttft_min_ms: float
    ttft_max_ms: float


# ------------------------------------------------------------------ child side (one variant)


def _threads() -> int:
    return max(1, os.cpu_count() or 1)


def _open(llama: Any, path: str) -> tuple[Any, Any]:
    """Model and one-sequence context, made the way the engine worker makes them."""
    llama.llama_backend_init()
    model = llama.llama_model_load_from_file(path.encode(), llama.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {path}")
    params = llama.llama_context_default_params()
    params.n_ctx = min(int(llama.llama_model_n_ctx_train(model)), MAX_CONTEXT_TOKENS)
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = _threads()
    context = llama.llama_init_from_model(model, params)
    if not context:
        raise SystemExit("cannot create a context")
    return model, context


def _eog_tokens(llama: Any, model: Any) -> list[int]:
    vocab = llama.llama_model_get_vocab(model)
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    return [t for t in range(n_vocab) if llama.llama_vocab_is_eog(vocab, t)]


def _run_engine(llama: Any, path: str, n_tokens: int) -> Sample:
    from skippyctl.engine.generation import BatchEngine, GenerateRequest
    from skippyctl.engine.protocol_messages import EngineMessage, GenDone
    from skippyctl.engine.sampling import SamplingParams

    model, context = _open(llama, path)
    done: queue.Queue[GenDone] = queue.Queue()

    def emit(message: EngineMessage) -> None:
        if isinstance(message, GenDone):
            done.put(message)

    sampling = SamplingParams(
        temperature=0.0,
        seed=SEED,
        logit_bias=tuple((t, -math.inf) for t in _eog_tokens(llama, model)),
    )
    engine = BatchEngine(llama, model, context, lanes=1, emit=emit)
    engine.start()
    try:
        result: GenDone | None = None
        for request_id, tokens in (("warmup", WARMUP_TOKENS), ("measured", n_tokens)):
            engine.submit(GenerateRequest(request_id, PROMPT, max_tokens=tokens, sampling=sampling))
            result = done.get(timeout=600)
            if result.outcome != "completed":
                raise SystemExit(f"engine request {request_id} ended {result}")
    finally:
        engine.stop()
        llama.llama_free(context)
        llama.llama_model_free(model)
    figures = None if result is None else result.figures
    if figures is None or figures.ttft_ms is None or figures.decode_tokens_per_s is None:
        raise SystemExit(f"engine request measured has no timings: {result}")
    return Sample(
        ttft_ms=figures.ttft_ms,
        tokens_per_s=figures.decode_tokens_per_s,
        tokens=figures.generated_tokens,
    )


def _run_minimal(llama: Any, path: str, n_tokens: int) -> Sample:
    model, context = _open(llama, path)
    vocab = llama.llama_model_get_vocab(model)
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    banned = _eog_tokens(llama, model)
    biases = (llama.llama_logit_bias * len(banned))()
    for index, token in enumerate(banned):
        biases[index].token = token
        biases[index].bias = -math.inf
    chain_params = llama.llama_sampler_chain_default_params()
    chain_params.no_perf = True
    chain = llama.llama_sampler_chain_init(chain_params)
    llama.llama_sampler_chain_add(
        chain, llama.llama_sampler_init_logit_bias(n_vocab, len(banned), biases)
    )
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
    memory = llama.llama_get_memory(context)
    one = (llama.llama_token * 1)()

    def generate(count: int) -> Sample:
        started = time.perf_counter()
        data = PROMPT.encode()
        capacity = len(data) + 2
        prompt = (llama.llama_token * capacity)()
        n_prompt = int(llama.llama_tokenize(vocab, data, len(data), prompt, capacity, True, True))
        if n_prompt <= 0:
            raise SystemExit("llama_tokenize failed")
        if llama.llama_decode(context, llama.llama_batch_get_one(prompt, n_prompt)) != 0:
            raise SystemExit("llama_decode failed on the prompt")
        one[0] = llama.llama_sampler_sample(chain, context, -1)
        first = last = time.perf_counter()
        for _ in range(count - 1):
            if llama.llama_decode(context, llama.llama_batch_get_one(one, 1)) != 0:
                raise SystemExit("llama_decode failed")
            one[0] = llama.llama_sampler_sample(chain, context, -1)
            last = time.perf_counter()
        rate = (count - 1) / (last - first) if count > 1 else 0.0
        return Sample((first - started) * 1000, rate, count)

    try:
        generate(WARMUP_TOKENS)
        llama.llama_memory_clear(memory, True)
        llama.llama_sampler_reset(chain)
        return generate(n_tokens)
    finally:
        llama.llama_sampler_free(chain)
        llama.llama_free(context)
        llama.llama_model_free(model)


def _run_high_level(llama: Any, path: str, n_tokens: int) -> Sample:
    threads = _threads()
    llama.llama_backend_init()
    # A full (mmap) load: with vocab_only llama_model_n_ctx_train reports 0.
    probe = llama.llama_model_load_from_file(path.encode(), llama.llama_model_default_params())
    if not probe:
        raise SystemExit(f"cannot load {path}")
    n_ctx = min(int(llama.llama_model_n_ctx_train(probe)), MAX_CONTEXT_TOKENS)
    llama.llama_model_free(probe)
    llm = llama.Llama(
        path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=SEED, verbose=False
    )
    vocab = llama.llama_model_get_vocab(llm.model)
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    bias = {t: -math.inf for t in range(n_vocab) if llama.llama_vocab_is_eog(vocab, t)}

    def generate(count: int) -> Sample:
        llm.reset()  # no prompt-prefix reuse from the previous run
        started = time.perf_counter()
        stamps: list[float] = []
        stream = llm.create_completion(
            PROMPT,
            max_tokens=count,
            temperature=0.0,
            repeat_penalty=1.0,
            seed=SEED,
            logit_bias=bias,
            stream=True,
        )
        for chunk in stream:
            choice = chunk["choices"][0]
            if choice["finish_reason"] is None or choice["text"]:
                stamps.append(time.perf_counter())  # not the closing empty chunk
        if not stamps:
            raise SystemExit("create_completion streamed nothing")
        span = stamps[-1] - stamps[0]
        rate = (count - 1) / span if span > 0 else 0.0
        return Sample((stamps[0] - started) * 1000, rate, len(stamps))

    generate(WARMUP_TOKENS)
    return generate(n_tokens)


def _child(variant: str, path: str, n_tokens: int) -> int:
    import llama_cpp

    llama: Any = llama_cpp
    runner = {"engine": _run_engine, "minimal": _run_minimal, "high-level": _run_high_level}
    sample = runner[variant](llama, path, n_tokens)
    sys.stdout.write(orjson.dumps(asdict(sample)).decode() + "\n")
    return 0


# ------------------------------------------------------------------ parent side


def _measure(variant: str, path: Path, n_tokens: int) -> Sample:
    command = [sys.executable, "-m", "benchmarks.decode", "--child", variant]
    command += ["--model-path", str(path), "--tokens", str(n_tokens)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"{variant} on {path.name} failed (exit {result.returncode}): "
            f"{lines[-1] if lines else ''} {result.stderr.strip()[-800:]}"
        )
    report = orjson.loads(lines[-1])
    return Sample(float(report["ttft_ms"]), float(report["tokens_per_s"]), int(report["tokens"]))


def run(models: list[str], rounds: int, tokens: int | None) -> list[Row]:
    rows: list[Row] = []
    for name in models:
        path = model_path(name)
        n_tokens = tokens or DEFAULT_TOKENS[name]
        samples: dict[str, list[Sample]] = {variant: [] for variant in VARIANTS}
        for index in range(rounds):
            shift = index % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                samples[variant].append(_measure(variant, path, n_tokens))
        for variant in VARIANTS:
            rates = [s.tokens_per_s for s in samples[variant]]
            ttfts = [s.ttft_ms for s in samples[variant]]
            rows.append(
                Row(
                    model=name,
                    tokens=n_tokens,
                    rounds=rounds,
                    variant=variant,
                    tokens_per_s=round(statistics.median(rates), 1),
                    tokens_per_s_min=round(min(rates), 1),
                    tokens_per_s_max=round(max(rates), 1),
                    ttft_ms=round(statistics.median(ttfts), 2),
                    ttft_min_ms=round(min(ttfts), 2),
                    ttft_max_ms=round(max(ttfts), 2),
                )
            )
            made = {s.tokens for s in samples[variant]}
            if made != {n_tokens}:
                sys.stderr.write(f"note: {name}/{variant} reported {sorted(made)} tokens\n")
    return rows


def _ratios(rows: list[Row]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for model in dict.fromkeys(r.model for r in rows):
        by = {r.variant: r for r in rows if r.model == model}
        engine = by["engine"].tokens_per_s
        vs_minimal = engine / by["minimal"].tokens_per_s
        vs_high = engine / by["high-level"].tokens_per_s
        out.append(
            {
                "model": model,
                "engine_vs_minimal": round(vs_minimal, 4),
                "engine_vs_minimal_ok": vs_minimal >= TARGET_VS_MINIMAL,
                "engine_vs_high_level": round(vs_high, 4),
                "engine_vs_high_level_ok": vs_high >= TARGET_VS_HIGH_LEVEL,
                "ttft_engine_vs_minimal": round(by["engine"].ttft_ms / by["minimal"].ttft_ms, 4),
                "ttft_engine_vs_high_level": round(
                    by["engine"].ttft_ms / by["high-level"].ttft_ms, 4
                ),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,mid", help="comma-separated: tiny, mid")
    parser.add_argument("--tokens", type=int, help="tokens per run (default: 512 tiny, 128 mid)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child, args.model_path, args.tokens)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = run(models, args.rounds, args.tokens)
    ratios = _ratios(rows)
    sys.stderr.write(
        f"{'model':>5} {'tokens':>6} {'variant':>10} {'tokens/s (min..max)':>28} "
        f"{'TTFT ms (min..max)':>26}\n"
    )
    for row in rows:
        rate = f"{row.tokens_per_s:.1f} ({row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f})"
        ttft = f"{row.ttft_ms:.2f} ({row.ttft_min_ms:.2f}..{row.ttft_max_ms:.2f})"
        sys.stderr.write(
            f"{row.model:>5} {row.tokens:>6} {row.variant:>10} {rate:>28} {ttft:>26}\n"
        )
    for ratio in ratios:
        sys.stderr.write(
            f"{ratio['model']}: engine/minimal {ratio['engine_vs_minimal']:.3f} "
            f"(≥ {TARGET_VS_MINIMAL}: {'yes' if ratio['engine_vs_minimal_ok'] else 'NO'}), "
            f"engine/high-level {ratio['engine_vs_high_level']:.3f} "
            f"(≥ {TARGET_VS_HIGH_LEVEL}: {'yes' if ratio['engine_vs_high_level_ok'] else 'NO'}); "
            f"TTFT engine/minimal {ratio['ttft_engine_vs_minimal']:.3f}, "
            f"engine/high-level {ratio['ttft_engine_vs_high_level']:.3f}\n"
        )
    summary = {"benchmark": "decode", "rows": [asdict(r) for r in rows], "ratios": ratios}
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
