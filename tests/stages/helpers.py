"""A `skippyctl stage serve` process under test, and the cleanup that leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from skippyctl.stages.relay import Relay, RelayOptions

READ_TIMEOUT_S = 120.0  # a generous bound for a busy machine; never asserted as a duration


def children_of(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc/*/stat)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid …; comm may hold spaces, so split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = READ_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StageProcess:
    """`python -m skippyctl stage serve ARGS` with stdout read line by line on a thread."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "stage", "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.stdout: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.worker_pids: set[int] = set()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_record(self) -> dict[str, Any]:
        line = self.lines.get(timeout=READ_TIMEOUT_S)
        assert line is not None, f"stdout ended; stderr: {self.stderr_so_far()}"
        self.stdout.append(line)
        record = orjson.loads(line)
        assert isinstance(record, dict)
        return record

    def until(self, event: str) -> list[dict[str, Any]]:
        """Records up to and including the first `event` record."""
        records = []
        while True:
            record = self.next_record()
            records.append(record)
            if record.get("event") == event:
                self.worker_pids.update(children_of(self.process.pid))
                return records

    def rest(self) -> list[dict[str, Any]]:
        """Every remaining record, once the process has ended."""
        records = []
        while (line := self.lines.get(timeout=READ_TIMEOUT_S)) is not None:
            self.stdout.append(line)
            records.append(orjson.loads(line))
        return records

    def wait(self) -> int:
        return self.process.wait(READ_TIMEOUT_S)

    def stderr_so_far(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return "(still running)"
        return self.process.stderr.read().decode(errors="replace")

    def cleanup(self) -> None:
        """Kill the worker(s) and the supervisor if still there (nothing outlives a test)."""
        self.worker_pids.update(children_of(self.process.pid) if alive(self.process.pid) else [])
        for pid in self.worker_pids:
            kill_quietly(pid)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(READ_TIMEOUT_S)
        for pid in self.worker_pids:
            wait_gone(pid, 10)


@contextlib.contextmanager
def stage_process(*args: str) -> Iterator[StageProcess]:
    stage = StageProcess(*args)
    try:
        yield stage
    finally:
        stage.cleanup()


@contextlib.contextmanager
def relay_to(target_port: int, **fields: Any) -> Iterator[tuple[Relay, list[dict[str, Any]]]]:
    """An in-process `stage relay` to 127.0.0.1:`target_port` (RelayOptions `fields`), its
    records collected; stopped and every one of its threads joined on exit."""
    records: list[dict[str, Any]] = []
    running = Relay(RelayOptions(target_port=target_port, **fields), records.append)
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True)
    thread.start()
    assert running.listening.wait(READ_TIMEOUT_S)
    try:
        yield running, records
    finally:
        stop.set()
        thread.join(READ_TIMEOUT_S)
        assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("skippy-relay")]


class LoopbackServer:
    """A TCP server of a test's own on 127.0.0.1: each accepted connection is handed to
    ``serve`` on a thread of its own, or, without ``serve``, held open and never read (a peer
    that accepts and never answers). ``connected`` is set at the first connection."""

    def __init__(self, serve: Callable[[socket.socket], None] | None = None) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        self.connected = threading.Event()
        self._serve = serve
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connected.set()
            if self._serve is None:
                self._held.append(conn)
                continue
            thread = threading.Thread(target=self._serve_one, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve_one(self, conn: socket.socket) -> None:
        assert self._serve is not None
        with conn, contextlib.suppress(OSError):
            self._serve(conn)

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join()
        for conn in self._held:
            conn.close()
        self.listener.close()
        for thread in self._threads:
            thread.join(READ_TIMEOUT_S)


@contextlib.contextmanager
def loopback_server(
    serve: Callable[[socket.socket], None] | None = None,
) -> Iterator[LoopbackServer]:
    server = LoopbackServer(serve)
    try:
        yield server
    finally:
        server.close()
