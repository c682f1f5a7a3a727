"""Streamed text written to the client's socket by the thread that receives it from the engine.

Why: on this 2-core machine both cores decode, so every microsecond the host spends per streamed
token delays the next token (docs/BENCHMARKS.md section 5). Through the ordinary path a token
crosses threads (the engine reader wakes the event loop), then a queue, the response generator,
Starlette's and uvicorn's send wrappers and h11 before it reaches the socket. For a plain text
stream all of that adds nothing: once the response's headers (and a chat's role chunk) are on
the wire, the engine reader formats each chunk — the same bytes the generator would have
yielded, in HTTP/1.1 chunked framing as h11 writes it — and writes it to the socket itself,
never blocking.

Ordering is what makes it safe: the sink is attached only while the transport's buffer is empty
and no chunk is in flight to the generator (:meth:`~skippyctl.runtime.requests.RequestHandle.
attach_sink`), and the generator writes nothing while it is attached. A write the socket takes
only in part hands the rest to the event loop (`transport.write`, in order) and ends the sink;
later chunks take the ordinary path behind it. The terminal always takes the ordinary path, after
the sink was closed. The sink writes through its own duplicate of the socket, so the descriptor
cannot be reused for another connection while a write is in flight.

Only HTTP/1.1 streams of plain text are served so (no log-probabilities, no tool-call reading),
and only under uvicorn, whose transport :func:`expose_transport` puts in the request's scope.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["TRANSPORT_EXTENSION", "SseSocketSink", "expose_transport", "sse_template", "transport"]

TRANSPORT_EXTENSION: Final = "skippyctl.transport"
_SENTINEL: Final = "\x00skippy-direct-text\x00"
_SENTINEL_JSON: Final = orjson.dumps(_SENTINEL)


def expose_transport(app: ASGIApp) -> ASGIApp:
    """`app` with uvicorn's transport for the request in ``scope["extensions"]``: uvicorn's h11
    protocol calls the app with its request cycle's bound ``send``, which holds the transport."""

    async def with_transport(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = getattr(getattr(send, "__self__", None), "transport", None)
            if isinstance(found, asyncio.Transport):
                scope.setdefault("extensions", {})[TRANSPORT_EXTENSION] = found
        await app(scope, receive, send)

    return with_transport


def transport(scope: Scope) -> asyncio.Transport | None:
    """The transport a direct stream may write to: uvicorn's, for an HTTP/1.1 request (whose
    streamed body h11 frames in chunks)."""
    if scope.get("http_version") != "1.1" or scope.get("method") == "HEAD":
        return None
    found = (scope.get("extensions") or {}).get(TRANSPORT_EXTENSION)
    return found if isinstance(found, asyncio.Transport) else None


def sse_template(make_chunk: Callable[[str], bytes]) -> tuple[bytes, bytes] | None:
    """The SSE event around a chunk's text, split where the text goes: `make_chunk(text)` is the
    stream's own formatter (so both paths write the same bytes). None if the text's place
    cannot be found exactly once."""
    parts = make_chunk(_SENTINEL).split(_SENTINEL_JSON)
    if len(parts) != 2:
        return None
    return parts[0], parts[1]


class SseSocketSink:
    """A :class:`~skippyctl.runtime.requests.TextSink` writing SSE chunks to a client socket."""

    __slots__ = ("_fd", "_head", "_loop", "_tail", "_transport", "writes")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        template: tuple[bytes, bytes],
    ) -> None:
        sock = transport.get_extra_info("socket")
        self._fd: int | None = os.dup(sock.fileno())
        self._transport = transport
        self._loop = loop
        self._head, self._tail = template
        self.writes = 0
        """Chunks written to the socket directly (for tests and benchmarks)."""

    def write(self, text: str) -> bool:
        fd = self._fd
        if fd is None:
            return False
        if not text:
            return True
        event = self._head + orjson.dumps(text) + self._tail
        framed = b"%x\r\n%b\r\n" % (len(event), event)
        try:
            sent = os.write(fd, framed)  # the socket is non-blocking (asyncio's)
        except BlockingIOError:
            sent = 0
        except OSError:  # the client is gone; the route sees the disconnect and cancels
            self.close()
            return True
        self.writes += 1
        if sent < len(framed):
            self.close()
            self._loop.call_soon_threadsafe(self._write_rest, framed[sent:])
        return True

    def _write_rest(self, rest: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(rest)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
