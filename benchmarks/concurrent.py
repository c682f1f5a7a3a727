"""Benchmark 5 of issue 6: concurrent sessions over HTTP against `python -m llama_cpp.server`.

    .venv/bin/python -m benchmarks.concurrent [--rounds N] [--sessions 1,2,4,8] [--tokens N]
        [--requests R] [--model mid|tiny]

One async load generator (httpx) drives either server over HTTP on 127.0.0.1: S concurrent
sessions, each sending R sequential streaming `/v1/completions` requests, for S in --sessions.
It reports per server and S the aggregate tokens/s (all completion tokens / wall time of the
whole S-session run), p50/p95 request latency (send to `[DONE]`) and time to first token (send
to the first chunk with text), and the ratio skippy / llama_cpp.server of the aggregate rates.
Target (issue 6): with 4 sessions, skippy ≥ 2.5 × llama_cpp.server.

A third contender, the bare batched loop (`bare`), measures what this machine allows at all: no
server, no HTTP, no events, no sampler chain, just llama.cpp's batched decode in a child process
of this script. Its aggregate rate over llama_cpp.server's is the `ceiling` of the ratio any
server could reach here (llama_cpp.server serves one request at a time, so it decodes one
sequence per `llama_decode`; batching S sequences in one `llama_decode` does not make decode S
times faster on a few CPU cores), and skippy / bare (`skippy_vs_bare`) is the share of that
limit skippy gets.

The two servers get the same model file, llama.cpp build (the installed llama_cpp), threads
(os.cpu_count(), decode and batch), per-session context, flash attention (on: what llama.cpp's
"auto" picks for our engine on this CPU, and the faster setting for both here) and request
bodies: the same prompts (one per session and request, sharing a prefix), greedy (temperature
0, top_k 1), repeat_penalty 1, one seed, `user` = the session name, and every
end-of-generation token banned with `logit_bias` -100 (the OpenAI range), so each request makes
exactly --tokens tokens. A measured request must end with finish_reason "length" (max_tokens
reached, on both servers); the warm-up request of every server start is non-streaming and must
report `usage.completion_tokens` == its max_tokens, so both servers count tokens alike.

- skippy: `skippyctl runtime serve --port 0` with a private SKIPPY_RUNTIME_DIR, then
  `skippyctl load MODEL --lanes <max S> --ctx <lanes × per-session context>` (split KV: every
  lane gets its own per-session context). Sessions come from the `user` field.
- llama_cpp.server: `python -m llama_cpp.server --model MODEL --n_ctx <per-session context>` with
  the same threads and `--flash_attn True`, `--logits_all False` (its default True copies every
  logit row to numpy; nothing here needs logprobs), `--interrupt_requests False` (its default
  True ends a running stream whenever another request arrives, so concurrent requests would be
  cut short) and `--verbose False`. It has no parallel-sequence option: it serves one request
  at a time behind a lock, which is what this benchmark compares continuous batching against.
- bare: `python -m benchmarks.concurrent --bare-child SPEC` loads the same model with the same
  threads (decode and batch), flash attention on, `n_ctx` = S × per-session context and
  `n_seq_max` = S (split KV: one sequence id, and its own per-session context, per session) and
  `n_batch` = `n_ubatch` = max(512, the S prompts together). It tokenizes the same prompt texts
  as the load generator sends (skippy's tokenizer call, BOS as the vocabulary asks, before the
  clock starts), warms up like the servers (one sequence, the warm-up prompt, the warm-up token
  count), then for each request index r: all S sessions' prompts r in one batch (logits on each
  prompt's last token), then one `llama_decode` per step with one token per sequence (logits on
  each), greedy argmax with the same banned end-of-generation tokens, so every sequence makes
  exactly --tokens tokens; then `llama_memory_seq_rm` clears the S sequences. Its aggregate
  tokens/s is all completion tokens / wall time of the R requests, prefill included, as for
  the servers; every sequence of request r reports the request's latency and its first token
  time, so the latency/TTFT columns have the same meaning (all S requests start together here).

Every round measures each S as a group of three runs: each server (and the bare loop) is
started in its own process (own process group), warmed up with one request, runs the S sessions
and is stopped; the order of skippy and llama_cpp.server flips from one group to the next, as
when they were measured in pairs, and the bare run's place (last, first, middle) rotates every
two groups, so drift on the noisy 2-core machine hits all three alike. Every process is stopped
in `finally` (SIGTERM, then SIGKILL to the ids it started, the engine worker included), on
Ctrl-C too. Reports medians over the rounds with the spread (min..max) for tokens/s,
latency/TTFT percentiles over all requests of all rounds, and both the ratio of the median rates
and the median (min..max) of the per-round ratios, for skippy / llama_cpp.server (`ratio`,
`paired_ratio_*`), bare / llama_cpp.server (`ceiling`, `ceiling_paired_*`) and skippy / bare
(`skippy_vs_bare`, `skippy_vs_bare_paired_*`); the target counts as met only when both of its
statistics reach it, and the ceiling reaches it (`ceiling_reaches_target`) likewise. Prints a
table and a verdict line for the target on stderr and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import httpx
import orjson

from benchmarks.models import REPO, model_path
from skippyctl.client.discovery import pid_alive

SERVERS: Final = ("skippy", "llama_cpp.server")
BARE: Final = "bare"
CONTENDERS: Final = (*SERVERS, BARE)
TARGET_SESSIONS: Final = 4
TARGET_RATIO: Final = 2.5
DEFAULT_TOKENS: Final = {"tiny": 256, "mid": 128}
DEFAULT_REQUESTS: Final = 2
MIN_CONTEXT_PER_SESSION_TOKENS: Final = 512
PROMPT_ALLOWANCE_TOKENS: Final = 128
"""Room for the prompt in each session's context, beyond --tokens."""
MODEL_ALIAS: Final = "bench"
SEED: Final = 1234
BAN_BIAS: Final = -100.0
WARMUP_TOKENS: Final = 16
PROMPT: Final = (
    "The quick brown fox jumps over the lazy dog while the cat watches from the wall. "
    "Here is what happened next, told by session"
)
START_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 15.0
REQUEST_TIMEOUT_S: Final = 900.0
BARE_MIN_BATCH_TOKENS: Final = 512
"""The bare loop's n_batch and n_ubatch at least (llama_cpp.server's default for both)."""


