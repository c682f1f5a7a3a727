"""The cost of loading on demand: a request for a model that is not loaded, against its load.

Each round starts two fresh runtimes with the model in ``--models-dir`` (none loaded) and
measures, from the client:

- in one: ``load``, ``POST /api/runtime/models/load`` until the ``model_available`` event
  arrives on the event stream (subscribed before the post), then ``loaded_first_token``, a
  streamed ``/v1/completions`` naming the model until its first text chunk (the first request
  of a freshly loaded model: a cold prefill, as on demand);
- in the other: ``on_demand``, the same request with the model not loaded.

``overhead_ms`` = on_demand − load − loaded_first_token: what loading inside the request costs
beyond loading first and then asking (the issue's target: ≤ 50 ms). Medians over the rounds,
ranges beside them.

Usage: ``.venv/bin/python -m benchmarks.on_demand [--model real] [--rounds 5]`` (one JSON
object on stdout; progress on stderr).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks import loadgen
from benchmarks.models import model_path
from benchmarks.servers import Server, ServerSpec, start_skippy

MODEL_ID: Final = "ondemand"
EVENTS_PATH: Final = "/api/runtime/events/v1"


def _runtime(spec: ServerSpec, directory: Path) -> tuple[Server, Path]:
    """A runtime with no model loaded and the model in its models directory (its file)."""
    models = directory / "models"
    models.mkdir()
    model = models / f"{MODEL_ID}.gguf"
    os.symlink(spec.path, model)
    server = start_skippy(spec, directory, serve_args=("--models-dir", str(models)), load=False)
    return server, model


def _first_chunk_s(server: Server, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed completion to its first text chunk."""
    payload = dict(body, model=MODEL_ID, stream=True)
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client:
        started = time.perf_counter()
        with client.stream("POST", "/v1/completions", json=payload) as response:
            response.raise_for_status()
            first: float | None = None
            for line in response.iter_lines():  # all of it: the request ends before the next
                text = line.replace(" ", "")
                if first is None and text.startswith("data:{") and '"text":""' not in text:
                    first = time.perf_counter() - started
    if first is None:
        raise loadgen.BenchmarkError("the stream ended without text")
    return first


def _load_s(server: Server, model: Path) -> float:
    """Seconds from posting a load to the model_available event on the stream."""
    available = threading.Event()
    subscribed = threading.Event()

    def watch() -> None:
        with (
            httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client,
            client.stream("GET", EVENTS_PATH) as stream,
        ):
            subscribed.set()
            for line in stream.iter_lines():
                if line.startswith("data:") and '"model_available"' in line and MODEL_ID in line:
                    available.set()
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if not subscribed.wait(30):
        raise loadgen.BenchmarkError("the event stream did not open")
    time.sleep(0.2)  # the stream's opening frames are out
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client:
        started = time.perf_counter()
        response = client.post(
            "/api/runtime/models/load", json={"model": str(model), "alias": MODEL_ID}
        )
        response.raise_for_status()
        if not available.wait(300):
            raise loadgen.BenchmarkError("model_available never came")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = model_path(args.model)
    spec = ServerSpec(path, 1, 512, args.threads)
    work = loadgen.Workload(1, 8, loadgen.banned_tokens(path))
    body = loadgen.body(work, "on-demand", 0, stream=True)
    loads: list[float] = []
    on_demand: list[float] = []
    loaded: list[float] = []
    for number in range(args.rounds):
        sys.stderr.write(f"round {number + 1}/{args.rounds}\n")
        with tempfile.TemporaryDirectory(prefix="on-demand-") as directory:
            server, model = _runtime(spec, Path(directory))
            try:
                loads.append(_load_s(server, model))
                loaded.append(_first_chunk_s(server, body))
            finally:
                server.stop()
        with tempfile.TemporaryDirectory(prefix="on-demand-") as directory:
            server, _ = _runtime(spec, Path(directory))
            try:
                on_demand.append(_first_chunk_s(server, body))
            finally:
                server.stop()
        overhead = on_demand[-1] - loads[-1] - loaded[-1]
        sys.stderr.write(
            f"  load {loads[-1] * 1000:.1f} ms, on demand {on_demand[-1] * 1000:.1f} ms, "
            f"first token loaded {loaded[-1] * 1000:.1f} ms, overhead {overhead * 1000:.1f} ms\n"
        )
    overheads = [d - load - t for d, load, t in zip(on_demand, loads, loaded, strict=True)]

    def ms(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values) * 1000, 1),
            "min": round(min(values) * 1000, 1),
            "max": round(max(values) * 1000, 1),
        }

    record = {
        "benchmark": "on_demand",
        "model": args.model,
        "rounds": args.rounds,
        "load_ms": ms(loads),
        "on_demand_first_token_ms": ms(on_demand),
        "loaded_first_token_ms": ms(loaded),
        "overhead_ms": ms(overheads),
        "target_overhead_ms": 50.0,
        "meets_target": statistics.median(overheads) * 1000 <= 50.0,
    }
    sys.stdout.write(orjson.dumps(record).decode() + "\n")


if __name__ == "__main__":
    main()
