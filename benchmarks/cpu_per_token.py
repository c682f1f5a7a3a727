"""CPU per streamed token of skippy's two processes: the runtime host and the model's engine.

    .venv/bin/python -m benchmarks.cpu_per_token [--model real|tiny|mid] [--requests N]
        [--tokens N] [--threads T] [--watch-events]

Starts a private runtime (`skippyctl runtime serve` in a temporary SKIPPY_RUNTIME_DIR), loads the
model on one lane, sends one warm-up and then N sequential streaming greedy `/v1/completions` of
--tokens tokens (end of generation banned), and reads each process's CPU seconds (utime + stime
from /proc/PID/stat, Linux) before and after. Prints the host's and the engine's milliseconds of
CPU per streamed chunk, and the rate; stops the runtime. `--watch-events` keeps a live SSE
subscriber on the runtime's events for the measured requests (a thread of this process that
reads and decodes every frame, as the dashboard would) and reports the frames per chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.loadgen import banned_tokens
from benchmarks.models import model_path

SKIPPYCTL = Path(sys.executable).parent / "skippyctl"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def _stream(url: str, token: str, body: dict[str, object]) -> int:
    chunks = 0
    with (
        httpx.Client(timeout=300) as client,
        client.stream(
            "POST", f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
    return chunks


class _Watcher(threading.Thread):
    """Reads the live event stream until the runtime stops; counts the frames it decodes."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.frames = 0
        self.attached = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        try:
            with (
                httpx.Client(timeout=None) as client,
                client.stream("GET", f"{self.url}/api/runtime/events/v1", headers=headers) as r,
            ):
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        json.loads(line[5:])
                        self.frames += 1
                        self.attached.set()
        except httpx.HTTPError:
            return  # the runtime stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", choices=("real", "tiny", "mid"), default="real")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--watch-events", action="store_true", help="a live SSE subscriber on the events"
    )
    args = parser.parse_args(argv)
    path = model_path(args.model)
    with tempfile.TemporaryDirectory(prefix="skippy-cpu-") as directory:
        os.chmod(directory, 0o700)
        env = dict(os.environ, SKIPPY_RUNTIME_DIR=directory)
        load = [str(SKIPPYCTL), "load", str(path), "--alias", "bench", "--lanes", "1"]
        load += ["--ctx", str(args.tokens + 64), "--threads", str(args.threads)]
        subprocess.run(load, env=env, check=True, capture_output=True)
        try:
            discovery = json.loads((Path(directory) / "runtime.json").read_text())
            host = int(discovery["pid"])
            (engine,) = _children(host)
            body: dict[str, object] = {
                "model": "bench",
                "prompt": "Once upon a time",
                "max_tokens": args.tokens,
                "temperature": 0,
                "stream": True,
                "logit_bias": {str(t): -100 for t in banned_tokens(path)},
            }
            _stream(discovery["url"], discovery["token"], body)
            watcher = _Watcher(discovery["url"], discovery["token"])
            if args.watch_events:
                watcher.start()
                if not watcher.attached.wait(30):
                    raise SystemExit("the event stream sent nothing in 30 s")
                time.sleep(0.5)  # the replay drained
            frames_before = watcher.frames
            before = (_cpu_s(host), _cpu_s(engine), time.monotonic())
            chunks = sum(
                _stream(discovery["url"], discovery["token"], body) for _ in range(args.requests)
            )
            after = (_cpu_s(host), _cpu_s(engine), time.monotonic())
            frames = watcher.frames - frames_before
        finally:
            subprocess.run([str(SKIPPYCTL), "runtime", "stop"], env=env, capture_output=True)
    host_ms = (after[0] - before[0]) * 1000 / chunks
    engine_ms = (after[1] - before[1]) * 1000 / chunks
    rate = chunks / (after[2] - before[2])
    sys.stdout.write(
        json.dumps(
            {
                "model": args.model,
                "chunks": chunks,
                "chunks_per_s": round(rate, 1),
                "host_cpu_ms_per_chunk": round(host_ms, 3),
                "engine_cpu_ms_per_chunk": round(engine_ms, 3),
                "watch_events": args.watch_events,
                "event_frames_per_chunk": round(frames / chunks, 3),
            }
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