@dataclass(frozen=True)
class RequestSample:
    latency_s: float
    ttft_s: float
    tokens: int


@dataclass(frozen=True)
class RunSample:
    """One S-session run on one server in one round."""

    wall_s: float
    tokens: int
    requests: list[RequestSample]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


@dataclass(frozen=True)
class Row:
    server: str
    sessions: int
    rounds: int
    requests: int
    tokens_per_request: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    latency_p50_ms: float
    latency_p95_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float


@dataclass(frozen=True)
class Ratio:
    sessions: int
    ratio: float
    paired_ratio_median: float
    paired_ratio_min: float
    paired_ratio_max: float
    target: float | None
    meets_target: bool | None
    # The bare batched loop (added after the fields above, which keep their names and order):
    ceiling: float
    """bare / llama_cpp.server, ratio of the median rates: the most any server could reach."""
    ceiling_paired_median: float
    ceiling_paired_min: float
    ceiling_paired_max: float
    ceiling_reaches_target: bool | None
    skippy_vs_bare: float
    """skippy / bare, ratio of the median rates: the share of the machine's limit skippy gets."""
    skippy_vs_bare_paired_median: float
    skippy_vs_bare_paired_min: float
    skippy_vs_bare_paired_max: float


@dataclass(frozen=True)
class Settings:
    path: Path
    sessions: tuple[int, ...]
    requests: int
    tokens: int
    context_per_session: int
    threads: int
    banned: tuple[int, ...]

    @property
    def lanes(self) -> int:
        return max(self.sessions)


