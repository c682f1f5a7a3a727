"""The sidecar and its wire: activation comes first (another first frame is a load failure); a
malformed frame is counted and answered with a fault, never fatal; the next good frame is
served; end of stream ends the sidecar cleanly."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.plugins.api import ActivationContext
from skippyctl.plugins.link import activation_frame
from skippyctl.plugins.wire import (
    AnswerStatus,
    Fault,
    Frame,
    Malformed,
    Msg,
    decode,
    encode,
    read_frame,
)
from tests.plugins.conftest import Built

CONTEXT = ActivationContext("tiny", 1000, 256, 2, "plugin", 8.0, "k=v")


def _spawn(spec: str, env: dict[str, str]) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippyctl.plugins.sidecar", "--fd", str(theirs.fileno())]
        + ["--", spec],
        pass_fds=[theirs.fileno()],
        env=env,
    )
    theirs.close()
    return ours, proc


@pytest.fixture
def sidecar(built: Built, plugin_env: dict[str, str]) -> Iterator[socket.socket]:
    ours, proc = _spawn(str(built.ngram), plugin_env)
    try:
        ours.sendall(activation_frame(CONTEXT))
        ready = read_frame(ours)
        assert ready.kind is Msg.READY and ready.text == "ngram"
        yield ours
        ours.shutdown(socket.SHUT_WR)
        assert proc.wait(timeout=60) == 0  # end of stream: a clean exit
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _query(sock: socket.socket, qid: int, request: int, start: int, pending: list[int]) -> Frame:
    deadline = time.monotonic_ns() + 60 * 10**9
    sock.sendall(encode(Msg.QUERY, qid, request, 4, deadline, start, tokens=pending))
    return read_frame(sock)


def test_malformed_frames_are_counted_not_fatal(sidecar: socket.socket) -> None:
    sidecar.sendall(encode(Msg.BEGIN, 1, 0, 0, 0, tokens=[5, 6, 7, 5, 6]))
    odd_tokens = bytes((Msg.COMMIT,)) + struct.pack("<QQ", 1, 0) + b"\x01\x02\x03"
    garbage = [
        struct.pack("<I", 0),  # empty body
        struct.pack("<IB", 1, 250),  # unknown type
        struct.pack("<IBI", 5, Msg.COMMIT, 1),  # short header
        struct.pack("<I", len(odd_tokens)) + odd_tokens,  # a token part of 3 bytes
        encode(Msg.READY, 1, text="wrong direction"),  # a sidecar → engine type
        activation_frame(CONTEXT),  # activation again: only the first frame activates
        encode(Msg.OUTCOME, 1, 1, 0, 1, 99, 0),  # an outcome kind nobody knows
        encode(Msg.OUTCOME, 1, 1, 0, 1, 4, 99),  # a discard reason nobody knows
    ]
    for frame in garbage:
        sidecar.sendall(frame)
        fault = read_frame(sidecar)
        assert (fault.kind, fault.fields) == (Msg.FAULT, (0, Fault.MALFORMED))
    # still serving, and the stream of request 1 is untouched by the garbage
    answer = _query(sidecar, 9, 1, 0, [7])
    assert answer.kind is Msg.ANSWER
    assert answer.fields == (9, AnswerStatus.OK)
    assert answer.tokens.tolist() == [5, 6, 7, 5]


def test_a_run_out_of_place_is_refused_as_a_stream_gap(sidecar: socket.socket) -> None:
    sidecar.sendall(encode(Msg.BEGIN, 1, 0, 0, 0, tokens=[1, 2]))
    sidecar.sendall(encode(Msg.COMMIT, 1, 5, tokens=[3]))  # expected start 0
    fault = read_frame(sidecar)
    assert fault.fields == (Msg.COMMIT, Fault.STREAM_GAP)
    answer = _query(sidecar, 2, 77, 0, [])  # a request never begun
    assert answer.fields == (2, AnswerStatus.STREAM_GAP)
    answer = _query(sidecar, 3, 1, 0, [1, 2])  # the right start: served
    assert answer.fields == (3, AnswerStatus.OK)


def test_an_expired_query_applies_its_pending_run_without_asking(sidecar: socket.socket) -> None:
    sidecar.sendall(encode(Msg.BEGIN, 1, 0, 0, 0, tokens=[1, 2, 3]))
    sidecar.sendall(encode(Msg.QUERY, 4, 1, 4, 0, 0, tokens=[1, 2]))  # deadline long past
    assert read_frame(sidecar).fields == (4, AnswerStatus.EXPIRED)
    # the pending run was applied: the next run starts at 2
    answer = _query(sidecar, 5, 1, 2, [])
    assert answer.fields == (5, AnswerStatus.OK)
    assert answer.tokens.tolist() == [3, 1, 2, 3]


@given(st.binary(max_size=200))
def test_decode_accepts_or_refuses_any_bytes(body: bytes) -> None:
    try:
        frame = decode(body)
    except Malformed:
        return
    assert isinstance(frame.kind, Msg)


@given(
    st.sampled_from([Msg.COMMIT, Msg.BEGIN]),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50),
)
def test_token_frames_round_trip(kind: Msg, tokens: list[int]) -> None:
    fields = (3, 4) if kind is Msg.COMMIT else (3, 4, 1, 2)
    frame = encode(kind, *fields, tokens=tokens)
    (size,) = struct.unpack_from("<I", frame)
    assert size == len(frame) - 4
    decoded = decode(frame[4:])
    assert decoded.fields == fields
    assert decoded.tokens.tolist() == tokens


@pytest.mark.parametrize(
    ("config", "first", "expected"),
    [
        ("k=v", "activate", (Msg.READY, "ngram")),
        ("refuse", "activate", (Msg.LOAD_FAILED, "activate_failed")),  # the plugin refuses it
        ("k=v", "begin", (Msg.LOAD_FAILED, "protocol_error")),  # not activated first
    ],
)
def test_activation_comes_first_and_a_refused_one_is_a_load_failure(
    built: Built, plugin_env: dict[str, str], config: str, first: str, expected: tuple[Msg, str]
) -> None:
    ours, proc = _spawn(str(built.ngram), plugin_env)
    try:
        if first == "activate":
            context = ActivationContext("tiny", 1000, 256, 2, "plugin", 8.0, config)
            ours.sendall(activation_frame(context))
        else:
            ours.sendall(encode(Msg.BEGIN, 1, 0, 0, 0, tokens=[1]))
        frame = read_frame(ours)
        assert (frame.kind, frame.text) == expected
        ours.shutdown(socket.SHUT_WR)
        assert proc.wait(timeout=60) == (0 if expected[0] is Msg.READY else 2)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
