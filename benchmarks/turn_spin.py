"""What compute turns cost one engine alone: decode time with `SKIPPY_COMPUTE_TURNS` on and off,
beside llama-server, on the real model.

    .venv/bin/python -m benchmarks.turn_spin [--rounds N] [--tokens N] [--threads T] [--spins N,…]

Each round starts three servers in turn (rotated order), each with one slot on the real small
instruct model (SmolLM2-135M-Instruct Q4_1): skippy `--spec off` with compute turns on (the
default: its engines run with libgomp's spin count at `TURN_SPIN_COUNT`), skippy `--spec off`
with `SKIPPY_COMPUTE_TURNS=off` (libgomp's default spin), and llama-server. Each gets a warm-up,
then one greedy completion of --tokens tokens (end of generation banned) on a 140-token prompt
(a code listing to repeat). Measured: the decode time of that completion, from skippy's receipt
(`decode_ms`) and llama-server's `timings.predicted_ms`. Reported: the median decode ms of each
and the paired ratios. `--spins` adds a skippy with compute turns on and that spin count for
each (`GOMP_SPINCOUNT` in its environment, which the engine leaves as it finds it).

Prints a table on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.loadgen import banned_tokens
from benchmarks.models import model_path
from benchmarks.servers import LLAMA_SERVER, MODEL_ALIAS, SEED, SKIPPY, ServerSpec, start
from benchmarks.spec_auto import REPETITIVE_PROMPTS

TURNS_ON: Final = "skippy, compute turns on"
TURNS_OFF: Final = "skippy, compute turns off"
VARIANTS: Final = (TURNS_ON, TURNS_OFF, LLAMA_SERVER)
SPIN_PREFIX: Final = "skippy, turns on, spin "


def _decode_ms(name: str, tokens: int, threads: int, banned: tuple[int, ...]) -> float:
    path = model_path("real")
    previous = {key: os.environ.get(key) for key in ("SKIPPY_COMPUTE_TURNS", "GOMP_SPINCOUNT")}
    os.environ["SKIPPY_COMPUTE_TURNS"] = "off" if name == TURNS_OFF else "on"
    if name.startswith(SPIN_PREFIX):
        os.environ["GOMP_SPINCOUNT"] = name.removeprefix(SPIN_PREFIX)
    body: dict[str, Any] = {
        "model": MODEL_ALIAS,
        "prompt": REPETITIVE_PROMPTS[1],
        "max_tokens": tokens,
        "temperature": 0.0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "seed": SEED,
        "logit_bias": {str(token): -100.0 for token in banned},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="skippy-turn-spin-") as temp:
            server_name = LLAMA_SERVER if name == LLAMA_SERVER else SKIPPY
            spec = ServerSpec(path, 1, 512 + tokens, threads, skippy_load_args=("--spec", "off"))
            server = start(server_name, spec, Path(temp))
            try:
                with httpx.Client(
                    base_url=server.url, headers=server.headers, timeout=600.0
                ) as client:
                    client.post("/v1/completions", json={**body, "max_tokens": 8})
                    answer = client.post("/v1/completions", json=body)
                    answer.raise_for_status()
                    if server_name == LLAMA_SERVER:
                        return float(answer.json()["timings"]["predicted_ms"])
                    request_id = answer.headers["x-request-id"]
                    receipt = client.get(f"/api/runtime/requests/{request_id}/receipt").json()
                    return float(receipt["decode_ms"])
            finally:
                server.stop()
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spins", default="", help="more skippy variants: spin counts, e.g. 30000")
    args = parser.parse_args(argv)
    banned = banned_tokens(model_path("real"))
    spins = tuple(f"{SPIN_PREFIX}{int(n)}" for n in args.spins.split(",") if n.strip())
    variants = VARIANTS + spins
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(args.rounds):
        turn = index % len(variants)
        order = variants[turn:] + variants[:turn]
        for name in order:
            ms = _decode_ms(name, args.tokens, args.threads, banned)
            times[name].append(ms)
            sys.stderr.write(f"round {index + 1}: {name:>32}: decode {ms:8.1f} ms\n")
    summary: dict[str, Any] = {
        name: round(statistics.median(values), 1) for name, values in times.items()
    }
    for ours in (TURNS_ON, TURNS_OFF, *spins):
        paired = [a / b for a, b in zip(times[LLAMA_SERVER], times[ours], strict=True)]
        summary[f"{ours}: speed / llama-server's"] = round(statistics.median(paired), 3)
    for key, value in summary.items():
        sys.stderr.write(f"{key}: {value}\n")
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