# ------------------------------------------------------------------ processes


def _children(pid: int) -> list[int]:
    """Ids of the live processes whose parent is `pid` (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ")".
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


class Server:
    """A server process this script started (or the bare loop's), and the ids of the processes
    it spawned."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.name = name
        self.process = process
        self.log = log
        self.url = ""
        self.headers: dict[str, str] = {}
        self.spawned: set[int] = set()

    def note_children(self) -> None:
        self.spawned.update(_children(self.process.pid))

    def stop(self) -> None:
        """SIGTERM to the server (it shuts down in order), SIGKILL to whatever is left of the
        processes this server started; never anything else."""
        process = self.process
        if process.poll() is None:
            self.note_children()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for pid in self.spawned:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()


def _popen(
    name: str, command: list[str], log_path: Path, env: dict[str, str] | None = None
) -> Server:
    log = open(log_path, "wb")  # noqa: SIM115 - closed by Server.stop
    try:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: stopped as one, not by Ctrl-C
        )
    except BaseException:
        log.close()
        raise
    return Server(name, process, log)


def _log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-1500:]
    except OSError:
        return ""


def _start_skippy(settings: Settings, directory: Path) -> Server:
    runtime_dir = directory / "runtime"
    runtime_dir.mkdir()
    env = dict(os.environ, SKIPPY_RUNTIME_DIR=str(runtime_dir))
    log_path = directory / "skippy.log"
    command = [sys.executable, "-m", "skippyctl", "runtime", "serve", "--port", "0"]
    server = _popen("skippy", command, log_path, env)
    try:
        discovery = runtime_dir / "runtime.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not discovery.exists():
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"skippy runtime did not start: {_log_tail(log_path)}")
            time.sleep(0.05)
        data = orjson.loads(discovery.read_bytes())
        server.url = str(data["url"])
        server.headers = {"Authorization": f"Bearer {data['token']}"}
        load = [sys.executable, "-m", "skippyctl", "load", str(settings.path)]
        load += ["--lanes", str(settings.lanes), "--alias", MODEL_ALIAS]
        load += ["--ctx", str(settings.lanes * settings.context_per_session)]
        result = subprocess.run(
            load, cwd=REPO, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        if result.returncode != 0:
            raise RuntimeError(f"skippyctl load failed: {result.stderr.strip()[-800:]}")
        server.note_children()  # the engine worker
    except BaseException:
        server.stop()
        raise
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_llama_cpp_server(settings: Settings, directory: Path) -> Server:
    port = _free_port()
    threads = str(settings.threads)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(settings.path)]
    command += ["--model_alias", MODEL_ALIAS, "--n_ctx", str(settings.context_per_session)]
    command += ["--n_threads", threads, "--n_threads_batch", threads, "--seed", str(SEED)]
    command += ["--flash_attn", "True", "--logits_all", "False"]
    command += ["--interrupt_requests", "False", "--verbose", "False"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    log_path = directory / "llama_cpp_server.log"
    server = _popen("llama_cpp.server", command, log_path)
    server.url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            while True:
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama_cpp.server did not start: {_log_tail(log_path)}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/v1/models").status_code == 200:
                        break
                time.sleep(0.1)
    except BaseException:
        server.stop()
        raise
    return server


# ------------------------------------------------------------------ load generator


def _prompt(session: str, request: int) -> str:
    return f"{PROMPT} {session}, part {request}:"


def _body(
    settings: Settings, session: str, request: int, stream: bool, tokens: int | None = None
) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS,
        "prompt": _prompt(session, request),
        "max_tokens": settings.tokens if tokens is None else tokens,
        "temperature": 0.0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "seed": SEED,
        "logit_bias": {str(token): BAN_BIAS for token in settings.banned},
        "user": session,
        "stream": stream,
    }


class BenchmarkError(RuntimeError):
    pass


