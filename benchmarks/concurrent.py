"""Benchmark 5 of issue 6: concurrent sessions over HTTP against `python -m llama_cpp.server`.

    .venv/bin/python -m benchmarks.concurrent [--rounds N] [--sessions 1,2,4,8] [--tokens N]
        [--requests R] [--model mid|tiny]

One async load generator (httpx) drives either server over HTTP on 127.0.0.1: S concurrent
sessions, each sending R sequential streaming `/v1/completions` requests, for S in --sessions.
It reports per server and S the aggregate tokens/s (all completion tokens / wall time of the
whole S-session run), p50/p95 request latency (send to `[DONE]`) and time to first token (send
to the first chunk with text), and the ratio skippy / llama_cpp.server of the aggregate rates.
Target (issue 6): with 4 sessions, skippy ≥ 2.5 × llama_cpp.server.

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

Every round measures each S as a pair: each server is started in its own process (own process
group), warmed up with one request, runs the S sessions and is stopped; the order within a pair
flips from one pair to the next, so drift on the noisy 2-core machine hits both alike. Every
process is stopped in `finally` (SIGTERM, then SIGKILL to the ids it started, the engine worker
included), on Ctrl-C too. Reports medians over the rounds with the spread (min..max) for
tokens/s, latency/TTFT percentiles over all requests of all rounds, and both the ratio of the
median rates and the median (min..max) of the per-pair ratios; the target counts as met only
when both reach it. Prints a table on stderr and one JSON summary on stdout.
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
from skippyctl.runtime.discovery import pid_alive

SERVERS: Final = ("skippy", "llama_cpp.server")
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
    """A server process this script started, and the ids of the processes it spawned."""

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
    """Start the server, warm it up, run `sessions` sessions, stop it (always)."""
    with tempfile.TemporaryDirectory(prefix="skippy-concurrent-") as temp:
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


def run(settings: Settings, rounds: int) -> tuple[list[Row], list[Ratio]]:
    # samples[server][sessions] holds one RunSample per round.
    samples: dict[str, dict[int, list[RunSample]]] = {
        name: {sessions: [] for sessions in settings.sessions} for name in SERVERS
    }
    pair = 0
    for index in range(rounds):
        sys.stderr.write(f"round {index + 1}/{rounds}\n")
        for sessions in settings.sessions:
            order = SERVERS if pair % 2 == 0 else SERVERS[::-1]
            pair += 1
            for name in order:
                samples[name][sessions].append(_measure(name, settings, sessions))
    rows: list[Row] = []
    for name in SERVERS:
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
        ours = [sample.tokens_per_s for sample in samples["skippy"][sessions]]
        theirs = [sample.tokens_per_s for sample in samples["llama_cpp.server"][sessions]]
        paired = [a / b for a, b in zip(ours, theirs, strict=True)]
        ratio = statistics.median(ours) / statistics.median(theirs)
        target = TARGET_RATIO if sessions == TARGET_SESSIONS else None
        ratios.append(
            Ratio(
                sessions=sessions,
                ratio=round(ratio, 3),
                paired_ratio_median=round(statistics.median(paired), 3),
                paired_ratio_min=round(min(paired), 3),
                paired_ratio_max=round(max(paired), 3),
                target=target,
                # Both statistics must reach it: the ratio of medians can pair a fast round of
                # one server with a slow round of the other; the pairs share the machine's load.
                meets_target=None
                if target is None
                else min(ratio, statistics.median(paired)) >= target,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", default="1,2,4,8", help="comma-separated session counts")
    parser.add_argument(
        "--tokens", type=int, help="tokens per request (default: 256 tiny, 128 mid)"
    )
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per session")
    parser.add_argument("--model", choices=("mid", "tiny"), default="mid")
    args = parser.parse_args(argv)
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
