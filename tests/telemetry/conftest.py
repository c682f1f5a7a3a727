"""A real NDJSON collector on 127.0.0.1 (http.server in a thread) whose behaviour a test sets:
`ok` (204), `fail` (500), `stall` (reads the request, never answers). Tests wait on its
condition variable for what they expect, never on a sleep."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.cli.helpers import ndjson_objects


@dataclass(frozen=True)
class Post:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int | None
    """What the collector answered (None: it stalled)."""

    def records(self) -> list[dict[str, Any]]:
        """Every NDJSON line parsed (fails the test if one does not parse to an object)."""
        return ndjson_objects(self.body)


class Collector:
    def __init__(self, mode: str = "ok", tls: ssl.SSLContext | None = None) -> None:
        self.mode = mode
        self.posts: list[Post] = []
        self.changed = threading.Condition()
        self.release = threading.Event()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                mode = collector.mode
                status = {"ok": 204, "fail": 500}.get(mode)
                post = Post(self.path, dict(self.headers.items()), body, status)
                with collector.changed:
                    collector.posts.append(post)
                    collector.changed.notify_all()
                if status is None:
                    collector.release.wait()  # accepted, read, never answered
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="test-collector", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}/ingest"

    def set_mode(self, mode: str) -> None:
        with self.changed:
            self.mode = mode

    def wait_for(self, predicate: Callable[[list[Post]], bool], timeout_s: float = 30.0) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: predicate(self.posts), timeout_s)
        assert ok, f"collector never saw it; {len(self.posts)} post(s)"

    def records(self) -> list[dict[str, Any]]:
        with self.changed:
            posts = list(self.posts)
        return [r for p in posts if p.status == 204 for r in p.records()]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def has_event(event: str) -> Callable[[list[Post]], bool]:
    return lambda posts: any(
        r["event"] == event for p in posts if p.status == 204 for r in p.records()
    )


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector()
    try:
        yield running
    finally:
        running.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


FAST_KNOBS = {
    # Fast enough that a test sees several failures in about a second.
    "SKIPPY_TELEMETRY_EXPORT_INTERVAL_MILLIS": "100",
    "SKIPPY_TELEMETRY_EXPORT_TIMEOUT_MILLIS": "300",
    "SKIPPY_TELEMETRY_MAX_BACKOFF_MILLIS": "400",
}
