"""The merged fleet stream under generation load: throughput, lag and loss (issue 30).

Three runtimes on loopback (distinct ports and runtime directories), each with the tiny fixture
model; the first is the local member, the other two fleet nodes reached with key files. The
consumer runs as a user runs it, a subprocess whose stdout a small process of its own reads as
`jq` would (stamping each line as it comes), side by side in one run:

- ``fleet``: one `skippyctl events --follow --fleet --json`;
- ``separate``: one `skippyctl events --follow --json` per runtime (what an operator without
  `--fleet` would run: the baseline the merge is measured against).

Meanwhile every node serves `--sessions` streamed completions at a time (64 greedy tokens
each), request after request, for `--seconds`. Per mode:

- ``events``: the runtimes as they run by default;
- ``token-events``: `runtime serve --debug-token-events` (one more event per sampled token: the
  event rate an operator gets when debugging, many times the default's).

Figures: records received per node and per second (the merged stream's throughput); lag = the
moment a record's line reached this script minus its event's own `ts` (the runtime's wall
clock, the same machine), p50 / p99 / max; lost = sequences a node dispatched that never came
(each node's stream is checked from 1 to its last sequence, read afterwards from a fresh
connection), duplicates, replay gaps; the consumer's CPU per record (its processes, children
included). Target: nothing lost, p99 lag ≤ 250 ms.

Usage: ``.venv/bin/python -m benchmarks.fleet_stream [--seconds 20] [--sessions 2]``
(prints one JSON object; progress on stderr).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.loadgen import percentile
from benchmarks.models import REPO
from benchmarks.servers import MODEL_ALIAS, Server, ServerSpec, start_skippy
from skippyctl.client.discovery import Discovery
from skippyctl.client.http import RuntimeClient
from skippyctl.config.fleet import Fleet, FleetEntry, write_fleet

NODES: Final = ("local", "b", "c")
MODES: Final = {"events": (), "token-events": ("--debug-token-events",)}
DRAIN_S: Final = 3.0


STAMPER: Final = (
    "import sys, time\n"
    "out = sys.stdout.buffer\n"
    "for line in sys.stdin.buffer:\n"
    "    out.write(repr(time.time()).encode() + b' ' + line)\n"
)
"""A consumer of its own (as `jq` would be): each line it reads, prefixed with when it came. A
process apart from this script's load threads, so their GIL does not delay the reading."""


class Reader:
    """A follower's stdout piped into a STAMPER process writing to a file; `lines()` reads it
    back (with, for a follower of one runtime, that runtime's node name)."""

    def __init__(self, process: subprocess.Popen[bytes], out: Path, node: str | None = None):
        self.node = node
        self.out = out
        self._handle = out.open("wb")
        self._stamper = subprocess.Popen(
            [sys.executable, "-c", STAMPER], stdin=process.stdout, stdout=self._handle
        )
        assert process.stdout is not None
        process.stdout.close()  # the stamper holds the pipe now

    def join(self) -> None:
        self._stamper.wait(30)
        self._handle.close()

    def lines(self) -> list[tuple[float, bytes]]:
        stamped = []
        for line in self.out.read_bytes().splitlines():
            arrived, _, record = line.partition(b" ")
            stamped.append((float(arrived), record))
        return stamped


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process and of its live children (a fleet follower
    runs one follower process per node), from /proc."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _load(server: Server, stop: threading.Event, counter: list[int]) -> None:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http:
        while not stop.is_set():
            body = {
                "model": MODEL_ALIAS,
                "prompt": "Once upon a time",
                "max_tokens": 64,
                "stream": True,
                "temperature": 0,
            }
            with http.stream("POST", "/v1/completions", json=body) as response:
                for _ in response.iter_lines():
                    pass
            counter[0] += 1


def _last_sequence(server: Server) -> int:
    """The node's dispatcher position now: the `runtime_state` frame of a fresh stream."""
    token = server.headers["Authorization"].removeprefix("Bearer ")
    client = RuntimeClient(Discovery(0, server.url, token, "", "", ""))
    try:
        for frame in client.frames():
            if frame.name == "runtime_state":
                return int(frame.data["sequence"])
    finally:
        client.close()
    raise RuntimeError("no runtime_state frame")


def _popen(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )


