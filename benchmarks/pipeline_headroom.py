"""Pipeline headroom: the fastest event rate a real producer reaches, against the pipeline's
capacity on the same event mix, in one run. Target: capacity ≥ 10× the producer.

    .venv/bin/python -m benchmarks.pipeline_headroom [--models tiny,tiny-successor]
        [--lanes 8] [--shapes 2,64,256] [--seconds 8] [--replay-events 200000]

Producer (a): a real `skippyctl runtime serve --debug-token-events` (the most verbose setting:
one debug event per sampled token on top of every request, session and native event) with a
fixture model loaded with `--lanes LANES`; LANES client threads send requests back to back
(`/v1/completions`, non-streaming unless `--stream`, greedy, every end-of-generation token
banned so each makes exactly its tokens) for `--seconds` after one warm-up request, for each
model and request shape (tokens per request: a short shape is request-lifecycle heavy, a long
one token-event heavy). A recorder reads the runtime's live event stream
(`/api/runtime/events/v1`) from before the load. The producer's rate is the events the runtime
dispatched with a wall-clock stamp inside the load window (the host and this process share the
clock), over the window; its native facts/s come from the runtime's `native_facts_processed`.

Capacity (b): the recording's source events (not the ones the pipeline derives itself:
reducer transitions, warnings, its own health reports) replayed into a fresh in-process
`Pipeline` with one subscriber that reads everything: the events before the window once
(setup, not timed), then the window's events over and over (`--replay-events` in all; request
ids repeat only after their request ended), as fast as the pipeline drains
them (the feeder keeps the host ingress short of sampling and coalescing, and checks that it
did neither). The pipeline and its threads are pinned to CPU 0 ("one core"), the feeder and the
subscriber to CPU 1. Native events are replayed through host ingress: the runtime's native
facts become the same events, and the adapter's cost per fact is measured by
benchmarks/pipeline_throughput.py (over 1M facts/s).

Prints a table on stderr (per model and shape: producer events/s and native facts/s, pipeline
events/s, ratio) and the verdict — the fastest producer against the capacity on its own mix,
and the worst ratio of any recording — with PASS/FAIL against 10×; one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.decode import PROMPT, SEED
from benchmarks.decode_events_requests import eog_ban
from benchmarks.decode_events_runtimes import MODEL_ALIAS, Runtime, Variant
from benchmarks.models import REPO
from benchmarks.pipeline_throughput import pin
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.ingress.host import HostIngressConfig
from skippyctl.output.codec.decode import decode_frame_event
from skippyctl.pipeline.dispatch import Subscription, SubscriptionClosed
from skippyctl.pipeline.pipeline import HEALTH_REPORTS, Pipeline
from skippyctl.reducer.reduce import NODE_EVENTS

TARGET_RATIO: Final = 10.0
PIPELINE_CPU: Final = 0
OTHER_CPU: Final = 1
MODELS: Final = {
    "tiny": REPO / "fixtures" / "tiny.gguf",
    "tiny-successor": REPO / "fixtures" / "tiny-successor.gguf",
}
VERBOSE: Final = Variant(
    "verbose", "debug token events", args=("--debug-token-events",), subscribed=False
)
MAX_PENDING: Final = 256
"""The feeder waits while host ingress holds this many: below half of the smallest FIFO lane
(no sampling) and low enough that a progress value is drained before the next replaces it."""
SETTLE_S: Final = 0.5
WAIT_LIMIT_S: Final = 120.0
DERIVED: Final = frozenset(
    {
        *NODE_EVENTS.values(),
        EventId.AVAILABLE_MODEL_SET_CHANGED,
        EventId.NODE_CAPACITY_CHANGED,
        EventId.NODE_RESOURCE_PRESSURE_CHANGED,
        EventId.WARNING_RAISED,
        EventId.WARNING_CLEARED,
        EventId.DEGRADED_OPERATION_ENTERED,
        EventId.DEGRADED_OPERATION_EXITED,
        *HEALTH_REPORTS,
    }
)
"""What the pipeline makes itself from the source events: a replay makes it again."""


@dataclass(frozen=True)
class Recording:
    model: str
    tokens: int
    seconds: float
    requests: int
    events: list[Event]
    window: tuple[int, int]
    """The load window, wall-clock ns (the event stream carries wall-clock stamps)."""
    native_facts: int

    @property
    def window_events(self) -> int:
        start, end = self.window
        return sum(start <= e.wall_ns <= end for e in self.events)

    @property
    def events_per_s(self) -> float:
        return self.window_events / self.seconds

    @property
    def native_facts_per_s(self) -> float:
        return self.native_facts / self.seconds


class Recorder:
    """Reads a runtime's live event stream into memory (raw frames; decoded afterwards)."""

    def __init__(self, runtime: Runtime) -> None:
        self.frames: list[bytes] = []
        self.errors = 0
        self._runtime = runtime
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()
        if not self._connected.wait(10.0):
            raise RuntimeError("the event stream did not open")

    def _run(self) -> None:
        name = b""
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(10.0, read=None)) as client,
                client.stream(
                    "GET",
                    f"{self._runtime.url}/api/runtime/events/v1",
                    headers=self._runtime.headers,
                ) as response,
            ):
                self._connected.set()
                buffer = b""
                for chunk in response.iter_raw():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.startswith(b"event: "):
                            name = line[7:]
                        elif line.startswith(b"data: ") and name == b"runtime_event":
                            self.frames.append(line[6:])
                    if self._stop.is_set():
                        return
        except httpx.HTTPError:
            self.errors += 1
            self._connected.set()

    def stop(self) -> list[Event]:
        self._stop.set()
        self._thread.join(10.0)
        events = []
        for frame in self.frames:
            event, _ = decode_frame_event(orjson.loads(frame))
            if event is None:
                self.errors += 1
            else:
                events.append(event)
        return events


