"""Benchmark 4 of issue 6: decode speed and time to first token with serving events on and off.

    .venv/bin/python -m benchmarks.decode_events [--rounds 5] [--model mid|tiny] [--tokens N]
        [--sessions 4] [--ttft-samples 5] [--decode-samples 2]

Drives real `skippyctl runtime serve --port 0` processes (private SKIPPY_RUNTIME_DIR each, the
model loaded with `skippyctl load PATH --lanes SESSIONS`) over HTTP with streaming
`/v1/completions`: same prompt and seed, greedy, every end-of-generation token banned through
logit_bias, so each request makes exactly `--tokens` tokens (checked once per runtime with a
non-streaming request's usage). One runtime per variant, all alive for the whole run:

- off: `SKIPPY_SERVING_EVENTS=off` + `SKIPPY_NATIVE_DISABLE=1`, the baseline: the engine sends
  only text and terminals, the host submits no serving event, there is no native event layer.
- on: the default runtime, with a live SSE subscriber on `/api/runtime/events/v1`.
- debug: on + `--debug-token-events` (one debug-class event per sampled token), subscribed.
- slow exporter: on + `--telemetry-endpoint` at a stub collector (this script, 127.0.0.1) that
  accepts each POST and never answers (it closes after 10 s), subscribed.
- failing exporter: the same with a stub that answers 503 at once.

The exporter runs with its default pacing (1 s batches, 2 s deadline, backoff up to 30 s), as an
operator's would; `--exporter-retry-fast` shortens its interval and backoff (100 ms, at most
200 ms) so it keeps retrying through the measured window: a worst case. The SSE
subscriber and the stub collectors are separate processes, so parsing the event stream does not
share the timing client's interpreter.

Measured at the client: TTFT is from sending the request to the first streamed text; decode
tokens/s is (tokens - 1) / (finish chunk - first text). Every round runs `--decode-samples`
full requests and `--ttft-samples` short (2-token) requests per variant, interleaved request by
request (a round's tokens/s is the median of its full requests, its TTFT the median of all its
requests), then `--sessions` simultaneous streams (distinct session ids, fresh each round) on
the off and on runtimes (aggregate tokens/s: all tokens over the wall time from the first send
to the last finish; TTFT: the p50 over the streams). The variant order rotates with every
request, after one unmeasured warm-up per runtime. The CPU time the runtime host and its engine
used during the full requests (/proc schedstat) is reported beside them: it shows where an
overhead comes from. Reports medians over rounds with the spread (min..max),
ratios of medians against off with the median and spread of the per-round paired ratios, and
each ratio against its target (issue 6: decode tokens/s ≥ 0.99, TTFT ≤ 1.02 of events off,
including with a failing or stalled exporter; per-token debug is opt-in evidence, reported
without a target). Table on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import httpx
import orjson

from benchmarks.decode import PROMPT, SEED
from benchmarks.models import REPO, model_path

DEFAULT_TOKENS: Final = {"tiny": 512, "mid": 128}
TARGET_TOKENS_PER_S: Final = 0.99
"""events on / events off, decode tokens/s: at least this."""
TARGET_TTFT: Final = 1.02
"""events on / events off, time to first token: at most this."""
TTFT_TOKENS: Final = 2
MODEL_ALIAS: Final = "bench"
SLOW_COLLECTOR_HOLD_S: Final = 10.0
START_TIMEOUT_S: Final = 60.0
REQUEST_TIMEOUT_S: Final = 600.0
BAN_BIAS: Final = -1e9
"""JSON has no -inf; this is far below any logit of these models."""
EXPORTER_RETRY_FAST: Final = {
    "SKIPPY_TELEMETRY_EXPORT_INTERVAL_MILLIS": "100",
    "SKIPPY_TELEMETRY_MAX_BACKOFF_MILLIS": "200",
}
exporter_knobs: dict[str, str] = {}
"""Set from --exporter-retry-fast; empty = the exporter's defaults."""
_INHERITED_KNOBS: Final = re.compile(
    r"SKIPPY_(SERVING_EVENTS|NATIVE_DISABLE|DEBUG_TOKEN_EVENTS|TELEMETRY_.*|TEST_.*|RUNTIME_DIR|"
    r"API_KEY|CAPTURE_NATIVE_LOG|ENGINE_STDERR)"
)


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    collector: str | None = None
    subscribed: bool = True
    target: bool = True
    """Whether the issue's on/off targets apply (not to the opt-in debug class)."""


