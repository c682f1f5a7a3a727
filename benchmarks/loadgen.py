"""The load generator of the serving benchmarks: S sessions of streaming `/v1/completions`.

Every server gets the same request bodies: one prompt per session and request (sharing a
prefix), greedy (temperature 0, top_k 1), repeat_penalty 1, one seed, `user` = the session
name, and every end-of-generation token banned with `logit_bias` -100 (the OpenAI range), so
each request makes exactly `tokens` tokens; a request must end with finish_reason "length". The
warm-up request of every server start is non-streaming and must report
`usage.completion_tokens` == its max_tokens, so every server counts tokens alike.

Optionally a live subscriber reads skippy's SSE event stream (`/api/runtime/events/v1`) for the
whole run, as the dashboard would (`watch_events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.servers import MODEL_ALIAS, SEED, Server

BAN_BIAS: Final = -100.0
WARMUP_TOKENS: Final = 16
PROMPT: Final = (
    "The quick brown fox jumps over the lazy dog while the cat watches from the wall. "
    "Here is what happened next, told by session"
)
REQUEST_TIMEOUT_S: Final = 900.0


class BenchmarkError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Workload:
    requests: int
    """Sequential requests per session."""
    tokens: int
    """Completion tokens per request."""
    banned: tuple[int, ...]
    """The model's end-of-generation tokens."""


@dataclass(frozen=True, slots=True)
class RequestSample:
    latency_s: float
    ttft_s: float
    tokens: int
    turn: int = 0
    """The request's place in its session (0: the first, whose prompt is all new; later turns
    share the session's prefix, so their prefill is short)."""


@dataclass(frozen=True, slots=True)
class RunSample:
    """One S-session run on one server."""

    wall_s: float
    tokens: int
    requests: tuple[RequestSample, ...]
    events_seen: int = 0
    """Frames the live SSE subscriber read during the run (0 without one)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def banned_tokens(path: Path) -> tuple[int, ...]:
    """Every end-of-generation token of the model's vocabulary (llama_vocab_is_eog)."""
    import llama_cpp
    from llama_cpp import _logger

    _logger.set_verbose(False)
    llama: Any = llama_cpp
    llama.llama_backend_init()
    params = llama.llama_model_default_params()
    params.vocab_only = True
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit(f"cannot read the vocabulary of {path}")
    try:
        vocab = llama.llama_model_get_vocab(model)
        count = int(llama.llama_vocab_n_tokens(vocab))
        return tuple(t for t in range(count) if llama.llama_vocab_is_eog(vocab, t))
    finally:
        llama.llama_model_free(model)


def prompt(session: str, request: int) -> str:
    return f"{PROMPT} {session}, part {request}:"


def body(
    work: Workload, session: str, request: int, stream: bool, tokens: int | None = None
) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS,
        "prompt": prompt(session, request),
        "max_tokens": work.tokens if tokens is None else tokens,
        "temperature": 0.0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "seed": SEED,
        "logit_bias": {str(token): BAN_BIAS for token in work.banned},
        "user": session,
        "stream": stream,
    }


async def _one(client: httpx.AsyncClient, payload: dict[str, Any], tokens: int) -> RequestSample:
    """One streaming request; every chunk's text is read, the finish reason checked."""
    started = time.perf_counter()
    first: float | None = None
    finish: str | None = None
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:500]
            raise BenchmarkError(f"HTTP {response.status_code}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, SSE comments (pings)
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = orjson.loads(data)
            if "error" in chunk:
                raise BenchmarkError(f"stream error: {chunk['error']}")
            choices = chunk.get("choices") or ()
            if not choices:
                continue  # a usage-only chunk
            choice = choices[0]
            if first is None and choice.get("text"):
                first = time.perf_counter()
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    ended = time.perf_counter()
    if finish != "length" or first is None:
        raise BenchmarkError(f"a request ended with finish_reason {finish!r}, not 'length'")
    return RequestSample(latency_s=ended - started, ttft_s=first - started, tokens=tokens)


async def _watch(client: httpx.AsyncClient, seen: list[int], ready: asyncio.Event) -> None:
    """Read (and decode) every frame of the live event stream, as a client would."""
    async with client.stream(
        "GET", "/api/runtime/events/v1", headers={"Accept": "text/event-stream"}
    ) as response:
        if response.status_code != 200:
            raise BenchmarkError(f"event stream: HTTP {response.status_code}")
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                orjson.loads(line[5:])
                seen[0] += 1
                ready.set()


async def run_sessions(
    server: Server, work: Workload, sessions: int, watch_events: bool = False
) -> RunSample:
    limits = httpx.Limits(max_connections=sessions + 2, max_keepalive_connections=sessions + 2)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        seen = [0]
        watcher: asyncio.Task[None] | None = None
        if watch_events:
            ready = asyncio.Event()
            watcher = asyncio.create_task(_watch(client, seen, ready))
            await asyncio.wait_for(ready.wait(), 30.0)  # attached: the replay arrived
            seen[0] = 0

        async def session(index: int) -> list[RequestSample]:
            name = f"s{sessions}-{index}"
            samples = []
            for request in range(work.requests):
                payload = body(work, name, request, stream=True)
                sample = await _one(client, payload, work.tokens)
                samples.append(dataclasses.replace(sample, turn=request))
            return samples

        # The client's own full collections (15 ms a pass over this process's heap, seen at the
        # start of runs) would land in whichever request is waiting: the heap so far is frozen
        # out of them for the measured run.
        gc.collect()
        gc.freeze()
        try:
            started = time.perf_counter()
            results = await asyncio.gather(*(session(i) for i in range(sessions)))
            wall = time.perf_counter() - started
        finally:
            gc.unfreeze()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await watcher
    requests = tuple(sample for samples in results for sample in samples)
    return RunSample(wall, sum(r.tokens for r in requests), requests, seen[0])


def warm_up(server: Server, work: Workload) -> None:
    """One non-streaming request: warms the server up and checks that it made exactly the
    tokens asked for (usage.completion_tokens, finish_reason "length"). Then the same request
    streamed through the measured client path (httpx's async stack): its first use in a
    process costs tens of milliseconds of imports and set-up, which would otherwise land in
    the TTFT of whichever server the first measured run happens to drive."""
    payload = body(work, "warmup", 0, stream=False, tokens=WARMUP_TOKENS)
    with httpx.Client(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S
    ) as client:
        response = client.post("/v1/completions", json=payload)
    if response.status_code != 200:
        raise BenchmarkError(f"{server.name} warm-up: HTTP {response.status_code} {response.text}")
    answer = response.json()
    made = answer["usage"]["completion_tokens"]
    finish = answer["choices"][0]["finish_reason"]
    if made != WARMUP_TOKENS or finish != "length":
        raise BenchmarkError(
            f"{server.name} warm-up made {made} tokens ({finish}), not {WARMUP_TOKENS} (length)"
        )
    asyncio.run(_warm_stream(server, work))


async def _warm_stream(server: Server, work: Workload) -> None:
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S
    ) as client:
        payload = body(work, "warmup", 0, stream=True, tokens=WARMUP_TOKENS)
        await _one(client, payload, WARMUP_TOKENS)
