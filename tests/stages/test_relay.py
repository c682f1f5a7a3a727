"""The wire-model relay on loopback: bytes intact and in order through delay, jitter and
stalls; the delay is there (lower bounds only: nothing can make a relay faster than its delay);
the CLI's records and clean shutdown. Every thread and process started here is joined/reaped."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from skippyctl.stages.relay import (
    CHUNK_BYTES,
    QUEUED_CHUNKS,
    RelayOptions,
    RelayRefused,
    WireModel,
    validate,
)
from tests.stages.helpers import loopback_server, relay_to

READ_TIMEOUT_S = 60.0


def _echo(conn: socket.socket) -> None:
    while chunk := conn.recv(65536):
        conn.sendall(chunk)


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    """A TCP echo server of this test's own (any number of connections, one thread each)."""
    with loopback_server(_echo) as server:
        yield server.port


def _receive(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    sock.settimeout(READ_TIMEOUT_S)
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed early"
        data += chunk
    return bytes(data)


def test_bytes_arrive_intact_and_in_order_through_jitter_and_stalls() -> None:
    payload = random.Random(7).randbytes(400_000)
    with (
        echo_server() as port,
        relay_to(port, delay_ms=1, jitter_ms=2, stall_ms=5, stall_p=0.2, seed=3) as (running, _),
        socket.create_connection(("127.0.0.1", running.port)) as sock,
    ):
        # Many small writes, so the relay sees many chunks each with its own draw.
        def write() -> None:
            for start in range(0, len(payload), 997):
                sock.sendall(payload[start : start + 997])

        writer = threading.Thread(target=write)
        writer.start()
        echoed = _receive(sock, len(payload))
        writer.join()
    assert echoed == payload


def test_several_connections_are_relayed_independently() -> None:
    with echo_server() as port, relay_to(port, jitter_ms=1, seed=1) as (running, records):
        socks = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(3)]
        try:
            for index, sock in enumerate(socks):
                sock.sendall(bytes([index]) * 1000)
            for index, sock in enumerate(socks):
                assert _receive(sock, 1000) == bytes([index]) * 1000
        finally:
            for sock in socks:
                sock.close()
    states = [r["state"] for r in records]
    assert states[0] == "listening" and states[-1] == "stopped"
    assert states.count("connection_opened") == 3 and states.count("connection_closed") == 3
    assert records[-1]["connections"] == 3


def test_the_round_trip_takes_at_least_twice_the_delay() -> None:
    with (
        echo_server() as port,
        relay_to(port, delay_ms=50, jitter_ms=5, seed=2) as (running, _),
        socket.create_connection(("127.0.0.1", running.port)) as sock,
    ):
        for _ in range(3):
            started = time.monotonic()
            sock.sendall(b"ping")
            assert _receive(sock, 4) == b"ping"
            # Each direction adds at least 50 ms: a lower bound cannot flake.
            assert time.monotonic() - started >= 0.100


def test_a_chunk_is_never_delivered_before_the_one_before_it() -> None:
    options = RelayOptions(target_port=1, delay_ms=1, jitter_ms=50, stall_ms=200, stall_p=0.3)
    model = WireModel(options, random.Random(11))
    times = [model.deliver_at(i * 0.001) for i in range(500)]
    assert times == sorted(times)
    assert all(t >= i * 0.001 + 0.001 for i, t in enumerate(times))


def test_an_end_of_stream_is_relayed_after_the_data_before_it() -> None:
    with (
        echo_server() as port,
        relay_to(port, delay_ms=20) as (running, _),
        socket.create_connection(("127.0.0.1", running.port)) as sock,
    ):
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert _receive(sock, 10) == b"last words"
        assert sock.recv(10) == b""  # the echo server saw the end and closed


