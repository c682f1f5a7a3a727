"""The control channel's framing: no message size or content a peer sends can tear or end it.

Typed messages on both ends (engine/protocol.py), and raw frames where a peer misbehaves."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import orjson
import pytest

from skippyctl.engine.channel import (
    MAX_MESSAGE_BYTES,
    ControlChannel,
    MalformedMessage,
    MessageTooLarge,
    UnencodableMessage,
    encode_frame,
    engine_side,
    host_side,
)
from skippyctl.engine.protocol_commands import Command, Generate, Ping, Sampling
from skippyctl.engine.protocol_messages import EngineMessage, Pong

HostEnd = ControlChannel[Command, EngineMessage]
EngineEnd = ControlChannel[EngineMessage, Command]


@pytest.fixture
def pair() -> Iterator[tuple[HostEnd, EngineEnd]]:
    """The host's end (sends commands) and the engine's end (receives them)."""
    left, right = socket.socketpair()
    a, b = host_side(left), engine_side(right)
    yield a, b
    a.close()
    b.close()


def _send_in_thread(channel: HostEnd, message: Command) -> threading.Thread:
    # A frame larger than the socket buffer needs a concurrent reader.
    thread = threading.Thread(target=channel.send, args=(message,))
    thread.start()
    return thread


def test_a_message_over_the_old_one_mebibyte_line_limit_arrives_whole(
    pair: tuple[HostEnd, EngineEnd],
) -> None:
    a, b = pair
    prompt = "hello world\n" * 200_000  # ~2.4 MB, newlines included
    sender = _send_in_thread(a, Generate("r", prompt=prompt))
    received = b.receive()
    sender.join()
    assert received == Generate("r", prompt=prompt)


def test_an_oversize_message_is_refused_by_the_sender_before_any_byte_is_written() -> None:
    left, right = socket.socketpair()
    sender, receiver = host_side(left, limit_bytes=1000), engine_side(right)
    try:
        with pytest.raises(MessageTooLarge) as refused:
            sender.send(Generate("r", prompt="x" * 2000))
        assert refused.value.limit_bytes == 1000
        assert refused.value.size_bytes > 2000
        assert sender.send(Ping(1))
        assert receiver.receive() == Ping(1)  # nothing of the refused one went out
    finally:
        sender.close()
        receiver.close()


def test_encode_frame_enforces_the_default_limit() -> None:
    with pytest.raises(MessageTooLarge):
        encode_frame(Generate("r", prompt="x" * MAX_MESSAGE_BYTES))


def test_a_frame_over_the_receivers_limit_is_skipped_whole_and_the_next_one_is_read() -> None:
    left, right = socket.socketpair()
    sender, receiver = host_side(left), engine_side(right, limit_bytes=1000)
    try:
        thread = _send_in_thread(sender, Generate("r", prompt="y" * 500_000))
        with pytest.raises(MalformedMessage):
            receiver.receive()
        thread.join()
        sender.send(Ping(2))
        assert receiver.receive() == Ping(2)
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"{not json",
        b"[1, 2, 3]",
        b"\xff\xfe",
        b"",
        b'{"op": "no_such_op"}',
        b'{"msg": "pong", "seq": 1}',
    ],
)
def test_an_unusable_frame_raises_malformed_and_the_channel_stays_in_step(
    pair: tuple[HostEnd, EngineEnd], payload: bytes
) -> None:
    a, b = pair
    a.send_frame(struct.pack(">I", len(payload)) + payload)
    a.send(Ping(3))
    with pytest.raises(MalformedMessage):
        b.receive()
    assert b.receive() == Ping(3)


def test_a_peer_that_ends_mid_frame_is_end_of_stream_not_a_torn_message() -> None:
    left, right = socket.socketpair()
    receiver = engine_side(right)
    frame = encode_frame(Generate("r", prompt="abc"))
    left.sendall(frame[: len(frame) - 2])
    left.close()
    try:
        assert receiver.receive() is None
    finally:
        receiver.close()


def test_frames_are_length_prefixed_json_objects() -> None:
    frame = encode_frame(Pong(1))
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4
    assert orjson.loads(frame[4:]) == {"msg": "pong", "seq": 1}


def test_a_value_json_cannot_carry_is_refused_before_any_byte_is_written(
    pair: tuple[HostEnd, EngineEnd],
) -> None:
    a, b = pair
    with pytest.raises(UnencodableMessage):
        a.send(Generate("r", prompt="hi", sampling=Sampling(seed=1 << 70)))
    a.send(Ping(4))
    assert b.receive() == Ping(4)


def test_send_many_writes_every_framable_message_in_order_and_counts_the_rest() -> None:
    left, right = socket.socketpair()
    sender, receiver = host_side(left, limit_bytes=1000), engine_side(right)
    try:
        batch: list[Command] = [Ping(1), Generate("big", prompt="x" * 2000), Ping(2), Ping(3)]
        assert sender.send_many(batch) == (True, 1)
        assert [receiver.receive() for _ in range(3)] == [Ping(1), Ping(2), Ping(3)]
        assert sender.send_many([]) == (True, 0)
    finally:
        sender.close()
        receiver.close()


def test_send_frame_now_writes_what_the_socket_takes_and_never_waits() -> None:
    left, right = socket.socketpair()
    sender, receiver = host_side(left), engine_side(right)
    try:
        frame = encode_frame(Ping(7))
        assert sender.send_frame_now(frame) == len(frame)
        assert receiver.receive() == Ping(7)
        big = encode_frame(Generate("big", prompt="x" * (4 << 20)))
        sent = sender.send_frame_now(big)  # nobody reads: the socket takes only its buffer
        assert sent is not None and 0 < sent < len(big)
        assert sender.send_frame_now(big[sent:]) == 0  # full: nothing more, and no wait
        receiver.close()  # the peer is gone
        assert sender.send_frame_now(frame) is None
    finally:
        sender.close()
