"""The stream socket (engine/stream_socket.py): a client connection's descriptor handed from the
host to the engine with its request id, over a real SOCK_SEQPACKET socketpair."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from skippyctl.engine import stream_socket
from skippyctl.engine.stream_socket import StreamSocket, stream_socket_pair


@pytest.fixture
def ends() -> Iterator[tuple[StreamSocket, StreamSocket]]:
    host, engine = stream_socket_pair()
    yield StreamSocket(host), StreamSocket(engine)
    host.close()
    engine.close()


def _same_file(a: int, b: int) -> bool:
    first, second = os.fstat(a), os.fstat(b)
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def test_the_engine_takes_the_descriptor_given_for_its_request(
    ends: tuple[StreamSocket, StreamSocket],
) -> None:
    host, engine = ends
    a, b = socket.socketpair()
    try:
        assert host.give("req-1", a.fileno())
        taken = engine.take("req-1")
        assert taken is not None and taken != a.fileno()
        assert _same_file(taken, a.fileno())
        os.write(taken, b"through the engine's own descriptor")
        os.close(taken)
        assert b.recv(100) == b"through the engine's own descriptor"
    finally:
        a.close()
        b.close()


def test_a_descriptor_whose_command_never_came_is_skipped_and_closed(
    ends: tuple[StreamSocket, StreamSocket],
) -> None:
    host, engine = ends
    stale, stale_peer = socket.socketpair()
    wanted, wanted_peer = socket.socketpair()
    try:
        assert host.give("req-1", stale.fileno())
        assert host.give("req-2", wanted.fileno())
        stale.close()  # now only the engine's copy, if it kept one, holds it open
        taken = engine.take("req-2")
        assert taken is not None and _same_file(taken, wanted.fileno())
        os.close(taken)
        stale_peer.settimeout(5)
        assert stale_peer.recv(10) == b""  # the skipped descriptor was closed
    finally:
        for sock in (stale, stale_peer, wanted, wanted_peer):
            sock.close()


def test_take_gives_up_when_nothing_was_given(
    ends: tuple[StreamSocket, StreamSocket], monkeypatch: pytest.MonkeyPatch
) -> None:
    _host, engine = ends
    monkeypatch.setattr(stream_socket, "TAKE_TIMEOUT_S", 0.05)
    assert engine.take("req-1") is None


def test_give_fails_without_waiting_once_the_engine_is_gone(
    ends: tuple[StreamSocket, StreamSocket],
) -> None:
    host, engine = ends
    engine.close()
    a, b = socket.socketpair()
    try:
        assert not host.give("req-1", a.fileno())
    finally:
        a.close()
        b.close()
