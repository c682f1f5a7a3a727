"""The requests `benchmarks/decode_events.py` measures, at the client, against one runtime.

Contract: every request is a streaming `/v1/completions` of the same prompt and seed, greedy,
with every end-of-generation token of the model banned through ``logit_bias`` (``eog_ban``), so
it makes exactly the tokens it asks for (``check_tokens`` proves it once per runtime with a
non-streaming request's usage). TTFT is from sending the request to the first streamed text;
decode tokens/s is (tokens - 1) / (finish chunk - first text). ``measure_decode`` is one full
request with the host's and engine's CPU time around it, ``measure_ttft`` one short
(``TTFT_TOKENS``) request, ``measure_sessions`` as many simultaneous streams as clients
(distinct session ids under ``tag``): aggregate tokens/s over the wall time from the first send
to the last finish, p50 TTFT.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.decode import PROMPT, SEED
from benchmarks.decode_events_runtimes import MODEL_ALIAS, Runtime
from benchmarks.loadgen import banned_tokens

TTFT_TOKENS: Final = 2
BAN_BIAS: Final = -1e9
"""JSON has no -inf; this is far below any logit of these models."""


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    tokens_per_s: float
    host_cpu_ms: float = 0.0
    """CPU time the runtime host process used during the decode request(s)."""
    engine_cpu_ms: float = 0.0
    """CPU time its engine worker used (mostly llama.cpp compute)."""


def request_body(max_tokens: int, ban: dict[str, float]) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": SEED,
        "logit_bias": ban,
    }


def stream_once(
    client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[float, float, float, float]:
    """One streaming completion: (sent, first text, finish, tokens/s) with perf_counter stamps."""
    first: float | None = None
    finish: float | None = None
    sent = time.perf_counter()
    with client.stream(
        "POST", "/v1/completions", json=dict(body, stream=True), headers=headers
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            now = time.perf_counter()
            chunk = orjson.loads(payload)
            if "error" in chunk:
                raise RuntimeError(f"generation failed: {chunk['error']}")
            choice = chunk["choices"][0]
            if choice["text"] and first is None:
                first = now
            if choice["finish_reason"] is not None:
                finish = now
    if first is None or finish is None:
        raise RuntimeError("the stream had no text or no finish")
    tokens = int(body["max_tokens"])
    rate = (tokens - 1) / (finish - first) if tokens > 1 and finish > first else 0.0
    return sent, first, finish, rate


def check_tokens(runtime: Runtime, tokens: int, ban: dict[str, float]) -> None:
    answer = runtime.client.post("/v1/completions", json=request_body(tokens, ban))
    answer.raise_for_status()
    made = int(answer.json()["usage"]["completion_tokens"])
    if made != tokens:
        raise RuntimeError(f"{runtime.variant.name}: made {made} tokens, not {tokens}")


def measure_decode(runtime: Runtime, tokens: int, ban: dict[str, float]) -> Sample:
    host, engine = runtime.cpu_ms()
    sent, first, _finish, rate = stream_once(runtime.client, request_body(tokens, ban))
    host_after, engine_after = runtime.cpu_ms()
    return Sample((first - sent) * 1000, rate, host_after - host, engine_after - engine)


def measure_ttft(runtime: Runtime, ban: dict[str, float]) -> float:
    sent, first, _finish, _rate = stream_once(runtime.client, request_body(TTFT_TOKENS, ban))
    return (first - sent) * 1000


def measure_sessions(
    runtime: Runtime, clients: list[httpx.Client], tokens: int, ban: dict[str, float], tag: str
) -> Sample:
    """`len(clients)` simultaneous streams, each its own session; aggregate tokens/s, p50 TTFT."""
    host, engine = runtime.cpu_ms()
    barrier = threading.Barrier(len(clients))
    results: list[tuple[float, float, float, float] | BaseException] = [
        RuntimeError("not run")
    ] * len(clients)

    def one(index: int) -> None:
        headers = {**runtime.headers, "X-Session-Id": f"{tag}-{index}"}
        barrier.wait()
        try:
            results[index] = stream_once(clients[index], request_body(tokens, ban), headers)
        except BaseException as error:  # noqa: BLE001 - reported below, in the main thread
            results[index] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done: list[tuple[float, float, float, float]] = []
    for result in results:
        if isinstance(result, BaseException):
            raise RuntimeError(f"{runtime.variant.name}: a session stream failed") from result
        done.append(result)
    host_after, engine_after = runtime.cpu_ms()
    wall = max(r[2] for r in done) - min(r[0] for r in done)
    median_ttft_ms = statistics.median((r[1] - r[0]) * 1000 for r in done)
    return Sample(
        median_ttft_ms, tokens * len(done) / wall, host_after - host, engine_after - engine
    )


def eog_ban(path: Path) -> dict[str, float]:
    """Every end-of-generation token of the model's vocabulary, banned (a vocab-only load)."""
    return {str(token): BAN_BIAS for token in banned_tokens(path)}