async def _one(client: httpx.AsyncClient, body: dict[str, Any], tokens: int) -> RequestSample:
    """One streaming request; every chunk's text is read, the finish reason checked."""
    started = time.perf_counter()
    first: float | None = None
    finish: str | None = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
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
            choice = chunk["choices"][0]
            if first is None and choice.get("text"):
                first = time.perf_counter()
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    ended = time.perf_counter()
    if finish != "length" or first is None:
        raise BenchmarkError(f"a request ended with finish_reason {finish!r}, not 'length'")
    return RequestSample(latency_s=ended - started, ttft_s=first - started, tokens=tokens)


async def _run_sessions(server: Server, settings: Settings, sessions: int) -> RunSample:
    limits = httpx.Limits(max_connections=sessions + 1, max_keepalive_connections=sessions + 1)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:

        async def session(index: int) -> list[RequestSample]:
            name = f"s{sessions}-{index}"
            samples = []
            for request in range(settings.requests):
                body = _body(settings, name, request, stream=True)
                samples.append(await _one(client, body, settings.tokens))
            return samples

        started = time.perf_counter()
        results = await asyncio.gather(*(session(i) for i in range(sessions)))
        wall = time.perf_counter() - started
    requests = [sample for samples in results for sample in samples]
    return RunSample(wall, sum(r.tokens for r in requests), requests)


def _warm_up(server: Server, settings: Settings) -> None:
    """One non-streaming request: warms the server up and checks that it made exactly the
    tokens asked for (usage.completion_tokens, finish_reason "length")."""
    body = _body(settings, "warmup", 0, stream=False, tokens=WARMUP_TOKENS)
    with httpx.Client(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S
    ) as client:
        response = client.post("/v1/completions", json=body)
    if response.status_code != 200:
        raise BenchmarkError(f"{server.name} warm-up: HTTP {response.status_code} {response.text}")
    answer = response.json()
    made = answer["usage"]["completion_tokens"]
    finish = answer["choices"][0]["finish_reason"]
    if made != WARMUP_TOKENS or finish != "length":
        raise BenchmarkError(
            f"{server.name} warm-up made {made} tokens ({finish}), not {WARMUP_TOKENS} (length)"
        )


def _measure(server_name: str, settings: Settings, sessions: int) -> RunSample:
    """Start the server, warm it up, run `sessions` sessions, stop it (always); or run the bare
    loop (`server_name` BARE) in its own process."""
    with tempfile.TemporaryDirectory(prefix="skippy-concurrent-") as temp:
        if server_name == BARE:
            sample = _run_bare(settings, sessions, Path(temp))
        else:
            starter = _start_skippy if server_name == "skippy" else _start_llama_cpp_server
            server = starter(settings, Path(temp))
            try:
                _warm_up(server, settings)
                sample = asyncio.run(_run_sessions(server, settings, sessions))
            finally:
                server.stop()
    sys.stderr.write(
        f"  {server_name:>16} S={sessions}: {sample.tokens_per_s:8.1f} tok/s "
        f"({sample.tokens} tokens in {sample.wall_s:.2f} s)\n"
    )
    return sample


# ------------------------------------------------------------------ bare batched loop


