"""The engine ↔ plugin sidecar wire: length-prefixed binary frames over a stream socket.

Frame: ``<I`` body length (little-endian u32), then the body: one type byte, a fixed header
(``struct`` formats below, little-endian, no padding), then — for the types that carry tokens —
the token ids as a packed little-endian int32 array filling the rest of the body. No JSON: a
commit of n tokens costs 4·n bytes and one ``array.frombytes``.

Engine → sidecar: ACTIVATE (first, once per sidecar process), BEGIN, COMMIT, QUERY, OUTCOME,
FINISH, ABORT (the C ABI's callbacks).
Sidecar → engine: READY (loaded), LOAD_FAILED (a reason word), ANSWER (a query's status and
tokens), FAULT (a callback failed: which one and a reason code).

Robustness: a reader never trusts a frame. A body over :data:`MAX_FRAME_BYTES` is consumed and
skipped; a body whose type is unknown, whose header is short or whose token part is not a
multiple of 4 raises :class:`Malformed` AFTER the whole frame was consumed, so the next read
starts at the next frame. Only end of stream ends a reader (:class:`EOFError`).
"""

from __future__ import annotations

import socket
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from skippyctl.events.figures import FIGURES, GenerationFigures

MAX_FRAME_BYTES: Final = 64 << 20
"""Largest body a reader accepts (64 MiB: 16 Mi tokens, far above any context)."""
_LEN: Final = struct.Struct("<I")
_DISCARD_CHUNK_BYTES: Final = 1 << 20
_LITTLE: Final = sys.byteorder == "little"


class Msg(IntEnum):
    BEGIN = 1
    COMMIT = 2
    QUERY = 3
    OUTCOME = 4
    FINISH = 5
    ABORT = 6
    ACTIVATE = 7
    READY = 101
    LOAD_FAILED = 102
    ANSWER = 103
    FAULT = 104


# Fixed headers after the type byte.
HEADERS: Final[dict[Msg, struct.Struct]] = {
    # request, session, flags (bit 0: has session), reused; prompt ids follow
    Msg.BEGIN: struct.Struct("<QQIQ"),
    # request, start; ids follow
    Msg.COMMIT: struct.Struct("<QQ"),
    # query id, request, capacity, deadline (CLOCK_MONOTONIC ns), pending start; pending ids follow
    Msg.QUERY: struct.Struct("<QQIQQ"),
    # request, proposed, accepted, rejected, kind (OutcomeKindCode), discard reason
    # (DiscardReasonCode)
    Msg.OUTCOME: struct.Struct("<QIIIII"),
    # request, suffix start, stop reason code, then every figure in FIGURES' order (a count
    # u64, a measure f64 with NaN for None: :func:`figure_fields`); suffix ids
    Msg.FINISH: struct.Struct("<QQI" + "".join("Q" if f.count else "d" for f in FIGURES)),
    # request, reason code
    Msg.ABORT: struct.Struct("<QI"),
    # spec mode (SpecModeCode), n_vocab, n_ctx per lane, lanes, proposal deadline ns; the model
    # id, a NUL and the plugin configuration follow (utf-8: :func:`activation_text`)
    Msg.ACTIVATE: struct.Struct("<IQQIQ"),
    # abi version; the plugin's own name (utf-8) follows
    Msg.READY: struct.Struct("<I"),
    # nothing; a reason word (ascii) follows
    Msg.LOAD_FAILED: struct.Struct("<"),
    # query id, status (AnswerStatus); ids follow
    Msg.ANSWER: struct.Struct("<Qi"),
    # callback (Msg value of the failed call, 0: none), fault (Fault)
    Msg.FAULT: struct.Struct("<BB"),
}
CARRIES_TOKENS: Final = frozenset({Msg.BEGIN, Msg.COMMIT, Msg.QUERY, Msg.FINISH, Msg.ANSWER})
CARRIES_TEXT: Final = frozenset({Msg.READY, Msg.LOAD_FAILED, Msg.ACTIVATE})


def activation_text(model_id: str, config: str) -> str:
    """An ACTIVATE's text: the model id, a NUL, the configuration (neither holds a NUL)."""
    return f"{model_id}\0{config}"


def activation_parts(text: str) -> tuple[str, str]:
    """The model id and the configuration of an ACTIVATE's text."""
    model_id, _, config = text.partition("\0")
    return model_id, config


