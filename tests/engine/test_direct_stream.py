"""The engine writing a streamed request's text to the client's connection itself (real llama.cpp,
tiny.gguf): a request sent with ``hold_text`` holds its text until the host says who writes the
stream; ``attach_stream`` writes the held text and then each token's chunk to a real socket,
``release_text`` sends it all to the host instead; a socket that takes a chunk only in part hands
the rest back as a ``framed`` ``GenText``; the engine lets go of the connection before ``GenDone``.

The client's end of a socketpair stands in for the HTTP client: the bytes on it must be exactly
the chunks the host would have written for the same text (``config/stream_wire.py``)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from skippyctl.config.stream_wire import SocketChunks, text_chunk
from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import PROMPT, EngineFactory, Harness, greedy

HEAD = b'data: {"choices":[{"text":'
TAIL = b',"finish_reason":null}]}\n\n'
BIG_HEAD = b'data: {"padding":"' + b"x" * 1000 + b'","choices":[{"text":'
"""A chunk of ~1 KB: a few hundred tokens are far more than a socket holds unread."""
TOKENS = 24


def _request(
    request_id: str, ban: tuple[tuple[int, float], ...], *, hold: bool, tokens: int = TOKENS
) -> GenerateRequest:
    return GenerateRequest(
        request_id, prompt=PROMPT, max_tokens=tokens, sampling=greedy(ban), hold_text=hold
    )


def _pieces(h: Harness, request_id: str) -> list[str]:
    return [m["text"] for m in h.recorder.of(request_id, "gen_text")]


def _chunks(pieces: list[str], head: bytes = HEAD) -> bytes:
    return b"".join(text_chunk(head, TAIL, p) for p in pieces if p)


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the engine's end, the client's end) of a connection; the engine's end non-blocking,
    as asyncio leaves a client's socket."""
    engine_end, client_end = socket.socketpair()
    engine_end.setblocking(False)
    yield engine_end, client_end
    engine_end.close()
    client_end.close()


def _hand(engine_end: socket.socket, head: bytes = HEAD) -> SocketChunks:
    """The engine's own descriptor of the connection (the test's is closed, so the client sees
    the end of the stream when the engine lets go)."""
    chunks = SocketChunks(os.dup(engine_end.fileno()), head, TAIL)
    engine_end.close()
    return chunks


def _read_all(client_end: socket.socket) -> bytes:
    client_end.settimeout(10)
    data = b""
    while more := client_end.recv(65536):
        data += more
    return data


def _reference(h: Harness, ban: tuple[tuple[int, float], ...], tokens: int = TOKENS) -> list[str]:
    """The request's text pieces as the host receives them without a hold."""
    h.engine.submit(_request("reference", ban, hold=False, tokens=tokens))
    h.recorder.wait_done(1)
    return _pieces(h, "reference")


class _Paced:
    """llama_cpp with every llama_decode 20 ms longer: the held request is still decoding when
    the test attaches its connection, however busy the machine (else a request that ends
    first sends its held text to the host, as it must). Everything else is llama.cpp."""

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, context: Any, batch: Any) -> int:
        time.sleep(0.02)
        return int(llama_cpp.llama_decode(context, batch))


def test_the_engine_writes_the_held_text_then_each_token_to_the_connection(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    connection: tuple[socket.socket, socket.socket],
) -> None:
    engine_end, client_end = connection
    h = make_engine(llama=_Paced())
    expected = _reference(h, eog_ban)
    h.engine.submit(_request("r", eog_ban, hold=True))
    # The first token's text is held (the first-token observation comes after it).
    h.recorder.wait_for(lambda m: m["msg"] == "gen_first_token" and m["request_id"] == "r")
    h.engine.attach_stream("r", _hand(engine_end))
    done = h.recorder.wait_done(2)
    assert done[-1]["outcome"] == "completed"
    assert done[-1]["figures"]["generated_tokens"] == TOKENS
    assert h.recorder.of("r", "gen_text") == []  # nothing of it went to the host
    # Every chunk, in order, then the end of the stream: the engine let go before gen_done.
    assert _read_all(client_end) == _chunks(expected)


def test_released_text_goes_to_the_host_held_text_first(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine()
    expected = _reference(h, eog_ban)
    h.engine.submit(_request("r", eog_ban, hold=True))
    h.recorder.wait_for(lambda m: m["msg"] == "gen_first_token" and m["request_id"] == "r")
    h.engine.release_text("r")
    h.recorder.wait_done(2)
    pieces = _pieces(h, "r")
    assert "".join(pieces) == "".join(expected)
    assert len(pieces) <= len(expected)  # the held pieces went as one
    assert all("framed" not in m for m in h.recorder.of("r", "gen_text"))


def test_text_never_claimed_goes_to_the_host_before_gen_done(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine()
    expected = _reference(h, eog_ban)
    h.engine.submit(_request("r", eog_ban, hold=True))
    h.recorder.wait_done(2)
    ours = [m for m in h.recorder.messages if m.get("request_id") == "r"]
    kinds = [m["msg"] for m in ours]
    assert kinds.index("gen_text") < kinds.index("gen_done")
    assert "".join(_pieces(h, "r")) == "".join(expected)


def test_a_request_that_does_not_hold_its_text_refuses_the_connection(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    connection: tuple[socket.socket, socket.socket],
) -> None:
    engine_end, client_end = connection
    h = make_engine()
    h.engine.submit(_request("r", eog_ban, hold=False))
    h.recorder.wait_for(lambda m: m["msg"] == "gen_text" and m["request_id"] == "r")
    h.engine.attach_stream("r", _hand(engine_end))
    h.recorder.wait_done(1)
    assert _read_all(client_end) == b""  # closed unwritten
    assert len("".join(_pieces(h, "r"))) > 0


def test_a_connection_for_an_unknown_request_is_closed(
    make_engine: EngineFactory, connection: tuple[socket.socket, socket.socket]
) -> None:
    engine_end, client_end = connection
    h = make_engine()
    h.engine.attach_stream("nobody", _hand(engine_end))
    assert _read_all(client_end) == b""


def test_a_socket_that_takes_a_chunk_in_part_hands_the_rest_back_to_the_host(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    tokens = 300
    engine_end, client_end = socket.socketpair()
    for sock in (engine_end, client_end):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    engine_end.setblocking(False)
    try:
        h = make_engine()
        expected = _reference(h, eog_ban, tokens)
        assert len(_chunks(expected, BIG_HEAD)) > 256 * 1024  # far more than a socket holds
        h.engine.submit(_request("r", eog_ban, hold=True, tokens=tokens))
        h.engine.attach_stream("r", _hand(engine_end, BIG_HEAD))
        h.recorder.wait_done(2)  # nobody reads meanwhile
        texts = h.recorder.of("r", "gen_text")
        framed = [i for i, m in enumerate(texts) if m.get("framed")]
        assert len(framed) == 1  # the connection went back to the host once ...
        rest = texts[framed[0]]["text"].encode("latin-1")
        later = [m["text"] for m in texts[framed[0] + 1 :]]
        # ... and the wire holds every chunk once, in order: what the engine wrote, the rest of
        # the chunk it could not finish, then what the host writes.
        wire = _read_all(client_end) + rest + _chunks(later, BIG_HEAD)
        assert wire == _chunks(expected, BIG_HEAD)
    finally:
        client_end.close()