def _bare_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """Child side of the `bare` contender (see the module docstring): llama.cpp's batched
    decode and nothing else. Returns a RunSample as JSON-ready data."""
    import llama_cpp
    import numpy as np
    from llama_cpp import _logger

    from skippyctl.engine.text import tokenize

    _logger.set_verbose(False)
    llama: Any = llama_cpp
    sessions = int(spec["sessions"])
    tokens = int(spec["tokens"])
    per_session = int(spec["context_per_session"])
    threads = int(spec["threads"])
    banned = np.asarray(spec["banned"], dtype=np.int64)

    llama.llama_backend_init()
    model = llama.llama_model_load_from_file(
        str(spec["path"]).encode(), llama.llama_model_default_params()
    )
    if not model:
        raise SystemExit(f"cannot load {spec['path']}")
    context = batch = None
    try:
        vocab = llama.llama_model_get_vocab(model)
        n_vocab = int(llama.llama_vocab_n_tokens(vocab))
        # The load generator's prompt texts, tokenized as skippy does (BOS if the vocab wants it).
        prompts = [
            [tokenize(llama, vocab, _prompt(f"s{sessions}-{i}", r)) for i in range(sessions)]
            for r in range(int(spec["requests"]))
        ]
        warmup = [tokenize(llama, vocab, _prompt("warmup", 0))]
        widest = max(sum(len(p) for p in group) for group in [*prompts, warmup])
        longest = max(len(p) for group in [*prompts, warmup] for p in group)
        if longest + max(tokens, WARMUP_TOKENS) > per_session:
            raise SystemExit(f"prompt + {tokens} tokens exceed the {per_session}-token context")
        capacity = max(BARE_MIN_BATCH_TOKENS, widest, sessions)

        params = llama.llama_context_default_params()
        params.n_ctx = sessions * per_session
        params.n_seq_max = sessions  # split KV (kv_unified off): per_session cells per sequence
        params.n_batch = params.n_ubatch = capacity
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        context = llama.llama_init_from_model(model, params)
        if not context:
            raise SystemExit("cannot create a context")
        memory = llama.llama_get_memory(context)
        batch = llama.llama_batch_init(capacity, 0, 1)
        b_token, b_pos, b_logits = batch.token, batch.pos, batch.logits
        b_seq, n_seq_id = batch.seq_id, batch.n_seq_id
        for i in range(capacity):
            n_seq_id[i] = 1

        def decode_and_pick(rows: list[int]) -> list[int]:
            """llama_decode the batch, then the greedy token of each batch row in `rows`."""
            if llama.llama_decode(context, batch) != 0:
                raise SystemExit("llama_decode failed")
            picked = []
            for row in rows:
                pointer = llama.llama_get_logits_ith(context, row)
                if not pointer:
                    raise SystemExit(f"no logits for batch row {row}")
                logits = np.ctypeslib.as_array(pointer, shape=(n_vocab,))
                logits[banned] = -np.inf  # llama.cpp's own buffer, rewritten by the next decode
                picked.append(int(logits.argmax()))
            return picked

        def generate(group: list[list[int]], count: int) -> float:
            """Sequence i gets group[i]: one prefill batch, then count - 1 one-token-per-sequence
            decodes, so each sequence makes `count` tokens. Returns the first token's time."""
            n, rows = 0, []
            for seq, prompt in enumerate(group):
                for pos, token in enumerate(prompt):
                    b_token[n], b_pos[n], b_seq[n][0] = token, pos, seq
                    b_logits[n] = pos == len(prompt) - 1
                    n += 1
                rows.append(n - 1)
            batch.n_tokens = n
            last = decode_and_pick(rows)
            first = time.perf_counter()
            steps = list(range(len(group)))
            for step in range(count - 1):
                for seq in steps:
                    b_token[seq], b_pos[seq], b_seq[seq][0] = last[seq], len(group[seq]) + step, seq
                    b_logits[seq] = True
                batch.n_tokens = len(group)
                last = decode_and_pick(steps)
            for seq in steps:
                if not llama.llama_memory_seq_rm(memory, seq, -1, -1):
                    raise SystemExit(f"llama_memory_seq_rm failed for sequence {seq}")
            return first

        generate(warmup, WARMUP_TOKENS)  # as the servers' warm-up request: one sequence
        requests: list[dict[str, float]] = []
        started = time.perf_counter()
        for group in prompts:
            begun = time.perf_counter()
            first = generate(group, tokens)
            ended = time.perf_counter()
            sample = {"latency_s": ended - begun, "ttft_s": first - begun, "tokens": tokens}
            requests += [sample] * sessions
        wall = time.perf_counter() - started
        return {"wall_s": wall, "tokens": tokens * len(requests), "requests": requests}
    finally:
        if batch is not None:
            llama.llama_batch_free(batch)
        if context is not None:
            llama.llama_free(context)
        llama.llama_model_free(model)


