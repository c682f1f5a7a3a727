"""The helper processes of `benchmarks/decode_events.py`: stub OTLP/HTTP receivers and a live
SSE subscriber, each in its own process so that parsing the event stream or answering POSTs never
shares the timing client's interpreter.

    .venv/bin/python -m benchmarks.decode_events_children --collectors
    .venv/bin/python -m benchmarks.decode_events_children --subscriber URL

Contract: a child runs until its stdin closes, then prints one JSON line with what it saw and
exits. ``--collectors`` first prints the receivers' ports (``{"slow": P, "failing": P}``): the
slow one accepts each POST (to any path: `/v1/logs`, `/v1/traces`, `/v1/metrics`) and never
answers (it closes after ``SLOW_COLLECTOR_HOLD_S``), the failing one answers 503 at once; at
the end it prints ``{"posts": {...}}``. ``--subscriber`` reads ``/api/runtime/events/v1`` with
the token in ``SKIPPY_BENCH_TOKEN`` and prints its counts of frames, events, per-token events
and errors. :class:`Child` starts one and collects that
last line.
"""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
import threading
import time
from typing import IO, Any, Final

import httpx
import orjson

from benchmarks.models import REPO

SLOW_COLLECTOR_HOLD_S: Final = 10.0


def collectors() -> int:
    """Child: the stub OTLP receivers. Prints their ports, serves until stdin closes, then
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


def subscriber(url: str) -> int:
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


class Child:
    """One helper process (this module, run as a child), stopped by closing its stdin."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.decode_events_children", *args],
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--collectors", action="store_true", help="the stub OTLP receivers")
    which.add_argument("--subscriber", metavar="URL", help="a live SSE subscriber of URL")
    args = parser.parse_args(argv)
    if args.collectors:
        return collectors()
    return subscriber(args.subscriber)


if __name__ == "__main__":
    sys.exit(main())
