"""Split loads over ggml RPC stages: skippy against llama.cpp's own `llama-server --rpc`.

    .venv/bin/python -m benchmarks.stages [--rounds 3] [--stages 1,2,3] [--tokens 64]
        [--requests 2] [--model mid|tiny] [--context-per-session 512] [--threads T]
        [--stage-threads T] [--contenders skippy,llama-server] [--wire [D,J,S,P]]

Contenders, for every N in --stages (N = 1: one process, no stage):

- `skippy`: `skippyctl runtime serve` (benchmarks/servers.py), then for N ≥ 2 `skippyctl load
  MODEL --stage HOST:PORT …` against N `skippyctl stage serve` workers this script starts on
  loopback (the host probes and plans them: layers in proportion to offered memory);
- `llama-server`: llama.cpp's server built from the llama.cpp llama-cpp-python vendors
  (`python -m benchmarks.llama_server_build`), for N ≥ 2 with `--rpc HOST:PORT,HOST:PORT -ngl
  999` on the same kind of stage workers (`stage serve` is llama.cpp's RPC server, so both
  clients speak to the very same server code).

Both get the same model, context, threads (--threads for the process that holds the model,
--stage-threads for each stage worker, default cpus // (N + 1) as skippy's local stages), one
session, greedy, end-of-generation banned (benchmarks/loadgen.py: identical bodies, exactly
--tokens tokens a request). A stage worker serves one client at a time, so every run (one
contender, one N, one round) gets fresh stage workers and is the only client they ever have;
everything a run started is stopped before the next starts. Each run: start, one unmeasured
warm-up request, --requests measured streaming requests, stop.

With ``--wire`` every stage sits behind a `skippyctl stage relay` (its own process) with that
wire model — constant delay, exponential jitter, probabilistic stalls, order kept — and both
contenders dial the relays.

Measured per request: TTFT (send → first chunk with text, prefill included) and decode tokens/s
((tokens − 1) / (last chunk − first chunk)). Reported per contender and N: medians over every
request of every round with the spread (min..max), and the ratios skippy / llama-server of the
median decode rate and median TTFT at each N. Rounds alternate the order: even rounds run the
(contender, N) list forwards, odd rounds backwards, so drift on a shared machine hits all alike.
Defaults (mid model, 3 rounds × 6 runs × 2 requests of 64 tokens) take a few minutes.

Prints a table on stderr and one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any, Final

import orjson

from benchmarks.loadgen import RequestSample, Workload, banned_tokens, run_sessions, warm_up
from benchmarks.models import REPO, model_path
from benchmarks.servers import (
    LLAMA_SERVER,
    SKIPPY,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerSpec,
    start_llama_server,
    start_skippy,
)

CONTENDERS: Final = (SKIPPY, LLAMA_SERVER)
DEFAULT_TOKENS: Final = 64
DEFAULT_REQUESTS: Final = 2
DEFAULT_CONTEXT_PER_SESSION: Final = 512
ALL_LAYERS: Final = "999"


@dataclass(frozen=True, slots=True)
class Wire:
    """The wire model of `skippyctl stage relay` put in front of every stage (issue 13's
    default: 3 ms + exp(5 ms) jitter + 2 % × 40 ms stalls)."""

    delay_ms: float = 3.0
    jitter_ms: float = 5.0
    stall_ms: float = 40.0
    stall_p: float = 0.02

    def args(self) -> list[str]:
        return [
            "--delay-ms", str(self.delay_ms), "--jitter-ms", str(self.jitter_ms),
            "--stall-ms", str(self.stall_ms), "--stall-p", str(self.stall_p), "--seed", "7",
        ]  # fmt: skip


class _Child:
    """A `skippyctl stage …` process this script started (its own process group) and the
    port its first matching JSON record names."""

    def __init__(self, command: list[str], log: IO[bytes], ready: Callable[[Any], int | None]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "stage", *command, "--json"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        self.port = 0
        self._ready_when = ready
        self._ready = threading.Event()
        self._failed = ""
        self._reader = threading.Thread(target=self._read, name="bench-stage", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                port = self._ready_when(record)
                if port is not None and not self._ready.is_set():
                    self.port = port
                    self._ready.set()
                elif record.get("event") == "stage_failed" or record.get("record") == "error":
                    self._failed = str(record.get("reason_code"))
                    self._ready.set()
        self._ready.set()

    def wait_ready(self) -> int:
        if not self._ready.wait(START_TIMEOUT_S) or not self.port:
            raise RuntimeError(f"a stage process did not get ready ({self._failed or 'no answer'})")
        return self.port

    def stop(self) -> None:
        """SIGTERM to its group (it stops and reaps what it started), SIGKILL if it stays."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._reader.join(STOP_TIMEOUT_S)


def _stage_ready(record: Any) -> int | None:
    if record.get("event") == "stage_ready":
        return int(record["summaries"]["port"])
    return None


def _relay_listening(record: Any) -> int | None:
    if record.get("record") == "relay" and record.get("state") == "listening":
        return int(record["port"])
    return None


