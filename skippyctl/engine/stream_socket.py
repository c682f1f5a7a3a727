"""The stream socket: client connections the host hands to its engine, beside the control channel.

When the engine is to write a request's streamed text to the client itself (``AttachStream``),
the connection's descriptor cannot travel in a control frame: the channel's reader is buffered,
and a buffered read drops descriptors passed with the bytes. So each one travels alone, on a
``SOCK_SEQPACKET`` socketpair: one message per ``AttachStream`` command, sent just before the
command, whose payload is the request id and whose ancillary data (``SCM_RIGHTS``) is the
descriptor. The engine's serve loop takes it when it reads that command. Message boundaries are
kept, so a message is never read in part; one whose command never came (the host could not send
it) is closed by the next :meth:`StreamSocket.take`, which skips what does not match.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Final

__all__ = ["StreamSocket", "stream_socket_pair"]

TAKE_TIMEOUT_S: Final = 0.5
"""The most :meth:`StreamSocket.take` waits: the host sends the descriptor before the command,
so it is there already unless the host broke the order (a bug; the attach is then refused)."""
_MAX_ID_BYTES: Final = 256


def stream_socket_pair() -> tuple[socket.socket, socket.socket]:
    """The host's end and the engine's end."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class StreamSocket:
    """One end of the stream socket: the host gives, the engine takes. Thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def give(self, request_id: str, fd: int) -> bool:
        """Pass `fd` (the caller keeps its own) for `request_id`, never waiting; False if it
        could not go (the engine is gone or is not reading)."""
        with self._lock:
            try:
                socket.send_fds(self._sock, [request_id.encode()], [fd], socket.MSG_DONTWAIT)
            except OSError:
                return False
        return True

    def take(self, request_id: str) -> int | None:
        """The descriptor given for `request_id` (the caller owns it), skipping and closing any
        given before it whose command never came; None if it is not there."""
        wanted = request_id.encode()
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        with self._lock:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._sock.settimeout(remaining)
                try:
                    data, fds, _flags, _address = socket.recv_fds(self._sock, _MAX_ID_BYTES, 1)
                except OSError:  # TimeoutError included
                    return None
                if not data and not fds:
                    return None  # the host closed its end
                if data == wanted and len(fds) == 1:
                    return fds[0]
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def close(self) -> None:
        self._sock.close()
