"""`sse_frames`: the client's SSE reader gives the same frames however the byte stream is cut
into chunks, with LF, CR LF or CR line ends (skippyctl/client/http.py)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.client.http import Frame, sse_frames

FRAMES = [
    Frame("runtime_state", "rt1:a:0", {"sequence": 0, "state": {"models": []}}),
    Frame("runtime_event", "rt1:a:1", {"sequence": 1, "event": {"kind": "x", "s": "a\nb"}}),
    Frame("message", None, {"plain": True}),
    Frame("runtime_event", "rt1:a:2", {"sequence": 2, "text": "ü € 🙂"}),
]


def wire(frames: list[Frame], newline: bytes = b"\n") -> bytes:
    out = b": keep-alive comment" + newline + newline
    for frame in frames:
        lines = []
        if frame.cursor is not None:
            lines.append(b"id: " + frame.cursor.encode())
        if frame.name != "message":
            lines.append(b"event: " + frame.name.encode())
        lines.append(b"data: " + orjson.dumps(frame.data))
        out += newline.join(lines) + newline + newline
    return out


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(st.lists(st.integers(min_value=0), max_size=40), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_any_chunking_and_line_end_gives_the_same_frames(points: list[int], newline: bytes) -> None:
    assert list(sse_frames(cut(wire(FRAMES, newline), points))) == FRAMES


def test_byte_by_byte_with_cr_lf() -> None:
    data = wire(FRAMES, b"\r\n")
    assert list(sse_frames([data[i : i + 1] for i in range(len(data))])) == FRAMES


def test_fields_without_a_space_several_data_lines_and_unknown_fields() -> None:
    data = b'retry: 10\nid:rt1:a:5\nevent:runtime_event\ndata:{"a":\ndata: 1}\nbogus\n\n'
    assert list(sse_frames([data])) == [Frame("runtime_event", "rt1:a:5", {"a": 1})]


def test_a_frame_without_data_or_an_unfinished_one_is_no_frame() -> None:
    assert list(sse_frames([b"event: x\nid: 1\n\n", b'data: {"cut": 1}\n'])) == []