def test_a_sink_that_does_not_read_backpressures_the_sender() -> None:
    # Unbounded, the relay would read all of it into memory and the send would complete.
    # Bounded, what one direction holds is QUEUED_CHUNKS chunks, plus what the kernel buffers
    # on the two hops (a few MiB each on loopback): the sender's send times out far short.
    total = 512 * 2**20
    block = bytes(2**20)
    sent = 0
    with (
        loopback_server() as deaf,  # accepts the relay's connection, never reads it
        relay_to(deaf.port) as (running, _),
        socket.create_connection(("127.0.0.1", running.port)) as sock,
    ):
        sock.settimeout(2.0)
        with contextlib.suppress(TimeoutError):
            while sent < total:
                sent += sock.send(block)
    assert sent < QUEUED_CHUNKS * CHUNK_BYTES + 64 * 2**20, f"{sent} bytes were accepted"


@pytest.mark.parametrize(
    ("fields", "phrase"),
    [
        ({"listen_host": "8.8.8.8"}, "allow-remote"),
        ({"delay_ms": -1.0}, "--delay-ms"),
        ({"delay_ms": 1e30}, "--delay-ms"),
        ({"jitter_ms": float("inf")}, "--jitter-ms"),
        ({"stall_ms": float("nan")}, "--stall-ms"),
        ({"stall_p": 1.5}, "--stall-p"),
        ({"target_port": 0}, "--to"),
        ({"listen_host": "not an address at all"}, "IPv4"),
    ],
)
def test_options_are_refused_before_anything_binds(fields: dict[str, object], phrase: str) -> None:
    base: dict[str, object] = {"target_port": 9}
    base.update(fields)
    with pytest.raises(RelayRefused, match=phrase):
        validate(RelayOptions(**base))  # type: ignore[arg-type]  # test kwargs


def test_the_cli_prints_relay_records_and_stops_cleanly_on_sigterm() -> None:
    with echo_server() as port:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skippyctl",
                "stage",
                "relay",
                "--listen",
                "127.0.0.1:0",
                "--to",
                f"127.0.0.1:{port}",
                "--delay-ms",
                "5",
                "--json",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            first = orjson.loads(process.stdout.readline())
            assert first["record"] == "relay" and first["state"] == "listening"
            assert first["schema_version"] == 1
            with socket.create_connection(("127.0.0.1", first["port"])) as sock:
                sock.sendall(b"hello")
                assert _receive(sock, 5) == b"hello"
            os.kill(process.pid, signal.SIGTERM)
            out, _err = process.communicate(timeout=READ_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0
    records = [orjson.loads(line) for line in out.splitlines()]
    assert [r["state"] for r in records][-1] == "stopped"
    assert all(r["record"] == "relay" for r in records)
    assert b"127.0.0.1" not in out  # ports only, never an address


def test_the_cli_refuses_a_remote_listen_address_without_allow_remote() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "skippyctl",
            "stage",
            "relay",
            "--listen",
            "0.0.0.0:0",
            "--to",
            "127.0.0.1:9",
            "--json",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=READ_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 10
    record = orjson.loads(result.stdout.splitlines()[0])
    assert record["record"] == "error" and record["reason_code"] == "invalid_configuration"


def test_a_direction_that_fails_unexpectedly_ends_its_pair() -> None:
    """A fault inside a relay thread (here a wire model whose delivery time overflows the
    writer's wait — validate refuses such options, so this is the one way to produce it) tears
    the connection down instead of leaving it open with one direction gone."""
    from skippyctl.stages.relay import _Direction

    class Unbounded:
        def deliver_at(self, read_at_s: float) -> float:
            return float("inf")

    source, peer = socket.socketpair()
    sink, reader = socket.socketpair()
    closed = threading.Event()
    aborted = threading.Event()

    def abort() -> None:
        aborted.set()
        closed.set()
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    direction = _Direction(source, sink, Unbounded(), closed, abort, "test-relay")  # type: ignore[arg-type]
    for thread in direction.threads:
        thread.start()
    try:
        peer.sendall(b"chunk")
        assert aborted.wait(10), "the failed writer left the pair open"
        for thread in direction.threads:
            thread.join(10)
            assert not thread.is_alive()
    finally:
        for sock in (source, peer, sink, reader):
            sock.close()