def figure_fields(figures: GenerationFigures) -> tuple[int | float, ...]:
    """A FINISH's figure fields: each figure in :data:`FIGURES`' order, NaN for None."""
    return tuple(f.number(figures) for f in FIGURES)


def figures_from_fields(fields: Sequence[int | float]) -> GenerationFigures:
    """The figures of a FINISH's figure fields (:func:`figure_fields` read back)."""
    values: dict[str, Any] = {  # each value typed by its row
        f.name: f.from_number(v) for f, v in zip(FIGURES, fields, strict=True)
    }
    return GenerationFigures(**values)


class AnswerStatus(IntEnum):
    """An ANSWER's status: the plugin's (skippy_plugin_status, >= 0) or the sidecar's (< 0)."""

    OK = 0
    NO_PROPOSAL = 1
    ERROR = 2
    INVALID_ARGUMENT = 3
    EXPIRED = -1
    """The query reached the sidecar after its deadline: its pending run was applied as a
    commit and the plugin was not asked."""
    RAISED = -2
    """The Python plugin raised."""
    INVALID_TOKEN_COUNT = -3
    """More tokens than the query's capacity."""
    STREAM_GAP = -4
    """The query's pending run did not start where the request's stream was (never expected)."""
    INVALID_TOKEN_ID = -5
    """Values that are not int32 token ids."""


class Fault(IntEnum):
    RAISED = 1
    ERROR_STATUS = 2
    MALFORMED = 3
    """A frame the sidecar could not use (counted by the link; not the plugin's failure)."""
    STREAM_GAP = 4
    """A run that did not start where the request's stream was: skipped (never expected)."""


class Malformed(ValueError):
    """A frame that could not be used; it was consumed whole."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Msg
    fields: tuple[int | float, ...]
    tokens: array[int]
    text: str = ""


def _ids(tokens: Sequence[int]) -> bytes:
    arr = tokens if isinstance(tokens, array) else array("i", tokens)
    if not _LITTLE:  # pragma: no cover - the wire is little-endian
        arr = array("i", arr)
        arr.byteswap()
    return arr.tobytes()


def encode(
    kind: Msg,
    *fields: int | float,
    tokens: Sequence[int] = (),
    text: str = "",
) -> bytes:
    """One complete frame. Raises ``struct.error``/``OverflowError`` for values that do not fit."""
    body = bytes((kind,)) + HEADERS[kind].pack(*fields)
    if kind in CARRIES_TOKENS:
        body += _ids(tokens)
    elif kind in CARRIES_TEXT:
        body += text.encode("utf-8", "replace")
    if len(body) > MAX_FRAME_BYTES:
        raise OverflowError("frame over the size limit")
    return _LEN.pack(len(body)) + body


def decode(body: bytes | bytearray | memoryview) -> Frame:
    """One frame's body → :class:`Frame`; :class:`Malformed` for anything unusable."""
    if not body:
        raise Malformed("empty body")
    try:
        kind = Msg(body[0])
    except ValueError:
        raise Malformed("unknown type") from None
    header = HEADERS[kind]
    end = 1 + header.size
    if len(body) < end:
        raise Malformed("short header")
    fields = header.unpack_from(body, 1)
    rest = memoryview(body)[end:]
    tokens: array[int] = array("i")
    text = ""
    if kind in CARRIES_TOKENS:
        if len(rest) % 4:
            raise Malformed("token part not a multiple of 4")
        tokens.frombytes(rest)
        if not _LITTLE:  # pragma: no cover
            tokens.byteswap()
    elif kind in CARRIES_TEXT:
        text = bytes(rest).decode("utf-8", "replace")
    elif len(rest):
        raise Malformed("trailing bytes")
    return Frame(kind, fields, tokens, text)


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError
        got += n
    return buf


def read_frame(sock: socket.socket) -> Frame:
    """The next frame; :class:`Malformed` (frame consumed) or :class:`EOFError` (stream ended,
    also mid-frame)."""
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > MAX_FRAME_BYTES:
        left = size
        while left:
            left -= len(_recv_exact(sock, min(left, _DISCARD_CHUNK_BYTES)))
        raise Malformed("frame over the size limit")
    return decode(_recv_exact(sock, size))