def run_mode(
    mode: str, consumer: str, seconds: float, sessions: int, scratch: Path
) -> dict[str, Any]:
    spec = ServerSpec(REPO / "fixtures" / "tiny.gguf", sessions, 512, threads=1)
    servers: dict[str, Server] = {}
    followers: list[subprocess.Popen[bytes]] = []
    try:
        for name in NODES:
            directory = scratch / name
            directory.mkdir(parents=True)
            servers[name] = start_skippy(
                ServerSpec(
                    spec.path,
                    sessions,
                    512,
                    threads=1,
                    skippy_load_args=("--threads", "1"),
                ),
                directory,
                serve_args=MODES[mode],
            )
        entries = []
        for name in NODES[1:]:
            key = scratch / f"{name}.key"
            key.write_text(servers[name].headers["Authorization"].removeprefix("Bearer "))
            entries.append(FleetEntry(name, servers[name].url, key_file=key))
        fleet_file = scratch / "fleet.toml"
        write_fleet(Fleet(tuple(entries)), fleet_file)
        env = dict(
            os.environ,
            SKIPPY_RUNTIME_DIR=str(scratch / "local" / "runtime"),
            SKIPPY_FLEET_FILE=str(fleet_file),
        )
        command = [sys.executable, "-m", "skippyctl", "events", "--follow", "--json"]
        if consumer == "fleet":
            followers = [_popen([*command, "--fleet"], env)]
            readers = [Reader(followers[0], scratch / "fleet.ndjson")]
        else:  # one follower per runtime, as an operator without --fleet would run them
            followers, readers = [], []
            for name in NODES:
                runtime = scratch / name / "runtime"
                followers.append(_popen(command, dict(env, SKIPPY_RUNTIME_DIR=str(runtime))))
                readers.append(Reader(followers[-1], scratch / f"{name}.ndjson", name))
        time.sleep(2.0)  # the follower connects and replays the loads' events
        stop = threading.Event()
        counters = {name: [0] for name in NODES}
        threads = [
            threading.Thread(target=_load, args=(servers[name], stop, counters[name]), daemon=True)
            for name in NODES
            for _ in range(sessions)
        ]
        started = time.time()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(120)
        ended = time.time()
        time.sleep(DRAIN_S)
        last = {name: _last_sequence(servers[name]) for name in NODES}
        time.sleep(DRAIN_S)  # the probes' own events (none are expected) reach the follower
        cpu_s = sum(_cpu_s(f.pid) for f in followers)
        for follower in followers:
            follower.send_signal(signal.SIGINT)
            follower.wait(30)
        lines = []
        for reader in readers:
            reader.join()
            lines += [(arrived, line, reader.node) for arrived, line in reader.lines()]
        figures = _figures(lines, last, started, ended, counters)
        figures["follower_cpu_us_per_record"] = round(cpu_s * 1e6 / max(1, figures["received"]), 1)
        return figures
    finally:
        for follower in followers:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
        for server in servers.values():
            server.stop()


def _figures(
    lines: list[tuple[float, bytes, str | None]],
    last: dict[str, int],
    started: float,
    ended: float,
    counters: dict[str, list[int]],
) -> dict[str, Any]:
    sequences: dict[str, list[int]] = {name: [] for name in NODES}
    lags_ms: list[float] = []
    in_window = 0
    gaps = 0
    statuses: list[str] = []
    for arrived, line, follower_node in lines:
        record = orjson.loads(line)
        node = str(record.get("node") or follower_node)
        if record.get("record") == "replay_gap":
            gaps += 1
            continue
        if record.get("record") == "node_status":
            statuses.append(f"{node}:{record['state']}")
            continue
        sequences[node].append(int(record["seq"]))
        wall = datetime.fromisoformat(record["ts"]).timestamp()
        if started <= wall <= ended:
            lags_ms.append((arrived - wall) * 1000)

            in_window += 1
    per_node = {}
    for name in NODES:
        seen = sequences[name]
        expected = set(range(1, last[name] + 1))
        per_node[name] = {
            "records": len(seen),
            "last_sequence": last[name],
            "lost": len(expected - set(seen)),
            "duplicates": len(seen) - len(set(seen)),
            "in_order": seen == sorted(seen),
            "requests": counters[name][0],
        }
    return {
        "received": len(lines),
        "records_per_s": round(in_window / (ended - started), 1),
        "lag_ms": {
            "p50": round(percentile(lags_ms, 50), 1),
            "p99": round(percentile(lags_ms, 99), 1),
            "max": round(max(lags_ms), 1),
            "mean": round(statistics.fmean(lags_ms), 1),
            "samples": len(lags_ms),
        },
        "lost": sum(n["lost"] for n in per_node.values()),
        "duplicates": sum(n["duplicates"] for n in per_node.values()),
        "replay_gaps": gaps,
        "node_status": statuses,
        "nodes": per_node,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--consumers",
        default="fleet,separate",
        help="fleet: one `events --follow --fleet --json`; separate: one follower per runtime",
    )
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    result: dict[str, Any] = {"commit": head, "seconds": args.seconds, "sessions": args.sessions}
    with tempfile.TemporaryDirectory(prefix="skippy-fleet-bench-") as scratch:
        for mode in args.modes.split(","):
            for consumer in args.consumers.split(","):
                label = f"{mode}/{consumer}"
                sys.stderr.write(f"{label}: three runtimes under load for {args.seconds:g} s …\n")
                result[label] = run_mode(
                    mode, consumer, args.seconds, args.sessions, Path(scratch) / label
                )
                sys.stderr.write(orjson.dumps(result[label]).decode() + "\n")
    sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
