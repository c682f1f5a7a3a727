"""The engine control channel: one JSON object per line over a socketpair.

It carries commands (host → engine) and authoritative return values (engine → host). It never
carries native facts (those go through the shared-memory ring) and never prompt text in events.
Paths travel here because the engine must open the file; they never leave the host process.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Final

import orjson

MAX_MESSAGE_BYTES: Final = 1 << 20

Message = dict[str, Any]


class ControlChannel:
    """Line-framed JSON over a connected stream socket; `send` is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, message: Message) -> bool:
        data = orjson.dumps(message) + b"\n"
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError:
                return False
        return True

    def receive(self) -> Message | None:
        """The next message, or None at end of stream (the peer exited or closed)."""
        try:
            line = self._reader.readline(MAX_MESSAGE_BYTES)
        except OSError:
            return None
        if not line:
            return None
        value = orjson.loads(line)
        if not isinstance(value, dict):
            raise ValueError("control message is not an object")
        return value

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._sock.close()
