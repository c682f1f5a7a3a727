"""The direct stream (api/direct_stream.py): SSE chunks written to a real loopback TCP socket from
another thread, byte for byte as h11 frames them, a socket that takes a chunk only in part, a
client that went away, and the scope plumbing that finds uvicorn's transport."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import h11
import orjson

from skippyctl.api.direct_stream import (
    TRANSPORT_EXTENSION,
    SseSocketSink,
    expose_transport,
    sse_template,
    transport,
)

TEMPLATE = (b'data: {"choices":[{"text":', b',"finish_reason":null}]}\n\n')


def _event(text: str) -> bytes:
    return TEMPLATE[0] + orjson.dumps(text) + TEMPLATE[1]


def _h11_body(texts: list[str]) -> bytes:
    """What uvicorn's h11 writes for these SSE events in a streamed HTTP/1.1 response."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    conn.send(h11.Response(status_code=200, headers=[]))
    return b"".join(conn.send(h11.Data(data=_event(t))) or b"" for t in texts)


async def _connection(*, small_buffers: bool = False) -> tuple[asyncio.Transport, socket.socket]:
    """An asyncio transport (the server side a sink writes to) and the client's socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    if small_buffers:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if small_buffers:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    found, _ = await loop.create_connection(asyncio.Protocol, sock=sock)
    assert isinstance(found, asyncio.Transport)
    return found, peer


def _read_exactly(peer: socket.socket, size: int, timeout_s: float = 10.0) -> bytes:
    peer.settimeout(timeout_s)
    data = b""
    while len(data) < size:
        more = peer.recv(size - len(data))
        if not more:
            break
        data += more
    return data


@contextmanager
def _reading(peer: socket.socket, size: int) -> Iterator[list[bytes]]:
    """Read `size` bytes on a thread while the body runs (so the loop can drain its buffer)."""
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(_read_exactly(peer, size)))
    thread.start()
    try:
        yield got
    finally:
        thread.join(15)


def _writes_from_a_thread(sink: SseSocketSink, texts: list[str]) -> list[bool]:
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.extend(sink.write(t) for t in texts))
    thread.start()
    thread.join()
    return results


def test_chunks_are_framed_as_h11_frames_them() -> None:
    texts = ["Once", " upon", " a time,", ' "quoted"\n', "é ✓ 🚀", "\x00\x1f"]

    async def run() -> None:
        found, peer = await _connection()
        sink = SseSocketSink(found, asyncio.get_running_loop(), TEMPLATE)
        assert _writes_from_a_thread(sink, [*texts[:3], "", *texts[3:]]) == [True] * 7
        expected = _h11_body(texts)
        assert _read_exactly(peer, len(expected)) == expected
        assert sink.writes == len(texts)  # the empty text wrote nothing
        sink.close()
        found.close()
        peer.close()

    asyncio.run(run())


def test_a_chunk_the_socket_takes_in_part_is_finished_by_the_loop_before_later_chunks() -> None:
    # Each chunk is ~3 KB and the two buffers are 4 KiB: the socket fills within a few chunks.
    texts = [f"{i:04d}" + "x" * 3000 for i in range(400)]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        found, peer = await _connection(small_buffers=True)
        sink = SseSocketSink(found, loop, TEMPLATE)
        results = _writes_from_a_thread(sink, texts)
        taken = results.index(False)  # the first text the sink refused
        assert taken >= 1 and all(results[:taken]) and not any(results[taken:])
        # The ordinary path writes the rest through the transport, behind the sink's remainder.
        for text in texts[taken:]:
            loop.call_soon_threadsafe(found.write, _h11_body([text]))
        expected = _h11_body(texts)
        with _reading(peer, len(expected)) as got:
            for _ in range(2000):
                await asyncio.sleep(0.005)
                if not found.get_write_buffer_size():
                    break
        assert got == [expected]
        found.close()
        peer.close()

    asyncio.run(run())


def test_a_client_that_went_away_ends_the_sink_without_an_error() -> None:
    async def run() -> None:
        found, peer = await _connection()
        sink = SseSocketSink(found, asyncio.get_running_loop(), TEMPLATE)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # a reset, as a killed client's kernel sends
        await asyncio.sleep(0.05)
        results = _writes_from_a_thread(sink, ["a"] * 20)
        assert False in results  # it stopped taking text ...
        assert results.index(False) <= 2  # ... at once (the write that failed dropped its text)
        found.close()

    asyncio.run(run())


def test_the_template_is_the_streams_own_chunk_split_where_the_text_goes() -> None:
    def chunk(text: str) -> bytes:
        return b"data: " + orjson.dumps({"model": "m", "choices": [{"text": text}]}) + b"\n\n"

    template = sse_template(chunk)
    assert template is not None
    assert template[0] + orjson.dumps("hi") + template[1] == chunk("hi")

    def doubled(text: str) -> bytes:
        return orjson.dumps([text, text])

    assert sse_template(doubled) is None


def test_the_transport_reaches_the_scope_only_from_a_send_that_holds_one() -> None:
    class Cycle:
        def __init__(self, held: object) -> None:
            self.transport = held

        async def send(self, message: Any) -> None:
            return None

    async def run() -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            seen.append(scope)

        async def receive() -> Any:
            return {}

        loop = asyncio.get_running_loop()
        found, peer = await _connection()
        wrapped = expose_transport(app)
        http = {"type": "http", "http_version": "1.1", "method": "POST"}
        await wrapped(dict(http), receive, Cycle(found).send)
        await wrapped(dict(http), receive, Cycle("not a transport").send)
        await wrapped({**http, "http_version": "1.0"}, receive, Cycle(found).send)
        await wrapped({**http, "method": "HEAD"}, receive, Cycle(found).send)
        await wrapped({"type": "lifespan"}, receive, Cycle(found).send)
        assert loop.is_running()
        assert [transport(scope) for scope in seen[:4]] == [found, None, None, None]
        assert TRANSPORT_EXTENSION not in seen[4].get("extensions", {})
        found.close()
        peer.close()
        return seen

    asyncio.run(run())
