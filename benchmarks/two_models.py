"""Two models on one machine: what a model's decoding costs when another model decodes too.

Each server setup holds two models (the same GGUF under two ids, or two llama-server processes
as llama-server's router would run them) with the same threads. A round times one greedy
request to the first model alone, then one request to each model at once; the figure is the
aggregate tokens/s of the two together over the tokens/s of one alone (1.0: two models together
go at the speed of one; 2.0 would need twice the cores). Setups, measured side by side in one
run, round-robin:

- ``skippy``: one runtime with both models; its engines take turns at computing
  (engine/compute_turns.py);
- ``skippy-no-turns``: the same with SKIPPY_COMPUTE_TURNS=off (the engines compute at once);
- ``llama-server``: two llama-server processes of the same llama.cpp, one per model.

Usage: ``.venv/bin/python -m benchmarks.two_models [--model real] [--rounds 5] [--tokens 64]``
(prints one JSON object; progress on stderr).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks import loadgen
from benchmarks.models import REPO, model_path
from benchmarks.servers import (
    MODEL_ALIAS,
    START_TIMEOUT_S,
    Server,
    ServerSpec,
    start_llama_server,
    start_skippy,
)

SECOND_ALIAS: Final = "bench2"
SETUPS: Final = ("skippy", "skippy-no-turns", "llama-server")


class Pair:
    """Two models: each one's base URL, headers and model id."""

    def __init__(self, servers: list[Server], targets: list[tuple[Server, str]]) -> None:
        self.servers = servers
        self.targets = targets

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _start_skippy_pair(spec: ServerSpec, directory: Path, turns: bool) -> Pair:
    env = dict(os.environ, SKIPPY_COMPUTE_TURNS="on" if turns else "off")
    server = start_skippy(spec, directory, env=env)
    try:
        load = [sys.executable, "-m", "skippyctl", "load", str(spec.path)]
        load += ["--alias", SECOND_ALIAS, "--lanes", "1", "--ctx", str(spec.context_per_session)]
        env["SKIPPY_RUNTIME_DIR"] = str(directory / "runtime")
        result = subprocess.run(
            load, cwd=REPO, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        if result.returncode != 0:
            raise RuntimeError(f"skippyctl load failed: {result.stderr.strip()[-800:]}")
    except BaseException:
        server.stop()
        raise
    return Pair([server], [(server, MODEL_ALIAS), (server, SECOND_ALIAS)])


def _start_llama_server_pair(spec: ServerSpec, directory: Path) -> Pair:
    first_dir, second_dir = directory / "a", directory / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    first = start_llama_server(spec, first_dir)
    try:
        second = start_llama_server(spec, second_dir)
    except BaseException:
        first.stop()
        raise
    return Pair([first, second], [(first, MODEL_ALIAS), (second, MODEL_ALIAS)])


def _request(server: Server, model: str, body: dict[str, Any]) -> int:
    payload = dict(body, model=model, stream=False)
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=900) as client:
        response = client.post("/v1/completions", json=payload)
    response.raise_for_status()
    tokens = int(response.json()["usage"]["completion_tokens"])
    if tokens != body["max_tokens"]:
        raise loadgen.BenchmarkError(f"{tokens} tokens, not {body['max_tokens']}")
    return tokens


def _timed(calls: list[Callable[[], int]]) -> float:
    """Aggregate tokens/s of `calls` run at once."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        tokens: int = sum(pool.map(lambda call: call(), calls))
    return tokens / (time.perf_counter() - started)


def _round(pair: Pair, body: dict[str, Any]) -> tuple[float, float]:
    (first, first_model), (second, second_model) = pair.targets
    for server, model in pair.targets:  # warm both: first-request costs are not measured
        _request(server, model, dict(body, max_tokens=4))
    alone = _timed([lambda: _request(first, first_model, body)])
    together = _timed(
        [
            lambda: _request(first, first_model, body),
            lambda: _request(second, second_model, body),
        ]
    )
    return alone, together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--setups", default=",".join(SETUPS))
    args = parser.parse_args()
    path = model_path(args.model)
    spec = ServerSpec(path, 1, 512, args.threads)
    work = loadgen.Workload(1, args.tokens, loadgen.banned_tokens(path))
    body = loadgen.body(work, "two-models", 0, stream=False)
    body.pop("user")
    setups = args.setups.split(",")
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in setups}
    for number in range(args.rounds):
        sys.stderr.write(f"round {number + 1}/{args.rounds}\n")
        for name in setups:
            with tempfile.TemporaryDirectory(prefix="two-models-") as directory:
                if name == "llama-server":
                    pair = _start_llama_server_pair(spec, Path(directory))
                else:
                    pair = _start_skippy_pair(spec, Path(directory), turns=name == "skippy")
                try:
                    alone, together = _round(pair, body)
                finally:
                    pair.stop()
            samples[name].append((alone, together))
            sys.stderr.write(
                f"{name:>16}: alone {alone:6.1f} tok/s, together {together:6.1f} tok/s "
                f"({together / alone:.3f})\n"
            )
    rows = []
    for name, pairs in samples.items():
        ratios = [together / alone for alone, together in pairs]
        rows.append(
            {
                "setup": name,
                "rounds": len(pairs),
                "alone_tokens_per_s": round(statistics.median(a for a, _ in pairs), 1),
                "together_tokens_per_s": round(statistics.median(t for _, t in pairs), 1),
                "together_over_alone": round(statistics.median(ratios), 3),
                "together_over_alone_min": round(min(ratios), 3),
                "together_over_alone_max": round(max(ratios), 3),
            }
        )
    record = {
        "benchmark": "two_models",
        "model": args.model,
        "tokens_per_request": args.tokens,
        "threads": args.threads,
        "rows": rows,
    }
    sys.stdout.write(orjson.dumps(record).decode() + "\n")


if __name__ == "__main__":
    main()
