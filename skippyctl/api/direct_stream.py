"""Streamed text written to the client's socket by the engine itself, or by the host thread that
receives it from the engine.

Why: on this 2-core machine both cores decode, so every microsecond spent per streamed token
delays the next token (docs/BENCHMARKS.md section 5). Through the ordinary path a token crosses
the control channel (the engine's send wakes the host's engine reader, which takes the decode
thread's core), then threads (the reader wakes the event loop), a queue, the response generator,
Starlette's and uvicorn's send wrappers and h11 before it reaches the socket. For a plain text
stream all of that adds nothing: once the response's headers (and a chat's role chunk) are on
the wire, each chunk is formatted as the generator would have yielded it — the same bytes, in
HTTP/1.1 chunked framing as h11 writes it (``config/stream_wire.py``) — and written to the
socket, never blocking, by:

- the engine's decode thread, as it samples the token: the connection is handed to the engine
  (:func:`stream_offer`, ``ModelServer.offer_stream``, the ``AttachStream`` command), which takes
  it only if no text of the request is in flight to the host. The engine hands back what the
  socket did not take (a ``GenText`` marked ``framed``) and lets go of the connection before
  its ``GenDone``; the host writes the stream's end after that;
- otherwise (an engine that cannot take it), the host's engine reader (:class:`SseSocketSink`).

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

from skippyctl.config.stream_wire import SocketChunks
from skippyctl.runtime.requests import StreamOffer

__all__ = [
    "TRANSPORT_EXTENSION",
    "SseSocketSink",
    "expose_transport",
    "sse_template",
    "stream_offer",
    "transport",
]

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
    if not isinstance(found, asyncio.Transport) or found.get_extra_info("sslcontext") is not None:
        return None  # bytes written to a TLS connection's socket would bypass the encryption
    return found


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

    __slots__ = ("_chunks", "_loop", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        template: tuple[bytes, bytes],
    ) -> None:
        sock = transport.get_extra_info("socket")
        self._chunks = SocketChunks(os.dup(sock.fileno()), *template)
        self._transport = transport
        self._loop = loop

    @property
    def writes(self) -> int:
        """Chunks written to the socket directly (for tests and benchmarks)."""
        return self._chunks.writes

    def write(self, text: str) -> bool:
        if self._chunks.closed:
            return False
        if not text:
            return True
        rest = self._chunks.write(text)
        if rest:
            self._loop.call_soon_threadsafe(self._write_rest, rest)
        return True

    def _write_rest(self, rest: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(rest)

    def close(self) -> None:
        self._chunks.close()


def stream_offer(transport: asyncio.Transport, template: tuple[bytes, bytes]) -> StreamOffer:
    """The connection of `transport`, for its request's engine to write the text to itself: a
    descriptor of its own of the socket, the SSE template, and the writer of what the engine's
    socket did not take (on the loop, in order with the transport's other writes)."""

    def write_rest(rest: bytes) -> None:
        if not transport.is_closing():
            transport.write(rest)

    sock = transport.get_extra_info("socket")
    return StreamOffer(os.dup(sock.fileno()), *template, write_rest)