VARIANTS: Final = (
    Variant(
        "off",
        "events off",
        env=(("SKIPPY_SERVING_EVENTS", "off"), ("SKIPPY_NATIVE_DISABLE", "1")),
        subscribed=False,
        target=False,
    ),
    Variant("on", "events on"),
    Variant("debug", "on + per-token debug", args=("--debug-token-events",), target=False),
    Variant("slow", "on + stalled exporter", collector="slow"),
    Variant("failing", "on + failing exporter (503)", collector="failing"),
)
MULTI_VARIANTS: Final = ("off", "on")


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    tokens_per_s: float
    host_cpu_ms: float = 0.0
    """CPU time the runtime host process used during the decode request(s)."""
    engine_cpu_ms: float = 0.0
    """CPU time its engine worker used (mostly llama.cpp compute)."""


@dataclass(frozen=True)
class Row:
    variant: str
    label: str
    sessions: int
    rounds: int
    tokens: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    ttft_ms: float
    ttft_min_ms: float
    ttft_max_ms: float
    tokens_per_s_vs_off: float | None
    tokens_per_s_paired_median: float | None
    tokens_per_s_paired_min: float | None
    tokens_per_s_paired_max: float | None
    ttft_vs_off: float | None
    ttft_paired_median: float | None
    ttft_paired_min: float | None
    ttft_paired_max: float | None
    host_cpu_ms: float
    engine_cpu_ms: float
    target_applies: bool
    tokens_per_s_ok: bool | None
    ttft_ok: bool | None


# ------------------------------------------------------------------ helper processes


def _collectors() -> int:
    """Child: the stub telemetry collectors. Prints their ports, serves until stdin closes, then
    prints how many POSTs each got."""
    counts = {"slow": 0, "failing": 0}
    lock = threading.Lock()

    def handler(kind: str) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                with lock:
                    counts[kind] += 1
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if kind == "slow":
                    time.sleep(SLOW_COLLECTOR_HOLD_S)  # never answers in time; then closes
                    self.close_connection = True
                    return
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler

    servers = {
        kind: http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(kind)) for kind in counts
    }
    for kind, server in servers.items():
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name=f"collector-{kind}", daemon=True).start()
    ports = {kind: server.server_address[1] for kind, server in servers.items()}
    sys.stdout.write(orjson.dumps(ports).decode() + "\n")
    sys.stdout.flush()
    sys.stdin.read()
    with lock:
        sys.stdout.write(orjson.dumps({"posts": counts}).decode() + "\n")
    return 0


def _subscriber(url: str) -> int:
    """Child: a live SSE consumer (parses every frame as a client would) until stdin closes;
    then prints what it saw."""
    token = os.environ.get("SKIPPY_BENCH_TOKEN", "")
    seen: dict[str, int] = {"frames": 0, "events": 0, "token_events": 0, "errors": 0}

    def read() -> None:
        try:
            timeout = httpx.Timeout(10.0, read=None)
            with (
                httpx.Client(timeout=timeout) as client,
                client.stream(
                    "GET",
                    f"{url}/api/runtime/events/v1",
                    headers={"Authorization": f"Bearer {token}"},
                ) as response,
            ):
                name = ""
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        data = orjson.loads(line[6:])
                        seen["frames"] += 1
                        if name == "runtime_event":
                            seen["events"] += 1
                            if data["event"]["kind"] == "generation_token_observed":
                                seen["token_events"] += 1
        except (httpx.HTTPError, orjson.JSONDecodeError, KeyError):
            seen["errors"] += 1

    threading.Thread(target=read, name="sse", daemon=True).start()
    sys.stdin.read()
    sys.stdout.write(orjson.dumps(seen).decode() + "\n")
    return 0