class StageWorker:
    """One `skippyctl stage serve --port 0` (and, with a wire model, a `stage relay` in front of
    it): ready once the stage (and the relay) said so; ``endpoint`` is what clients dial."""

    def __init__(self, threads: int, log: IO[bytes], wire: Wire | None = None) -> None:
        self._stage = _Child(["serve", "--port", "0", "--threads", str(threads)], log, _stage_ready)
        self._relay: _Child | None = None
        self._wire = wire
        self._log = log
        self.endpoint = ""

    def wait_ready(self) -> str:
        port = self._stage.wait_ready()
        if self._wire is not None:
            command = ["relay", "--listen", "127.0.0.1:0", "--to", f"127.0.0.1:{port}"]
            self._relay = _Child(command + self._wire.args(), self._log, _relay_listening)
            port = self._relay.wait_ready()
        self.endpoint = f"127.0.0.1:{port}"
        return self.endpoint

    def stop(self) -> None:
        if self._relay is not None:
            self._relay.stop()
        self._stage.stop()


@dataclass(frozen=True, slots=True)
class Plan:
    contenders: tuple[str, ...]
    stages: tuple[int, ...]
    rounds: int
    work: Workload
    path: Path
    context_per_session: int
    threads: int
    stage_threads: int | None
    wire: Wire | None = None


@dataclass(frozen=True, slots=True)
class Row:
    contender: str
    stages: int
    requests: int
    decode_tokens_per_s: float
    decode_tokens_per_s_min: float
    decode_tokens_per_s_max: float
    ttft_ms: float
    ttft_min_ms: float
    ttft_max_ms: float


@dataclass(frozen=True, slots=True)
class Ratio:
    stages: int
    decode_skippy_over_llama_server: float
    ttft_skippy_over_llama_server: float


def _decode_rate(sample: RequestSample) -> float:
    span = sample.latency_s - sample.ttft_s
    return (sample.tokens - 1) / span if span > 0 else 0.0


def stage_threads(plan: Plan, stages: int) -> int:
    if plan.stage_threads is not None:
        return plan.stage_threads
    return max(1, (os.cpu_count() or 1) // (stages + 1))


def run_one(plan: Plan, contender: str, stages: int, directory: Path) -> list[RequestSample]:
    """Fresh stage workers (N ≥ 2), the contender on them, warm-up, measured requests, stop."""
    workers: list[StageWorker] = []
    log = open(directory / "stages.log", "wb")  # noqa: SIM115 - closed below
    try:
        if stages > 1:
            workers = [
                StageWorker(stage_threads(plan, stages), log, plan.wire) for _ in range(stages)
            ]
        endpoints = [w.wait_ready() for w in workers]
        spec = ServerSpec(plan.path, 1, plan.context_per_session, plan.threads)
        if contender == SKIPPY:
            stage_args = tuple(a for e in endpoints for a in ("--stage", e))
            server = start_skippy(replace(spec, skippy_load_args=stage_args), directory)
        else:
            rpc = ("--rpc", ",".join(endpoints), "-ngl", ALL_LAYERS) if endpoints else ()
            server = start_llama_server(replace(spec, llama_server_args=rpc), directory)
        try:
            warm_up(server, plan.work)
            return list(asyncio.run(run_sessions(server, plan.work, 1)).requests)
        finally:
            server.stop()
    finally:
        for worker in workers:
            worker.stop()
        log.close()


def run(plan: Plan) -> dict[tuple[str, int], list[RequestSample]]:
    runs = [(c, n) for n in plan.stages for c in plan.contenders]
    samples: dict[tuple[str, int], list[RequestSample]] = {key: [] for key in runs}
    for round_index in range(plan.rounds):
        order = runs if round_index % 2 == 0 else runs[::-1]
        for contender, stages in order:
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="skippy-bench-stages-") as tmp:
                got = run_one(plan, contender, stages, Path(tmp))
            samples[(contender, stages)] += got
            rates = ", ".join(f"{_decode_rate(s):.1f}" for s in got)
            sys.stderr.write(
                f"round {round_index + 1}/{plan.rounds} {contender} "
                f"{'× 1 process' if stages == 1 else f'× {stages} stages'}: "
                f"decode tok/s {rates} ({time.monotonic() - started:.1f} s)\n"
            )
    return samples


def _row(contender: str, stages: int, samples: list[RequestSample]) -> Row:
    rates = [_decode_rate(s) for s in samples]
    ttfts = [1000.0 * s.ttft_s for s in samples]
    return Row(
        contender,
        stages,
        len(samples),
        statistics.median(rates),
        min(rates),
        max(rates),
        statistics.median(ttfts),
        min(ttfts),
        max(ttfts),
    )


def summarize(samples: dict[tuple[str, int], list[RequestSample]]) -> tuple[list[Row], list[Ratio]]:
    rows = [_row(c, n, got) for (c, n), got in samples.items() if got]
    by_key = {(r.contender, r.stages): r for r in rows}
    ratios = []
    for stages in sorted({r.stages for r in rows}):
        ours, theirs = by_key.get((SKIPPY, stages)), by_key.get((LLAMA_SERVER, stages))
        if ours is not None and theirs is not None:
            ratios.append(
                Ratio(
                    stages,
                    ours.decode_tokens_per_s / theirs.decode_tokens_per_s,
                    ours.ttft_ms / theirs.ttft_ms,
                )
            )
    return rows, ratios