def native_facts(runtime: Runtime) -> int:
    return int(runtime.health().get("native_facts_processed", 0))


def record(
    model: str, lanes: int, tokens: int, seconds: float, root: Path, stream: bool = False
) -> Recording:
    """Drive one runtime at its heaviest for `seconds`; what it dispatched."""
    path = MODELS[model]
    body = {
        "model": MODEL_ALIAS,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "seed": SEED,
        "logit_bias": eog_ban(path),
        "stream": stream,
    }
    runtime = Runtime(VERBOSE, root / f"{model}-{tokens}", {}, {})
    try:
        recorder = Recorder(runtime)
        runtime.load(path, lanes, lanes * (tokens + 64))
        stop = threading.Event()
        done = [0] * lanes

        def client(index: int) -> None:
            with httpx.Client(base_url=runtime.url, headers=runtime.headers, timeout=60) as c:
                while not stop.is_set():
                    with c.stream("POST", "/v1/completions", json=body) as response:
                        response.raise_for_status()
                        for _ in response.iter_raw():
                            pass
                    done[index] += 1

        with httpx.Client(base_url=runtime.url, headers=runtime.headers, timeout=60) as c:
            c.post("/v1/completions", json=body).raise_for_status()  # warm-up, unmeasured
        facts_before = native_facts(runtime)
        threads = [threading.Thread(target=client, args=(n,)) for n in range(lanes)]
        start = time.time_ns()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        end = time.time_ns()
        facts = native_facts(runtime) - facts_before
        stop.set()
        for thread in threads:
            thread.join(60)
        time.sleep(SETTLE_S)  # the last requests' events reach the recorder
        events = recorder.stop()
    finally:
        runtime.stop()
    return Recording(model, tokens, (end - start) / 1e9, sum(done), events, (start, end), facts)