class _Child:
    """A helper subprocess of this script, stopped by closing its stdin."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.decode_events", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @property
    def stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def finish(self) -> dict[str, Any]:
        try:  # communicate() closes stdin: the child's cue to report and exit
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        lines = out.strip().splitlines()
        result: dict[str, Any] = orjson.loads(lines[-1]) if lines else {}
        return result


# ------------------------------------------------------------------ runtimes


def _cpu_ms(pid: int) -> float:
    """On-CPU time of every live thread of `pid` (schedstat, ns precision); 0 if it is gone."""
    total = 0
    if pid <= 0:
        return 0.0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{task}/schedstat") as stat,
            ):
                total += int(stat.read().split()[0])
    return total / 1e6


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not _INHERITED_KNOBS.fullmatch(k)}


class Runtime:
    """One `skippyctl runtime serve` for one variant, in a private runtime directory."""

    def __init__(self, variant: Variant, root: Path, collectors: dict[str, int]) -> None:
        self.variant = variant
        self.directory = root / variant.name
        self.directory.mkdir(parents=True)
        self.env = dict(_clean_env(), SKIPPY_RUNTIME_DIR=str(self.directory), **dict(variant.env))
        args = ["--port", "0", *variant.args]
        if variant.collector is not None:
            port = collectors[variant.collector]
            args += ["--telemetry-endpoint", f"http://127.0.0.1:{port}/v1/events"]
            self.env.update(exporter_knobs)
        self._log = open(self.directory / "serve.log", "wb")  # noqa: SIM115 - the server's life
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "runtime", "serve", *args],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        try:
            self.url, self.token = self._discover()
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.client = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=REQUEST_TIMEOUT_S
        )
        self.subscriber: _Child | None = None
        self.engine_pid = 0

    def _discover(self) -> tuple[str, str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = self.directory / "runtime.json"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.variant.name} runtime exited: {self._tail()}")
            if path.exists():
                with contextlib.suppress(orjson.JSONDecodeError):
                    data = orjson.loads(path.read_bytes())
                    return str(data["url"]), str(data["token"])
            time.sleep(0.05)
        raise RuntimeError(f"{self.variant.name} runtime did not start: {self._tail()}")

    def _tail(self) -> str:
        return (self.directory / "serve.log").read_text(errors="replace")[-1500:]

    def load(self, path: Path, lanes: int, context_tokens: int) -> None:
        command = [sys.executable, "-m", "skippyctl", "load", str(path), "--alias", MODEL_ALIAS]
        command += ["--lanes", str(lanes), "--ctx", str(context_tokens), "--timeout", "300"]
        result = subprocess.run(
            command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=360
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{self.variant.name}: load failed ({result.returncode}): {result.stderr[-800:]}"
            )
        engines = self.client.get("/api/runtime/state").json().get("engines", [])
        self.engine_pid = int(engines[0]["pid"]) if engines else 0
        if self.variant.subscribed:
            env = dict(os.environ, SKIPPY_BENCH_TOKEN=self.token)
            self.subscriber = _Child(["--subscriber", self.url], env=env)

    def cpu_ms(self) -> tuple[float, float]:
        """CPU time so far of the host and of its engine (ms, every live thread)."""
        return _cpu_ms(self.process.pid), _cpu_ms(self.engine_pid)

    def health(self) -> dict[str, Any]:
        state = self.client.get("/api/runtime/state").json()
        health: dict[str, Any] = state.get("health", {})
        return health

    def telemetry(self) -> dict[str, float]:
        """The exporter's counters from /metrics (skippy_telemetry_*), summed over labels."""
        out: dict[str, float] = {}
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith("skippy_telemetry_"):
                name, _, value = line.rpartition(" ")
                key = name.split("{")[0]
                with contextlib.suppress(ValueError):
                    out[key] = out.get(key, 0.0) + float(value)
        return out

    def stop(self) -> dict[str, Any]:
        seen = self.subscriber.finish() if self.subscriber is not None else {}
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
        return seen


