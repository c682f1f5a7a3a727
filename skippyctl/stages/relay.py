"""A jitter-capable wire model: a FIFO TCP relay between a client and a stage.

``Relay(options).run(stop)`` listens on ``listen`` and, per accepted connection, connects to
``target`` and forwards both directions. Contract:

- Each chunk read in one direction is delivered ``delay_ms`` + an exponential jitter of mean
  ``jitter_ms`` + (with probability ``stall_p``) ``stall_ms`` after it was read, **but never
  before the chunk read before it in the same direction** (its delivery time is the later of
  the two): head-of-line blocking, as on a real ordered transport. Bytes are never reordered,
  dropped or altered; the directions are independent.
- An end of stream in one direction is delivered (``shutdown(SHUT_WR)``) after the chunks
  before it; a reset or error on either side closes the connection pair.
- Each direction holds at most ``QUEUED_CHUNKS`` chunks read and not yet delivered; when
  they are all waiting (a stall, a sink that does not read) the relay stops reading that
  direction until one is delivered, so the sender sees backpressure as from a real link's
  window instead of the relay buffering without bound.
- A target that refuses the connection closes the accepted one at once (the client sees an
  end of stream, as it would from a dead stage).
- ``validate`` refuses, before anything binds, a listen address that is not IPv4, a
  non-loopback listen address without ``allow_remote`` (whoever reaches the relay reaches the
  stage, which runs any graph it is sent), ports outside 0–65535, negative times and a
  probability outside 0–1 (``RelayRefused``).
- ``stop`` set: the listener closes, every connection pair is closed and every thread of this
  relay is joined before ``run`` returns. Threads are named ``skippy-relay-*``.
- Randomness comes from one ``random.Random(seed)`` per direction (seeded from ``seed`` and
  the connection's ordinal), so a seeded run draws the same delays for the same chunks.

Lifecycle goes to ``on_record`` as plain dicts (no event id fits a relay in the catalog):
``{"state": "listening", "port": …}``, ``{"state": "connection_opened", "connections": n}``,
``{"state": "connection_closed", "connections": n, "bytes_up": …, "bytes_down": …}``,
``{"state": "stopped", "connections": n}``. No address appears in them (ports only).
"""

from __future__ import annotations

import contextlib
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.stages import ports

CHUNK_BYTES: Final = 65536
QUEUED_CHUNKS: Final = 64
"""Chunks one direction holds undelivered (at most 4 MiB): beyond it, reading waits."""
ACCEPT_POLL_S: Final = 0.1
CONNECT_TIMEOUT_S: Final = 5.0
JOIN_S: Final = 5.0


class RelayRefused(ValueError):
    """The options were refused before anything was bound."""


MAX_WIRE_MS: Final = 600_000.0
"""The longest delay, mean jitter or stall a wire model takes: no network this relay models
waits longer, and an unbounded one (inf, 1e30) would overflow the writer's wait."""


@dataclass(frozen=True, slots=True)
class RelayOptions:
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    target_host: str = "127.0.0.1"
    target_port: int = 0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    """Mean of the exponential jitter added to each chunk (0: none)."""
    stall_ms: float = 0.0
    stall_p: float = 0.0
    """Probability that a chunk also waits ``stall_ms``."""
    seed: int | None = None
    allow_remote: bool = False


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv4 or a name) into its parts; ``RelayRefused`` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RelayRefused(f"{text!r} is not HOST:PORT")
    return host, int(port)


def validate(options: RelayOptions) -> tuple[str, str]:
    """The IPv4 listen and target addresses, or ``RelayRefused``."""
    try:
        listen = ports.resolve_ipv4(options.listen_host)
        target = ports.resolve_ipv4(options.target_host)
    except ports.AddressError as error:
        raise RelayRefused(str(error)) from error
    if not ports.is_loopback(listen) and not options.allow_remote:
        raise RelayRefused(
            f"{options.listen_host} is not a loopback address; whoever reaches the relay "
            "reaches the stage behind it, so listening beyond this machine needs --allow-remote"
        )
    for name, port in (("--listen", options.listen_port), ("--to", options.target_port)):
        if not 0 <= port <= ports.MAX_PORT:
            raise RelayRefused(f"{name} port {port} is not 0-{ports.MAX_PORT}")
    if options.target_port == 0:
        raise RelayRefused("--to needs a port")
    for name, value in (
        ("--delay-ms", options.delay_ms),
        ("--jitter-ms", options.jitter_ms),
        ("--stall-ms", options.stall_ms),
    ):
        if not value >= 0:  # also refuses NaN
            raise RelayRefused(f"{name} must not be negative")
        if not value <= MAX_WIRE_MS:  # also refuses inf
            raise RelayRefused(f"{name} is at most {MAX_WIRE_MS:.0f} (10 minutes)")
    if not 0.0 <= options.stall_p <= 1.0:
        raise RelayRefused("--stall-p must be 0-1")
    return listen, target


class WireModel:
    """When each chunk of one direction is delivered (module docstring); not thread-safe."""

    def __init__(self, options: RelayOptions, rng: random.Random) -> None:
        self._delay_s = options.delay_ms / 1000.0
        self._jitter_s = options.jitter_ms / 1000.0
        self._stall_s = options.stall_ms / 1000.0
        self._stall_p = options.stall_p
        self._rng = rng
        self._last_s = 0.0

    def deliver_at(self, read_at_s: float) -> float:
        """The monotonic time to deliver a chunk read at ``read_at_s``: never before the
        previous chunk's delivery."""
        extra = self._delay_s
        if self._jitter_s > 0:
            extra += self._rng.expovariate(1.0 / self._jitter_s)
        if self._stall_p > 0 and self._rng.random() < self._stall_p:
            extra += self._stall_s
        self._last_s = max(self._last_s, read_at_s + extra)
        return self._last_s