class Reader:
    """A subscriber that reads everything (as the SSE stream does), pinned off the pipeline."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.received = 0
        self._thread = threading.Thread(target=self._run, name="headroom-reader")
        self._thread.start()

    def _run(self) -> None:
        pin(OTHER_CPU)
        while True:
            try:
                self.received += len(self.subscription.get_many(256, 0.2))
            except SubscriptionClosed:
                return

    def join(self) -> None:
        self._thread.join(10)


def wait_until(pipeline: Pipeline, reader: Reader) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while pipeline.ingress.pending() or reader.received < pipeline.dispatcher.stats().dispatched:
        if time.monotonic() > deadline:
            raise RuntimeError("the pipeline did not drain the replay in time")
        time.sleep(0.001)


def feed(pipeline: Pipeline, events: list[Event]) -> None:
    submit, pending = pipeline.submit, pipeline.ingress.pending
    for event in events:
        while pending() >= MAX_PENDING:
            time.sleep(0.0002)
        submit(event)


def replay(recording: Recording, replay_events: int) -> dict[str, Any]:
    """The pipeline's capacity on the recording's mix: dispatched events/s on one core."""
    source = [e for e in recording.events if e.id not in DERIVED]
    start, _ = recording.window
    setup = [e for e in source if e.wall_ns < start]
    window = [e for e in source if e.wall_ns >= start]
    replays = max(1, -(-replay_events // max(1, len(window))))
    pin(PIPELINE_CPU)  # the pipeline thread inherits this thread's CPU set
    pipeline = Pipeline(HostIngressConfig(debug_enabled=True), health_interval_s=0.25).start()
    pin(OTHER_CPU)
    reader = Reader(pipeline.subscribe("reader", max_queue_size=1 << 20))
    try:
        feed(pipeline, setup)
        wait_until(pipeline, reader)
        dispatched_before = pipeline.dispatcher.stats().dispatched
        started = time.perf_counter()
        for _ in range(replays):
            feed(pipeline, window)
        wait_until(pipeline, reader)
        elapsed = time.perf_counter() - started
        dispatched = pipeline.dispatcher.stats().dispatched - dispatched_before
        ingress = pipeline.ingress.stats()
        lost = {
            "sampled": ingress.sampled,
            "coalesced": ingress.total("coalesced"),
            "dropped": ingress.total("dropped"),
        }
    finally:
        pipeline.shutdown(timeout_s=5.0)
        reader.join()
    return {
        "source_events": len(window) * replays,
        "dispatched": dispatched,
        "seconds": elapsed,
        "events_per_s": dispatched / elapsed,
        **lost,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", default="tiny,tiny-successor")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--shapes", default="2,64,256", help="tokens per request, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stream", action="store_true", help="streaming requests")
    parser.add_argument(
        "--replay-events", type=int, default=200_000, help="source events replayed (at least)"
    )
    args = parser.parse_args(argv)
    shapes = [int(tokens) for tokens in args.shapes.split(",")]
    models = args.models.split(",")
    rows: list[dict[str, Any]] = []
    sys.stderr.write(
        f"{'model':<15} {'tokens':>6} {'requests/s':>10} {'producer ev/s':>13} "
        f"{'native facts/s':>14} {'pipeline ev/s':>13} {'ratio':>7}\n"
    )
    with tempfile.TemporaryDirectory(prefix="skippy-headroom-") as root:
        for model in models:
            for tokens in shapes:
                recording = record(model, args.lanes, tokens, args.seconds, Path(root), args.stream)
                capacity = replay(recording, args.replay_events)
                ratio = capacity["events_per_s"] / recording.events_per_s
                row = {
                    "model": model,
                    "tokens": tokens,
                    "lanes": args.lanes,
                    "requests_per_s": round(recording.requests / recording.seconds, 1),
                    "producer_events_per_s": round(recording.events_per_s),
                    "producer_native_facts_per_s": round(recording.native_facts_per_s),
                    "pipeline_events_per_s": round(capacity["events_per_s"]),
                    "ratio": round(ratio, 2),
                    "replay": {k: v for k, v in capacity.items() if k != "events_per_s"},
                }
                rows.append(row)
                sys.stderr.write(
                    f"{model:<15} {tokens:>6} {row['requests_per_s']:>10,.1f} "
                    f"{recording.events_per_s:>13,.0f} {recording.native_facts_per_s:>14,.0f} "
                    f"{capacity['events_per_s']:>13,.0f} {ratio:>6.1f}×\n"
                )
    fastest = max(rows, key=lambda r: r["producer_events_per_s"])
    worst = min(r["ratio"] for r in rows)
    met = fastest["ratio"] >= TARGET_RATIO and worst >= TARGET_RATIO
    sys.stderr.write(
        f"fastest producer {fastest['producer_events_per_s']:,} events/s "
        f"({fastest['model']}, {fastest['tokens']} tokens/request); pipeline on its mix "
        f"{fastest['pipeline_events_per_s']:,} events/s: {fastest['ratio']}×; worst ratio "
        f"{worst}× (≥ {TARGET_RATIO:.0f}×: {'PASS' if met else 'FAIL'})\n"
    )
    summary = {
        "rows": rows,
        "fastest_producer_events_per_s": fastest["producer_events_per_s"],
        "pipeline_events_per_s_on_its_mix": fastest["pipeline_events_per_s"],
        "ratio": fastest["ratio"],
        "worst_ratio": worst,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "target_ratio": TARGET_RATIO,
        "met": met,
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