# ------------------------------------------------------------------ requests


def _body(max_tokens: int, ban: dict[str, float]) -> dict[str, Any]:
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


def _check_tokens(runtime: Runtime, tokens: int, ban: dict[str, float]) -> None:
    answer = runtime.client.post("/v1/completions", json=_body(tokens, ban))
    answer.raise_for_status()
    made = int(answer.json()["usage"]["completion_tokens"])
    if made != tokens:
        raise RuntimeError(f"{runtime.variant.name}: made {made} tokens, not {tokens}")


def _decode(runtime: Runtime, tokens: int, ban: dict[str, float]) -> Sample:
    host, engine = runtime.cpu_ms()
    sent, first, _finish, rate = stream_once(runtime.client, _body(tokens, ban))
    host_after, engine_after = runtime.cpu_ms()
    return Sample((first - sent) * 1000, rate, host_after - host, engine_after - engine)


def _ttft(runtime: Runtime, ban: dict[str, float]) -> float:
    sent, first, _finish, _rate = stream_once(runtime.client, _body(TTFT_TOKENS, ban))
    return (first - sent) * 1000


def _sessions(
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
            results[index] = stream_once(clients[index], _body(tokens, ban), headers)
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
    ttft = statistics.median((r[1] - r[0]) * 1000 for r in done)
    return Sample(ttft, tokens * len(done) / wall, host_after - host, engine_after - engine)


def _eog_ban(path: Path) -> dict[str, float]:
    """Every end-of-generation token of the model's vocabulary (a vocab-only load here)."""
    import llama_cpp

    llama: Any = llama_cpp
    llama.llama_backend_init()
    params = llama.llama_model_default_params()
    params.vocab_only = True
    # llama.cpp logs the whole vocabulary load on stderr: keep the table readable.
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            model = llama.llama_model_load_from_file(str(path).encode(), params)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    if not model:
        raise SystemExit(f"cannot read the vocabulary of {path}")
    try:
        vocab = llama.llama_model_get_vocab(model)
        n_vocab = int(llama.llama_vocab_n_tokens(vocab))
        return {str(t): BAN_BIAS for t in range(n_vocab) if llama.llama_vocab_is_eog(vocab, t)}
    finally:
        llama.llama_model_free(model)


# ------------------------------------------------------------------ the run


def _rotated(items: tuple[str, ...], shift: int) -> tuple[str, ...]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def _telemetry_available() -> bool:
    result = subprocess.run(
        [sys.executable, "-m", "skippyctl", "runtime", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(_clean_env(), COLUMNS="200"),
        timeout=60,
    )
    return "--telemetry-endpoint" in result.stdout


@dataclass
class Measurements:
    single: dict[str, list[Sample]]
    multi: dict[str, list[Sample]]
    seen: dict[str, dict[str, Any]]
    health: dict[str, dict[str, Any]]
    telemetry: dict[str, dict[str, float]]
    collector_posts: dict[str, int]
    pending: list[str]


def run(
    model: str,
    rounds: int,
    tokens: int,
    sessions: int,
    ttft_samples: int,
    decode_samples: int,
    progress: IO[str],
) -> Measurements:
    path = model_path(model)
    ban = _eog_ban(path)
    pending: list[str] = []
    variants = list(VARIANTS)
    if not _telemetry_available():
        pending = [v.name for v in variants if v.collector is not None]
        variants = [v for v in variants if v.collector is None]
        progress.write(
            "note: `runtime serve --telemetry-endpoint` is missing: exporter variants pending\n"
        )
    names = tuple(v.name for v in variants)
    lanes = max(1, sessions)
    # Room for the prompt and the completion in every lane.
    context_tokens = lanes * (tokens + 64)
    root = Path(tempfile.mkdtemp(prefix="skippy-decode-events-"))
    collectors = _Child(["--collectors"])
    runtimes: dict[str, Runtime] = {}
    seen: dict[str, dict[str, Any]] = {}
    health: dict[str, dict[str, Any]] = {}
    telemetry: dict[str, dict[str, float]] = {}
    try:
        ports: dict[str, int] = orjson.loads(collectors.stdout.readline())
        for variant in variants:
            began = time.monotonic()
            runtime = Runtime(variant, root, ports)
            runtimes[variant.name] = runtime
            runtime.load(path, lanes, context_tokens)
            _check_tokens(runtime, tokens, ban)  # warm-up, and proof of the token count
            stream_once(runtime.client, _body(tokens, ban))
            progress.write(f"{variant.name}: ready ({time.monotonic() - began:.1f} s)\n")
        multi_clients = {
            name: [
                httpx.Client(
                    base_url=runtimes[name].url,
                    headers=runtimes[name].headers,
                    timeout=REQUEST_TIMEOUT_S,
                )
                for _ in range(sessions)
            ]
            for name in (MULTI_VARIANTS if sessions > 1 else ())
        }
        single: dict[str, list[Sample]] = {name: [] for name in names}
        multi: dict[str, list[Sample]] = {name: [] for name in MULTI_VARIANTS}
        for name in multi_clients:  # warm-up of the session path
            _sessions(runtimes[name], multi_clients[name], tokens, ban, f"warm-{name}")
        for index in range(rounds):
            began = time.monotonic()
            decoded: dict[str, list[Sample]] = {name: [] for name in names}
            for sample in range(decode_samples):
                for name in _rotated(names, index + sample):
                    decoded[name].append(_decode(runtimes[name], tokens, ban))
            ttfts = {name: [s.ttft_ms for s in decoded[name]] for name in names}
            for sample in range(ttft_samples):
                for name in _rotated(names, index + sample):
                    ttfts[name].append(_ttft(runtimes[name], ban))
            for name in names:
                single[name].append(
                    Sample(
                        ttft_ms=statistics.median(ttfts[name]),
                        tokens_per_s=statistics.median(s.tokens_per_s for s in decoded[name]),
                        host_cpu_ms=statistics.fmean(s.host_cpu_ms for s in decoded[name]),
                        engine_cpu_ms=statistics.fmean(s.engine_cpu_ms for s in decoded[name]),
                    )
                )
            if sessions > 1:
                for name in _rotated(MULTI_VARIANTS, index):
                    tag = f"r{index}-{name}"
                    multi[name].append(
                        _sessions(runtimes[name], multi_clients[name], tokens, ban, tag)
                    )
            line = "  ".join(
                f"{n} {single[n][-1].tokens_per_s:.1f} tok/s {single[n][-1].ttft_ms:.1f} ms"
                for n in names
            )
            if index < len(multi.get("on", ())):
                line += f"  ×{sessions}: off {multi['off'][-1].tokens_per_s:.1f} on "
                line += f"{multi['on'][-1].tokens_per_s:.1f} tok/s"
            progress.write(
                f"round {index + 1}/{rounds} ({time.monotonic() - began:.1f} s): {line}\n"
            )
        for clients in multi_clients.values():
            for client in clients:
                client.close()
        for name, runtime in runtimes.items():
            health[name] = runtime.health()
            if runtime.variant.collector is not None:
                telemetry[name] = runtime.telemetry()
    finally:
        for name, runtime in runtimes.items():
            try:
                stopping = time.monotonic()
                seen[name] = runtime.stop()
                if time.monotonic() - stopping > 5:
                    progress.write(f"{name}: slow to stop ({time.monotonic() - stopping:.1f} s)\n")
            except Exception as error:  # noqa: BLE001 - stop the others whatever happens
                progress.write(f"{name}: stop failed: {error!r}\n")
        posts = collectors.finish().get("posts", {})
        shutil.rmtree(root, ignore_errors=True)
    return Measurements(single, multi, seen, health, telemetry, posts, pending)


def _paired(values: list[float], base: list[float]) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(values, base, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def rows_of(samples: dict[str, list[Sample]], sessions: int, rounds: int, tokens: int) -> list[Row]:
    rows: list[Row] = []
    labels = {v.name: v for v in VARIANTS}
    base = samples.get("off", [])
    for name, values in samples.items():
        if not values:
            continue
        variant = labels[name]
        rates = [s.tokens_per_s for s in values]
        ttfts = [s.ttft_ms for s in values]
        vs_rate = vs_ttft = None
        rate_paired: tuple[float | None, ...] = (None, None, None)
        ttft_paired: tuple[float | None, ...] = (None, None, None)
        rate_ok = ttft_ok = None
        target = variant.target and name != "off"
        if name != "off" and base:
            vs_rate = statistics.median(rates) / statistics.median(s.tokens_per_s for s in base)
            vs_ttft = statistics.median(ttfts) / statistics.median(s.ttft_ms for s in base)
            rate_paired = _paired(rates, [s.tokens_per_s for s in base])
            ttft_paired = _paired(ttfts, [s.ttft_ms for s in base])
            if target:
                rate_ok = vs_rate >= TARGET_TOKENS_PER_S
                ttft_ok = vs_ttft <= TARGET_TTFT

        def r4(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        rows.append(
            Row(
                variant=name,
                label=variant.label,
                sessions=sessions,
                rounds=rounds,
                tokens=tokens,
                tokens_per_s=round(statistics.median(rates), 2),
                tokens_per_s_min=round(min(rates), 2),
                tokens_per_s_max=round(max(rates), 2),
                ttft_ms=round(statistics.median(ttfts), 2),
                ttft_min_ms=round(min(ttfts), 2),
                ttft_max_ms=round(max(ttfts), 2),
                tokens_per_s_vs_off=r4(vs_rate),
                tokens_per_s_paired_median=r4(rate_paired[0]),
                tokens_per_s_paired_min=r4(rate_paired[1]),
                tokens_per_s_paired_max=r4(rate_paired[2]),
                ttft_vs_off=r4(vs_ttft),
                ttft_paired_median=r4(ttft_paired[0]),
                ttft_paired_min=r4(ttft_paired[1]),
                ttft_paired_max=r4(ttft_paired[2]),
                host_cpu_ms=round(statistics.median(s.host_cpu_ms for s in values), 1),
                engine_cpu_ms=round(statistics.median(s.engine_cpu_ms for s in values), 1),
                target_applies=target,
                tokens_per_s_ok=rate_ok,
                ttft_ok=ttft_ok,
            )
        )
    return rows


def _verdict(ok: bool | None, applies: bool) -> str:
    if not applies:
        return "—"
    return "yes" if ok else "NO"


def _table(rows: list[Row], write: Callable[[str], Any]) -> None:
    write(
        f"{'variant':<30} {'sess':>4} {'tokens/s (min..max)':>24} {'TTFT ms (min..max)':>24} "
        f"{'tok/s ÷ off (paired)':>26} {'≥ 0.99':>6} {'TTFT ÷ off (paired)':>26} {'≤ 1.02':>6} "
        f"{'host CPU ms':>11} {'engine CPU ms':>13}\n"
    )
    for row in rows:
        rate = f"{row.tokens_per_s:.1f} ({row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f})"
        ttft = f"{row.ttft_ms:.1f} ({row.ttft_min_ms:.1f}..{row.ttft_max_ms:.1f})"
        if row.tokens_per_s_vs_off is None or row.ttft_vs_off is None:
            vs_rate = vs_ttft = "baseline"
        else:
            vs_rate = (
                f"{row.tokens_per_s_vs_off:.3f} ({row.tokens_per_s_paired_min:.3f}.."
                f"{row.tokens_per_s_paired_max:.3f})"
            )
            vs_ttft = (
                f"{row.ttft_vs_off:.3f} ({row.ttft_paired_min:.3f}..{row.ttft_paired_max:.3f})"
            )
        write(
            f"{row.label:<30} {row.sessions:>4} {rate:>24} {ttft:>24} {vs_rate:>26} "
            f"{_verdict(row.tokens_per_s_ok, row.target_applies):>6} {vs_ttft:>26} "
            f"{_verdict(row.ttft_ok, row.target_applies):>6} {row.host_cpu_ms:>11.1f} "
            f"{row.engine_cpu_ms:>13.1f}\n"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="mid", choices=("mid", "tiny"))
    parser.add_argument("--tokens", type=int, help="tokens per request (default 128 mid, 512 tiny)")
    parser.add_argument("--sessions", type=int, default=4, help="simultaneous sessions (1: none)")
    parser.add_argument("--ttft-samples", type=int, default=5, help="extra TTFT requests/round")
    parser.add_argument("--decode-samples", type=int, default=2, help="decode requests/round")
    parser.add_argument(
        "--exporter-retry-fast",
        action="store_true",
        help="exporter variants retry every 100-200 ms (worst case) instead of default pacing",
    )
    parser.add_argument("--collectors", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subscriber", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.collectors:
        return _collectors()
    if args.subscriber is not None:
        return _subscriber(args.subscriber)
    if args.rounds < 1 or args.sessions < 1 or args.ttft_samples < 0 or args.decode_samples < 1:
        parser.error("--rounds, --sessions, --decode-samples must be ≥ 1, --ttft-samples ≥ 0")
    if args.exporter_retry_fast:
        exporter_knobs.update(EXPORTER_RETRY_FAST)
    tokens = args.tokens or DEFAULT_TOKENS[args.model]
    if tokens < 2:
        parser.error("--tokens must be ≥ 2")
    measured = run(
        args.model,
        args.rounds,
        tokens,
        args.sessions,
        args.ttft_samples,
        args.decode_samples,
        sys.stderr,
    )
    single = rows_of(measured.single, 1, args.rounds, tokens)
    multi = rows_of(measured.multi, args.sessions, args.rounds, tokens) if args.sessions > 1 else []
    write = sys.stderr.write
    write(
        f"\nmodel {args.model}, {tokens} tokens/request, {args.rounds} rounds, TTFT over "
        f"{args.ttft_samples + args.decode_samples} requests/round, decode over "
        f"{args.decode_samples}; ratios: median ÷ median (paired min..max)\n"
    )
    _table(single + multi, write)
    for name in measured.pending:
        write(f"{name}: PENDING (the runtime has no --telemetry-endpoint yet)\n")
    for name, seen in measured.seen.items():
        lanes = measured.health.get(name, {}).get("host_ingress", {})
        dropped = {k: v.get("dropped", 0) for k, v in lanes.items() if v.get("dropped")}
        extra = ""
        if name in measured.telemetry:
            extra = " telemetry " + " ".join(
                f"{k.removeprefix('skippy_telemetry_')}={v:g}"
                for k, v in sorted(measured.telemetry[name].items())
            )
        write(f"{name}: subscriber saw {seen or '-'}; ingress drops {dropped or 0}{extra}\n")
    if measured.collector_posts:
        write(f"stub collectors got POSTs: {measured.collector_posts}\n")
    failed = [
        f"{r.variant}×{r.sessions}"
        for r in single + multi
        if r.target_applies and not (r.tokens_per_s_ok and r.ttft_ok)
    ]
    write(f"targets: {'all met' if not failed else 'NOT met for ' + ', '.join(failed)}\n")
    summary = {
        "benchmark": "decode_events",
        "model": args.model,
        "tokens": tokens,
        "rounds": args.rounds,
        "sessions": args.sessions,
        "ttft_samples": args.ttft_samples + args.decode_samples,
        "decode_samples": args.decode_samples,
        "exporter_retry_fast": args.exporter_retry_fast,
        "targets": {"tokens_per_s_vs_off_min": TARGET_TOKENS_PER_S, "ttft_vs_off_max": TARGET_TTFT},
        "rows": [asdict(r) for r in single + multi],
        "pending": measured.pending,
        "subscribers": measured.seen,
        "host_ingress": {k: v.get("host_ingress") for k, v in measured.health.items()},
        "telemetry": measured.telemetry,
        "collector_posts": measured.collector_posts,
        "targets_met": not failed,
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