_EOF: Final = b""


class _Direction:
    """One direction of one connection pair: a reader stamps chunks, a writer delivers them."""

    def __init__(
        self,
        source: socket.socket,
        sink: socket.socket,
        model: WireModel,
        closed: threading.Event,
        abort: Callable[[], None],
        name: str,
    ) -> None:
        self._source = source
        self._sink = sink
        self._model = model
        self._closed = closed
        self._abort = abort
        self._queue: queue.Queue[tuple[float, bytes]] = queue.Queue(maxsize=QUEUED_CHUNKS)
        self.bytes = 0
        self.threads = (
            threading.Thread(target=self._read, name=f"{name}-read", daemon=True),
            threading.Thread(target=self._write, name=f"{name}-write", daemon=True),
        )

    def _read(self) -> None:
        self._guarded(self._read_until_end)

    def _write(self) -> None:
        self._guarded(self._write_until_end)

    def _guarded(self, pump: Callable[[], None]) -> None:
        """Run one thread of the pair; whatever ends it unexpectedly ends the pair too, so no
        connection is left open with one direction gone."""
        try:
            pump()
        except Exception:  # noqa: BLE001 - the pair is torn down instead
            self._abort()

    def _read_until_end(self) -> None:
        while not self._closed.is_set():
            try:
                chunk = self._source.recv(CHUNK_BYTES)
            except OSError:
                self._abort()
                chunk = _EOF
            self._put((self._model.deliver_at(time.monotonic()), chunk))
            if not chunk:
                return
        self._put((0.0, _EOF))

    def _put(self, item: tuple[float, bytes]) -> None:
        """Queue for the writer, waiting while the queue is full (backpressure); given up
        once the pair is closed — the writer then returns without it."""
        while True:
            try:
                self._queue.put(item, timeout=ACCEPT_POLL_S)
                return
            except queue.Full:
                if self._closed.is_set():
                    return

    def _write_until_end(self) -> None:
        while True:
            deliver_at, chunk = self._queue.get()
            # Waits on the pair's closed flag, so a stop never waits out a long stall.
            if self._closed.wait(max(0.0, deliver_at - time.monotonic())) and chunk:
                return
            if not chunk:
                with contextlib.suppress(OSError):
                    self._sink.shutdown(socket.SHUT_WR)
                return
            try:
                self._sink.sendall(chunk)
            except OSError:
                self._abort()
                return
            self.bytes += len(chunk)


class _Pair:
    """An accepted connection and its connection to the target."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, options: RelayOptions, ordinal: int
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        seed = None if options.seed is None else options.seed * 1_000_003 + ordinal * 2
        up_rng = random.Random(seed)
        down_rng = random.Random(None if seed is None else seed + 1)
        name = f"skippy-relay-{ordinal}"
        self.up = _Direction(
            client, upstream, WireModel(options, up_rng), self.closed, self.abort, f"{name}-up"
        )
        self.down = _Direction(
            upstream, client, WireModel(options, down_rng), self.closed, self.abort, f"{name}-down"
        )
        self.threads = (*self.up.threads, *self.down.threads)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    @property
    def finished(self) -> bool:
        return not any(thread.is_alive() for thread in self.threads)

    def abort(self) -> None:
        """A reset or error on either side (or a stop): both sockets shut, so every thread of
        the pair returns (a reader blocked in ``recv`` sees an end of stream)."""
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.abort()
        for thread in self.threads:
            thread.join(JOIN_S)
        for sock in (self.client, self.upstream):
            sock.close()


class Relay:
    """One relay (module docstring). ``port`` is the real listen port once ``listening``."""

    def __init__(
        self, options: RelayOptions, on_record: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.options = options
        self._on_record = on_record or (lambda _record: None)
        self.port = options.listen_port
        self.listening = threading.Event()
        self.connections = 0

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set; ``RelayRefused`` before anything binds, ``OSError``
        when the listen port cannot be bound."""
        listen, target = validate(self.options)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        pairs: list[_Pair] = []
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((listen, self.options.listen_port))
            listener.listen(16)
            listener.settimeout(ACCEPT_POLL_S)
            self.port = int(listener.getsockname()[1])
            self._on_record({"state": "listening", "port": self.port})
            self.listening.set()
            while not stop.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    self._reap(pairs)
                    continue
                pair = self._connect(client, target)
                if pair is not None:
                    pairs.append(pair)
                self._reap(pairs)
        finally:
            listener.close()
            for pair in pairs:
                self._close(pair)
            self._on_record({"state": "stopped", "connections": self.connections})

    def _connect(self, client: socket.socket, target: str) -> _Pair | None:
        client.settimeout(None)
        try:
            upstream = socket.create_connection(
                (ports.probe_address(target), self.options.target_port), CONNECT_TIMEOUT_S
            )
        except OSError:
            client.close()
            return None
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        pair = _Pair(client, upstream, self.options, self.connections)
        pair.start()
        self._on_record({"state": "connection_opened", "connections": self.connections})
        return pair

    def _reap(self, pairs: list[_Pair]) -> None:
        for pair in [p for p in pairs if p.finished]:
            pairs.remove(pair)
            self._close(pair)

    def _close(self, pair: _Pair) -> None:
        pair.close()
        self._on_record(
            {
                "state": "connection_closed",
                "connections": self.connections,
                "bytes_up": pair.up.bytes,
                "bytes_down": pair.down.bytes,
            }
        )