def _bare_child(spec_path: str) -> int:
    spec = orjson.loads(Path(spec_path).read_bytes())
    result = _bare_loop(spec)
    Path(spec["result"]).write_bytes(orjson.dumps(result))
    return 0


def _run_bare(settings: Settings, sessions: int, directory: Path) -> RunSample:
    """The bare loop in its own process (own process group), stopped in `finally`."""
    spec_path, result_path = directory / "bare-spec.json", directory / "bare-result.json"
    spec = {
        "path": str(settings.path),
        "sessions": sessions,
        "requests": settings.requests,
        "tokens": settings.tokens,
        "context_per_session": settings.context_per_session,
        "threads": settings.threads,
        "banned": list(settings.banned),
        "result": str(result_path),
    }
    spec_path.write_bytes(orjson.dumps(spec))
    log_path = directory / "bare.log"
    command = [sys.executable, "-m", "benchmarks.concurrent", "--bare-child", str(spec_path)]
    child = _popen(BARE, command, log_path)
    try:
        try:
            code = child.process.wait(START_TIMEOUT_S + REQUEST_TIMEOUT_S * settings.requests)
        except subprocess.TimeoutExpired:
            raise BenchmarkError("the bare loop timed out") from None
        if code != 0 or not result_path.exists():
            raise BenchmarkError(f"the bare loop failed (exit {code}): {_log_tail(log_path)}")
    finally:
        child.stop()
    data = orjson.loads(result_path.read_bytes())
    requests = [
        RequestSample(float(r["latency_s"]), float(r["ttft_s"]), int(r["tokens"]))
        for r in data["requests"]
    ]
    return RunSample(float(data["wall_s"]), int(data["tokens"]), requests)


# ------------------------------------------------------------------ statistics and report


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _banned_tokens(path: Path) -> tuple[int, ...]:
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


