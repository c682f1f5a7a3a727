"""The README's demo: a runtime, a model with 4 lanes, three chatty sessions, the dashboard.

    python scripts/demo.py            # opens the dashboard when run in a terminal (q quits)
    python scripts/demo.py --seconds 5 | jq -r .event   # no terminal: prints the event stream

Starts a runtime when none runs (or attaches to the running one), loads fixtures/tiny.gguf with
`--lanes 4`, and drives generation traffic from three sessions on background threads. In a
terminal it opens `skippyctl tui`; without one (CI) it prints `events --json` style records for
`--seconds` seconds and exits 0. The runtime is left running (stop it with
`skippyctl runtime stop`).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson

from skippyctl.client.discovery import DiscoveryProblem, read_discovery
from skippyctl.client.http import FrameReader, RuntimeClient, RuntimeUnreachable
from skippyctl.client.launch import connect
from skippyctl.config.runtime_settings import InvalidSettings, read_runtime_settings
from skippyctl.output.codec import decode_frame_event, event_record

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "tiny.gguf"
PROMPTS = ("Once upon a time", "The quick brown fox", "In a galaxy far away", "Dear diary,")


def say(text: str) -> None:
    sys.stderr.write(f"demo: {text}\n")
    sys.stderr.flush()


def traffic(client: RuntimeClient, session: int, stop: threading.Event) -> None:
    """One session's requests until `stop`: short completions with small random pauses."""
    rng = random.Random(session)
    with httpx.Client(
        base_url=client.discovery.url,
        headers={"Authorization": f"Bearer {client.discovery.token}"},
        timeout=30.0,
    ) as http:
        while not stop.is_set():
            body = {
                "model": "tiny",
                "prompt": rng.choice(PROMPTS),
                "max_tokens": rng.randint(8, 48),
                "user": f"demo-session-{session}",
            }
            try:
                http.post("/v1/completions", content=orjson.dumps(body))
            except httpx.HTTPError:
                if stop.wait(1.0):
                    return
            stop.wait(rng.uniform(0.1, 0.6))


def print_events(client: RuntimeClient, seconds: float) -> None:
    """`events --json` style records of the live stream for `seconds`."""
    reader = FrameReader(client)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        frame = reader.get(min(left, 0.2))
        if frame is False:
            continue
        if frame is None or isinstance(frame, Exception):
            say(f"event stream ended: {frame}")
            return
        assert not isinstance(frame, bool)
        if frame.name != "runtime_event":
            continue
        event, _ = decode_frame_event(frame.data)
        if event is None:
            continue
        record = event_record(event, int(frame.data.get("sequence", 0)), frame.cursor)
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
        sys.stdout.buffer.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="event stream length (no TTY)")
    parser.add_argument("--sessions", type=int, default=3, help="concurrent chat sessions")
    args = parser.parse_args(argv)
    if not FIXTURE.exists():
        from skippyctl.fixtures import make_fixtures

        make_fixtures(FIXTURE.parent)
    try:
        settings = read_runtime_settings()  # this script's entry reads them once
    except InvalidSettings as error:
        say(f"invalid settings: {error}")
        return 10
    try:
        running = read_discovery(settings) is not None
    except DiscoveryProblem:
        running = False
    try:
        client = connect(settings)
    except RuntimeUnreachable as error:
        say(f"no runtime: {error}")
        return 3
    say(f"{'attached to' if running else 'started'} the runtime at {client.discovery.url}")
    cli = [sys.executable, "-m", "skippyctl"]
    loaded = subprocess.run([*cli, "load", str(FIXTURE), "--lanes", "4"], stdout=sys.stderr)
    if loaded.returncode != 0:
        say("loading tiny.gguf failed")
        return loaded.returncode
    stop = threading.Event()
    workers = [
        threading.Thread(target=traffic, args=(client, i + 1, stop), daemon=True)
        for i in range(args.sessions)
    ]
    for worker in workers:
        worker.start()
    say(f"{args.sessions} sessions are generating on tiny")
    try:
        if sys.stdout.isatty() and sys.stdin.isatty():
            subprocess.run([*cli, "tui"])
        else:
            print_events(client, args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for worker in workers:
            worker.join(5.0)
        client.close()
    say("the runtime is still running; stop it with `skippyctl runtime stop`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
