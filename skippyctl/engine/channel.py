"""The engine control channel: length-prefixed frames of typed messages over a socketpair.

It carries commands (host → engine) and authoritative return values (engine → host), as the
types of :mod:`skippyctl.engine.protocol`. It never carries native facts (those go through the
shared-memory ring) and never prompt text in events. Paths travel here because the engine must
open the file; they never leave the host process.

Framing: a 4-byte big-endian payload length, then that many bytes of one JSON object (the
payload :func:`~skippyctl.engine.protocol.encode` makes). Invariants:

- A frame is never torn. The size limit (`MAX_MESSAGE_BYTES`) is enforced on the SENDING side
  before a single byte is written (:class:`MessageTooLarge`; :class:`UnencodableMessage` for a
  value JSON cannot carry), so the sender can refuse the one request it belongs to and the
  channel stays in step.
- A receiver that nevertheless gets a frame it cannot use — announced larger than its limit, not
  JSON, not an object, not a message of its direction — consumes the whole frame and raises
  :class:`MalformedMessage`; the next `receive` reads the next frame. Nothing a peer sends ends
  the channel except end of stream.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Final, Generic, TypeVar

from skippyctl.engine.protocol import (
    MalformedMessage,
    Message,
    UnencodableMessage,
    decode_command,
    decode_engine_message,
    encode,
)
from skippyctl.engine.protocol_commands import Command
from skippyctl.engine.protocol_messages import EngineMessage

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ControlChannel",
    "MalformedMessage",
    "MessageTooLarge",
    "UnencodableMessage",
    "encode_frame",
    "engine_side",
    "frame",
    "host_side",
]

MAX_MESSAGE_BYTES: Final = 64 << 20
"""Largest JSON payload of one frame (64 MiB). Far above any prompt a context can hold (a token
covers at least one byte of text and llama.cpp contexts are well under 64 Mi tokens), so a
refused frame is always a request that could not have fitted anyway."""
_HEADER: Final = struct.Struct(">I")
_DISCARD_CHUNK_BYTES: Final = 1 << 20

SendT = TypeVar("SendT", bound=Message)
ReceiveT = TypeVar("ReceiveT", bound=Message)


class MessageTooLarge(ValueError):
    """A message over the frame limit; raised before anything was written."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"control message of {size_bytes} bytes exceeds {limit_bytes} bytes")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


def frame(payload: bytes, limit_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """The complete frame for an encoded payload; :class:`MessageTooLarge` over `limit_bytes`."""
    if len(payload) > limit_bytes:
        raise MessageTooLarge(len(payload), limit_bytes)
    return _HEADER.pack(len(payload)) + payload


def encode_frame(message: Message, limit_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """The complete frame for `message`; :class:`MessageTooLarge` over `limit_bytes`,
    :class:`UnencodableMessage` for a value JSON cannot carry."""
    return frame(encode(message), limit_bytes)


class ControlChannel(Generic[SendT, ReceiveT]):
    """Framed messages over a connected stream socket; `send` is thread-safe, `receive` is for
    one reader thread. Each side sends one union and receives the other (:func:`host_side`,
    :func:`engine_side`)."""

    def __init__(
        self,
        sock: socket.socket,
        decode: Callable[[bytes], ReceiveT],
        limit_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._decode = decode
        self._send_lock = threading.Lock()
        self.limit_bytes = limit_bytes

    def send(self, message: SendT) -> bool:
        """Send one message; False if the peer is gone. Raises :class:`MessageTooLarge` or
        :class:`UnencodableMessage` (nothing sent) for a message that cannot be framed."""
        return self.send_frame(encode_frame(message, self.limit_bytes))

    def send_many(self, messages: Sequence[SendT]) -> tuple[bool, int]:
        """Send `messages` in order with one write: (False if the peer is gone, how many could
        not be framed — each skipped alone, the others sent)."""
        frames: list[bytes] = []
        unframable = 0
        for message in messages:
            try:
                frames.append(encode_frame(message, self.limit_bytes))
            except (MessageTooLarge, UnencodableMessage):
                unframable += 1
        if not frames:
            return True, unframable
        return self.send_frame(b"".join(frames)), unframable

    def send_frame(self, frame: bytes) -> bool:
        """Send a frame made by :func:`encode_frame`; False if the peer is gone."""
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except OSError:
                return False
        return True

    def send_frame_now(self, frame: bytes) -> int | None:
        """Write what of `frame` the socket takes at once, never waiting (not even for another
        sender): how many bytes went out — 0 if none could —, or None if the peer is gone. The
        caller sends the rest, before anything else, with :meth:`send_frame`."""
        if not self._send_lock.acquire(blocking=False):
            return 0
        try:
            return self._sock.send(frame, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        except OSError:
            return None
        finally:
            self._send_lock.release()

    def receive(self) -> ReceiveT | None:
        """The next message, or None at end of stream (the peer exited or closed).

        Raises :class:`MalformedMessage` for an unusable frame, after consuming all of it."""
        payload = self.receive_payload()
        return None if payload is None else self._decode(payload)

    def receive_payload(self) -> bytes | None:
        """The next frame's payload undecoded, or None at end of stream. Raises
        :class:`MalformedMessage` for a frame over the limit, after consuming all of it."""
        try:
            header = self._reader.read(_HEADER.size)
            if header is None or len(header) < _HEADER.size:
                return None
            (size,) = _HEADER.unpack(header)
            oversize = size > self.limit_bytes
            payload = None if oversize else self._reader.read(size)
            if oversize and not self._discard(size):
                return None
        except (OSError, ValueError):  # ValueError: read on a reader closed by `close`
            return None
        if oversize:
            raise MalformedMessage(f"frame of {size} bytes exceeds {self.limit_bytes} bytes")
        if payload is None or len(payload) < size:
            return None  # the peer ended mid-frame: nothing more will come
        return payload

    def _discard(self, size: int) -> bool:
        """Skip `size` bytes of payload; False at end of stream."""
        remaining = size
        while remaining > 0:
            chunk = self._reader.read(min(remaining, _DISCARD_CHUNK_BYTES))
            if not chunk:
                return False
            remaining -= len(chunk)
        return True

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._sock.close()


def host_side(
    sock: socket.socket, limit_bytes: int = MAX_MESSAGE_BYTES
) -> ControlChannel[Command, EngineMessage]:
    """The host's end: sends commands, receives engine messages."""
    return ControlChannel(sock, decode_engine_message, limit_bytes)


def engine_side(
    sock: socket.socket, limit_bytes: int = MAX_MESSAGE_BYTES
) -> ControlChannel[EngineMessage, Command]:
    """The engine's end: sends engine messages, receives commands."""
    return ControlChannel(sock, decode_command, limit_bytes)