def _report(plan: Plan, rows: list[Row], ratios: list[Ratio]) -> None:
    out = sys.stderr
    out.write(
        f"\n{plan.path.name}: 1 session, {plan.work.requests} request(s) × {plan.work.tokens} "
        f"tokens per run, {plan.rounds} round(s), {plan.threads} thread(s) in the model's "
        "process"
        + (
            ""
            if plan.wire is None
            else f"; wire model {plan.wire.delay_ms:g} ms + exp({plan.wire.jitter_ms:g} ms) + "
            f"{plan.wire.stall_p:.0%} × {plan.wire.stall_ms:g} ms stalls"
        )
        + "\n"
    )
    out.write(
        f"{'contender':<14}{'stages':>11}{'reqs':>6}  {'decode tok/s (min..max)':<26}"
        f"{'TTFT ms (min..max)':<24}\n"
    )
    for r in sorted(rows, key=lambda r: (r.stages, r.contender)):
        label = "1 (process)" if r.stages == 1 else str(r.stages)
        decode = (
            f"{r.decode_tokens_per_s:7.1f} ({r.decode_tokens_per_s_min:.1f}.."
            f"{r.decode_tokens_per_s_max:.1f})"
        )
        ttft = f"{r.ttft_ms:7.1f} ({r.ttft_min_ms:.1f}..{r.ttft_max_ms:.1f})"
        out.write(f"{r.contender:<14}{label:>11}{r.requests:>6}  {decode:<26}{ttft:<24}\n")
    for ratio in ratios:
        out.write(
            f"skippy / llama-server at {ratio.stages} stage(s): decode "
            f"{ratio.decode_skippy_over_llama_server:.2f}×, TTFT "
            f"{ratio.ttft_skippy_over_llama_server:.2f}×\n"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", default="1,2,3", help="comma-separated stage counts (1: none)")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="tokens per request")
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="per run")
    parser.add_argument("--model", choices=("mid", "tiny"), default="mid")
    parser.add_argument(
        "--context-per-session", type=int, default=DEFAULT_CONTEXT_PER_SESSION, metavar="N"
    )
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    parser.add_argument(
        "--stage-threads", type=int, help="threads of each stage worker (default cpus // (N+1))"
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument(
        "--wire",
        nargs="?",
        const="3,5,40,0.02",
        metavar="DELAY,JITTER,STALL_MS,STALL_P",
        help="a `stage relay` in front of every stage (default with the flag: 3 ms + exp(5 ms) "
        "jitter + 2%% × 40 ms stalls)",
    )
    args = parser.parse_args(argv)
    wire = None
    if args.wire is not None:
        try:
            delay, jitter, stall, stall_p = (float(x) for x in args.wire.split(","))
        except ValueError:
            parser.error("--wire takes DELAY,JITTER,STALL_MS,STALL_P")
        wire = Wire(delay, jitter, stall, stall_p)
    stages = tuple(sorted({int(s) for s in args.stages.split(",") if s.strip()}))
    contenders = tuple(dict.fromkeys(c.strip() for c in args.contenders.split(",") if c.strip()))
    if not stages or min(stages) < 1 or args.rounds < 1 or args.requests < 1:
        parser.error("need rounds, requests and stage counts of at least 1")
    if set(contenders) - set(CONTENDERS) or not contenders:
        parser.error(f"--contenders: choose from {', '.join(CONTENDERS)}")
    if args.tokens + 64 > args.context_per_session:
        parser.error("--context-per-session must hold the prompt and --tokens")
    path = model_path(args.model)
    plan = Plan(
        contenders=contenders,
        stages=stages,
        rounds=args.rounds,
        work=Workload(args.requests, args.tokens, banned_tokens(path)),
        path=path,
        context_per_session=args.context_per_session,
        threads=args.threads,
        stage_threads=args.stage_threads,
        wire=wire,
    )
    try:
        samples = run(plan)
    except KeyboardInterrupt:  # every process a run started was stopped on the way out
        sys.stderr.write("interrupted\n")
        return 130
    rows, ratios = summarize(samples)
    _report(plan, rows, ratios)
    summary: dict[str, Any] = {
        "benchmark": "stages",
        "model": args.model,
        "sessions": 1,
        "tokens_per_request": plan.work.tokens,
        "requests_per_run": plan.work.requests,
        "rounds": plan.rounds,
        "threads": plan.threads,
        "stage_threads": {str(n): stage_threads(plan, n) for n in stages if n > 1},
        "context_per_session": plan.context_per_session,
        "wire": None if wire is None else asdict(wire),
        "rows": [asdict(r) for r in rows],
        "ratios": [asdict(r) for r in ratios],
    }
    sys.stdout.buffer.write(orjson.dumps(summary) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
