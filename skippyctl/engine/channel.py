"""The engine control channel: length-prefixed JSON frames over a socketpair.

It carries commands (host → engine) and authoritative return values (engine → host). It never
carries native facts (those go through the shared-memory ring) and never prompt text in events.
Paths travel here because the engine must open the file; they never leave the host process.

Framing: a 4-byte big-endian payload length, then that many bytes of one JSON object (orjson).
Invariants:

- A frame is never torn. The size limit (`MAX_MESSAGE_BYTES`) is enforced on the SENDING side
  before a single byte is written (:class:`MessageTooLarge`; :class:`UnencodableMessage` for a
  value JSON cannot carry), so the sender can refuse the one request it belongs to and the
  channel stays in step.
- A receiver that nevertheless gets a frame it cannot use — announced larger than its limit, not
  JSON, not an object — consumes the whole frame and raises :class:`MalformedMessage`; the next
  `receive` reads the next frame. Nothing a peer sends ends the channel except end of stream.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Final

import orjson

MAX_MESSAGE_BYTES: Final = 64 << 20
"""Largest JSON payload of one frame (64 MiB). Far above any prompt a context can hold (a token
covers at least one byte of text and llama.cpp contexts are well under 64 Mi tokens), so a
refused frame is always a request that could not have fitted anyway."""
_HEADER: Final = struct.Struct(">I")
_DISCARD_CHUNK_BYTES: Final = 1 << 20

Message = dict[str, Any]


class MessageTooLarge(ValueError):
    """A message over the frame limit; raised before anything was written."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"control message of {size_bytes} bytes exceeds {limit_bytes} bytes")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class UnencodableMessage(ValueError):
    """A message JSON cannot carry (e.g. an integer beyond 64 bits); nothing was written."""


class MalformedMessage(ValueError):
    """A whole frame was received but is unusable (oversize, not JSON, not an object).

    The frame was consumed: the channel is still in step and the next frame can be read."""


def encode_frame(message: Message, limit_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """The complete frame for `message`; :class:`MessageTooLarge` over `limit_bytes`,
    :class:`UnencodableMessage` for a value orjson cannot encode."""
    try:
        payload = orjson.dumps(message)
    except orjson.JSONEncodeError as error:
        raise UnencodableMessage(str(error)) from error
    if len(payload) > limit_bytes:
        raise MessageTooLarge(len(payload), limit_bytes)
    return _HEADER.pack(len(payload)) + payload


class ControlChannel:
    """Framed JSON over a connected stream socket; `send` is thread-safe, `receive` is for one
    reader thread."""

    def __init__(self, sock: socket.socket, limit_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self.limit_bytes = limit_bytes

    def send(self, message: Message) -> bool:
        """Send one message; False if the peer is gone. Raises :class:`MessageTooLarge` or
        :class:`UnencodableMessage` (nothing sent) for a message that cannot be framed."""
        return self.send_frame(encode_frame(message, self.limit_bytes))

    def send_frame(self, frame: bytes) -> bool:
        """Send a frame made by :func:`encode_frame`; False if the peer is gone."""
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except OSError:
                return False
        return True

    def receive(self) -> Message | None:
        """The next message, or None at end of stream (the peer exited or closed).

        Raises :class:`MalformedMessage` for an unusable frame, after consuming all of it."""
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
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError as error:
            raise MalformedMessage("control frame is not JSON") from error
        if not isinstance(value, dict):
            raise MalformedMessage("control message is not an object")
        return value

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