def _order(group: int) -> tuple[str, ...]:
    """The order of the three runs of measurement group `group` (one S in one round): skippy
    and llama_cpp.server swap places from one group to the next (as when they ran in pairs);
    the bare loop runs last, first, middle in turn, two groups each, so over six groups every
    two contenders run in either order three times."""
    order: list[str] = list(SERVERS)
    order.insert((2, 0, 1)[(group // 2) % 3], BARE)
    return tuple(order) if group % 2 == 0 else tuple(reversed(order))


def _paired(ours: list[float], theirs: list[float]) -> tuple[float, float, float, float]:
    """Ratio of the medians, then median, min and max of the per-round ratios."""
    paired = [a / b for a, b in zip(ours, theirs, strict=True)]
    ratio = statistics.median(ours) / statistics.median(theirs)
    return ratio, statistics.median(paired), min(paired), max(paired)


def run(settings: Settings, rounds: int) -> tuple[list[Row], list[Ratio]]:
    # samples[contender][sessions] holds one RunSample per round.
    samples: dict[str, dict[int, list[RunSample]]] = {
        name: {sessions: [] for sessions in settings.sessions} for name in CONTENDERS
    }
    group = 0
    for index in range(rounds):
        sys.stderr.write(f"round {index + 1}/{rounds}\n")
        for sessions in settings.sessions:
            order = _order(group)
            group += 1
            for name in order:
                samples[name][sessions].append(_measure(name, settings, sessions))
    rows: list[Row] = []
    for name in CONTENDERS:
        for sessions in settings.sessions:
            runs = samples[name][sessions]
            rates = [sample.tokens_per_s for sample in runs]
            latencies = [r.latency_s * 1000 for sample in runs for r in sample.requests]
            ttfts = [r.ttft_s * 1000 for sample in runs for r in sample.requests]
            rows.append(
                Row(
                    server=name,
                    sessions=sessions,
                    rounds=rounds,
                    requests=len(latencies),
                    tokens_per_request=settings.tokens,
                    tokens_per_s=round(statistics.median(rates), 1),
                    tokens_per_s_min=round(min(rates), 1),
                    tokens_per_s_max=round(max(rates), 1),
                    latency_p50_ms=round(_percentile(latencies, 50), 1),
                    latency_p95_ms=round(_percentile(latencies, 95), 1),
                    ttft_p50_ms=round(_percentile(ttfts, 50), 1),
                    ttft_p95_ms=round(_percentile(ttfts, 95), 1),
                )
            )
    ratios: list[Ratio] = []
    for sessions in settings.sessions:
        tps = {
            name: [sample.tokens_per_s for sample in samples[name][sessions]] for name in CONTENDERS
        }
        ratio, paired, paired_min, paired_max = _paired(tps["skippy"], tps["llama_cpp.server"])
        ceiling, ceiling_paired, ceiling_min, ceiling_max = _paired(
            tps[BARE], tps["llama_cpp.server"]
        )
        vs_bare, vs_bare_paired, vs_bare_min, vs_bare_max = _paired(tps["skippy"], tps[BARE])
        target = TARGET_RATIO if sessions == TARGET_SESSIONS else None
        ratios.append(
            Ratio(
                sessions=sessions,
                ratio=round(ratio, 3),
                paired_ratio_median=round(paired, 3),
                paired_ratio_min=round(paired_min, 3),
                paired_ratio_max=round(paired_max, 3),
                target=target,
                # Both statistics must reach it: the ratio of medians can pair a fast round of
                # one server with a slow round of the other; the pairs share the machine's load.
                meets_target=None if target is None else min(ratio, paired) >= target,
                ceiling=round(ceiling, 3),
                ceiling_paired_median=round(ceiling_paired, 3),
                ceiling_paired_min=round(ceiling_min, 3),
                ceiling_paired_max=round(ceiling_max, 3),
                ceiling_reaches_target=None
                if target is None
                else min(ceiling, ceiling_paired) >= target,
                skippy_vs_bare=round(vs_bare, 3),
                skippy_vs_bare_paired_median=round(vs_bare_paired, 3),
                skippy_vs_bare_paired_min=round(vs_bare_min, 3),
                skippy_vs_bare_paired_max=round(vs_bare_max, 3),
            )
        )
    return rows, ratios


def _report(settings: Settings, model: str, rows: list[Row], ratios: list[Ratio]) -> None:
    write = sys.stderr.write
    write(
        f"model {model}: {settings.tokens} tokens per request, {settings.requests} requests per "
        f"session, {settings.threads} threads, {settings.context_per_session}-token context per "
        f"session, skippy lanes {settings.lanes}\n"
    )
    write(
        f"{'server':>16} {'S':>2} {'req':>4} {'tokens/s (min..max)':>26} {'lat p50 ms':>10} "
        f"{'lat p95 ms':>10} {'TTFT p50':>9} {'TTFT p95':>9}\n"
    )
    for row in rows:
        rate = f"{row.tokens_per_s:.1f} ({row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f})"
        write(
            f"{row.server:>16} {row.sessions:>2} {row.requests:>4} {rate:>26} "
            f"{row.latency_p50_ms:>10.1f} {row.latency_p95_ms:>10.1f} "
            f"{row.ttft_p50_ms:>9.1f} {row.ttft_p95_ms:>9.1f}\n"
        )
    write(f"{'S':>2} {'skippy/llama_cpp.server':>24} {'paired (min..max)':>24}  target\n")
    for ratio in ratios:
        low, high = ratio.paired_ratio_min, ratio.paired_ratio_max
        paired = f"{ratio.paired_ratio_median:.3f} ({low:.3f}..{high:.3f})"
        verdict = "-"
        if ratio.target is not None:
            verdict = f"≥ {ratio.target}: {'yes' if ratio.meets_target else 'NO'}"
        write(f"{ratio.sessions:>2} {ratio.ratio:>24.3f} {paired:>24}  {verdict}\n")
    write(
        f"{'S':>2} {'ceiling bare/llama_cpp.server':>29} {'paired (min..max)':>24} "
        f"{'skippy/bare':>11} {'paired (min..max)':>24}\n"
    )
    for ratio in ratios:
        low, high = ratio.ceiling_paired_min, ratio.ceiling_paired_max
        ceiling = f"{ratio.ceiling_paired_median:.3f} ({low:.3f}..{high:.3f})"
        low, high = ratio.skippy_vs_bare_paired_min, ratio.skippy_vs_bare_paired_max
        vs_bare = f"{ratio.skippy_vs_bare_paired_median:.3f} ({low:.3f}..{high:.3f})"
        write(
            f"{ratio.sessions:>2} {ratio.ceiling:>29.3f} {ceiling:>24} "
            f"{ratio.skippy_vs_bare:>11.3f} {vs_bare:>24}\n"
        )
    for ratio in ratios:
        if ratio.target is not None:
            write(_verdict(ratio) + "\n")


def _verdict(ratio: Ratio) -> str:
    """The summary line for the target: skippy's ratio and whether the ceiling allows it."""
    target = ratio.target
    met = "met" if ratio.meets_target else "NOT met"
    line = (
        f"{ratio.sessions} sessions: skippy {ratio.ratio:.2f}× llama_cpp.server (paired "
        f"{ratio.paired_ratio_median:.2f}×), target {target}×: {met}; ceiling "
        f"{ratio.ceiling:.2f}× (paired {ratio.ceiling_paired_median:.2f}×): "
    )
    low = min(ratio.ceiling, ratio.ceiling_paired_median)
    high = max(ratio.ceiling, ratio.ceiling_paired_median)
    if target is not None and low >= target:
        line += "reachable, batched decode on this machine allows the target"
    elif target is not None and high < target:
        line += "the target is above what batched decode on this machine allows"
    else:
        line += "borderline (the ratio of medians and the paired median disagree)"
    return line + f"; skippy reaches {ratio.skippy_vs_bare:.0%} of the bare batched loop"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", default="1,2,4,8", help="comma-separated session counts")
    parser.add_argument(
        "--tokens", type=int, help="tokens per request (default: 256 tiny, 128 mid)"
    )
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per session")
    parser.add_argument("--model", choices=("mid", "tiny"), default="mid")
    parser.add_argument("--bare-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_child is not None:
        return _bare_child(args.bare_child)
    sessions = tuple(sorted({int(s) for s in args.sessions.split(",") if s.strip()}))
    if not sessions or min(sessions) < 1 or args.rounds < 1 or args.requests < 1:
        parser.error("need rounds, requests and session counts of at least 1")
    path = model_path(args.model)
    tokens = args.tokens or DEFAULT_TOKENS[args.model]
    per_session = max(MIN_CONTEXT_PER_SESSION_TOKENS, tokens + PROMPT_ALLOWANCE_TOKENS)
    per_session = -(-per_session // 256) * 256  # llama.cpp pads each sequence's cells to 256
    settings = Settings(
        path=path,
        sessions=sessions,
        requests=args.requests,
        tokens=tokens,
        context_per_session=per_session,
        threads=max(1, os.cpu_count() or 1),
        banned=_banned_tokens(path),
    )
    try:
        rows, ratios = run(settings, args.rounds)
    except KeyboardInterrupt:  # every server was stopped on the way out
        sys.stderr.write("interrupted\n")
        return 130
    _report(settings, args.model, rows, ratios)
    summary = {
        "benchmark": "concurrent",
        "model": args.model,
        "tokens_per_request": tokens,
        "requests_per_session": args.requests,
        "threads": settings.threads,
        "context_per_session": per_session,
        "lanes": settings.lanes,
        "rows": [asdict(r) for r in rows],
        "ratios": [asdict(r) for r in ratios],
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
