"""The bytes of one streamed text chunk on a client's HTTP/1.1 connection, and their writer.

A plain text stream's chunk is an SSE event whose JSON holds the text in exactly one place: the
API makes the event around it (a *template*: the bytes before and after the text's JSON string,
taken from its own formatter) and whoever writes the chunk to the socket — the host's engine
reader (``api/direct_stream.py``), or the engine's decode thread (``engine/direct_stream.py``) —
fills it in and frames it as HTTP/1.1 chunked transfer coding, the way h11 frames the body chunks
it writes. Here, below both, since both write it.
"""

from __future__ import annotations

import os

import orjson

__all__ = ["SocketChunks", "text_chunk"]


def text_chunk(head: bytes, tail: bytes, text: str) -> bytes:
    """One HTTP/1.1 body chunk holding the SSE event `head` + `text` as a JSON string + `tail`
    (the same bytes the API's formatter makes for `text`, framed as h11 frames them)."""
    event = head + orjson.dumps(text) + tail
    return b"%x\r\n%b\r\n" % (len(event), event)


class SocketChunks:
    """Text chunks written to a client's socket through a descriptor this writer owns, never
    waiting: the socket is non-blocking (asyncio made it so, and the flag belongs to the
    socket, not to a descriptor of it)."""

    __slots__ = ("_fd", "_head", "_tail", "writes")

    def __init__(self, fd: int, head: bytes, tail: bytes) -> None:
        self._fd: int | None = fd
        self._head = head
        self._tail = tail
        self.writes = 0
        """Writes made (whole or in part; one per :meth:`write` or :meth:`write_all`)."""

    @property
    def closed(self) -> bool:
        return self._fd is None

    def write(self, text: str) -> bytes | None:
        """Write `text`'s chunk. None when the socket took all of it; otherwise the writer is
        closed and this is what the socket did not take, for the owner of the connection to
        write before anything else (empty when the client is gone: nothing more is wanted)."""
        return self._write(text_chunk(self._head, self._tail, text))

    def write_all(self, texts: list[str]) -> bytes | None:
        """Write a chunk per non-empty text, in one write; the same answer as :meth:`write`."""
        chunks = [text_chunk(self._head, self._tail, text) for text in texts if text]
        return self._write(b"".join(chunks)) if chunks else None

    def _write(self, chunk: bytes) -> bytes | None:
        fd = self._fd
        if fd is None:
            return b""
        try:
            sent = os.write(fd, chunk)
        except BlockingIOError:
            sent = 0
        except OSError:  # the client is gone: its connection's owner sees the hang-up
            self.close()
            return b""
        self.writes += 1
        if sent == len(chunk):
            return None
        self.close()
        return chunk[sent:]

    def close(self) -> None:
        """Release the descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
