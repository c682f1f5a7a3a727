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
- stalled OTLP receiver: on + `OTEL_EXPORTER_OTLP_ENDPOINT` at a stub receiver (127.0.0.1)
  that accepts each POST and never answers (it closes after 10 s), subscribed: every event a
  log record, every request a span tree, the metric table every minute, all stuck.
- failing OTLP receiver: the same with a stub that answers 503 at once.

The exporter runs with the OpenTelemetry SDK's pacing as configured by default (log records and
spans batched every 5 s, metrics every 60 s, each export bounded by a 10 s timeout within which
the SDK retries a 503 with backoff), as an operator's would; `--exporter-retry-fast` batches
every 100 ms and gives an export up after 200 ms, so it keeps retrying through the measured
window: a worst case. The SSE subscriber and the stub receivers are separate processes, so
parsing the event stream does not share the timing client's interpreter.

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

This module runs the rounds; the runtimes are `decode_events_runtimes.py`, the requests
`decode_events_requests.py`, the report `decode_events_report.py`, and the stub receivers and
the subscriber `decode_events_children.py`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import httpx
import orjson

from benchmarks.decode_events_children import Child
from benchmarks.decode_events_report import TARGET_TOKENS_PER_S, TARGET_TTFT, rows_of, table
from benchmarks.decode_events_requests import (
    Sample,
    check_tokens,
    eog_ban,
    measure_decode,
    measure_sessions,
    measure_ttft,
    request_body,
    stream_once,
)
from benchmarks.decode_events_runtimes import (
    EXPORTER_RETRY_FAST,
    MULTI_VARIANTS,
    REQUEST_TIMEOUT_S,
    VARIANTS,
    Runtime,
)
from benchmarks.models import model_path

DEFAULT_TOKENS: Final = {"tiny": 512, "mid": 128}


def _rotated(items: tuple[str, ...], shift: int) -> tuple[str, ...]:
    shift %= len(items)
    return items[shift:] + items[:shift]


@dataclass
class Measurements:
    single: dict[str, list[Sample]]
    multi: dict[str, list[Sample]]
    seen: dict[str, dict[str, Any]]
    health: dict[str, dict[str, Any]]
    telemetry: dict[str, dict[str, float]]
    collector_posts: dict[str, int]


def run(
    model: str,
    rounds: int,
    tokens: int,
    sessions: int,
    ttft_samples: int,
    decode_samples: int,
    progress: IO[str],
    exporter_knobs: Mapping[str, str],
) -> Measurements:
    path = model_path(model)
    ban = eog_ban(path)
    variants = list(VARIANTS)
    names = tuple(v.name for v in variants)
    lanes = max(1, sessions)
    # Room for the prompt and the completion in every lane.
    context_tokens = lanes * (tokens + 64)
    root = Path(tempfile.mkdtemp(prefix="skippy-decode-events-"))
    collectors = Child(["--collectors"])
    runtimes: dict[str, Runtime] = {}
    seen: dict[str, dict[str, Any]] = {}
    health: dict[str, dict[str, Any]] = {}
    telemetry: dict[str, dict[str, float]] = {}
    try:
        ports: dict[str, int] = orjson.loads(collectors.stdout.readline())
        for variant in variants:
            began = time.monotonic()
            runtime = Runtime(variant, root, ports, exporter_knobs)
            runtimes[variant.name] = runtime
            runtime.load(path, lanes, context_tokens)
            check_tokens(runtime, tokens, ban)  # warm-up, and proof of the token count
            stream_once(runtime.client, request_body(tokens, ban))
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
            measure_sessions(runtimes[name], multi_clients[name], tokens, ban, f"warm-{name}")
        for index in range(rounds):
            began = time.monotonic()
            decoded: dict[str, list[Sample]] = {name: [] for name in names}
            for sample in range(decode_samples):
                for name in _rotated(names, index + sample):
                    decoded[name].append(measure_decode(runtimes[name], tokens, ban))
            ttfts = {name: [s.ttft_ms for s in decoded[name]] for name in names}
            for sample in range(ttft_samples):
                for name in _rotated(names, index + sample):
                    ttfts[name].append(measure_ttft(runtimes[name], ban))
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
                        measure_sessions(runtimes[name], multi_clients[name], tokens, ban, tag)
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
    return Measurements(single, multi, seen, health, telemetry, posts)


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
        help="exporter variants export every 100 ms, giving up after 200 ms (worst case)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.sessions < 1 or args.ttft_samples < 0 or args.decode_samples < 1:
        parser.error("--rounds, --sessions, --decode-samples must be ≥ 1, --ttft-samples ≥ 0")
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
        EXPORTER_RETRY_FAST if args.exporter_retry_fast else {},
    )
    single = rows_of(measured.single, 1, args.rounds, tokens)
    multi = rows_of(measured.multi, args.sessions, args.rounds, tokens) if args.sessions > 1 else []
    write = sys.stderr.write
    write(
        f"\nmodel {args.model}, {tokens} tokens/request, {args.rounds} rounds, TTFT over "
        f"{args.ttft_samples + args.decode_samples} requests/round, decode over "
        f"{args.decode_samples}; ratios: median ÷ median (paired min..max)\n"
    )
    table(single + multi, write)
    for name, seen in measured.seen.items():
        lanes = measured.health.get(name, {}).get("host_ingress", {})
        dropped = {k: v.get("dropped", 0) for k, v in lanes.items() if v.get("dropped")}
        extra = ""
        if name in measured.telemetry:
            extra = " telemetry " + " ".join(
                f"{k.removeprefix('skippy_otlp_')}={v:g}"
                for k, v in sorted(measured.telemetry[name].items())
            )
        write(f"{name}: subscriber saw {seen or '-'}; ingress drops {dropped or 0}{extra}\n")
    if measured.collector_posts:
        write(f"stub receivers got POSTs: {measured.collector_posts}\n")
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
