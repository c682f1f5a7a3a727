"""Session KV state files: the format, its checks and the atomic write (no llama.cpp)."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from skippyctl.engine.kv_state import (
    HEADER_BYTES,
    MAGIC,
    Geometry,
    StateRefused,
    file_bytes,
    model_fingerprint,
    read_state,
    write_state,
)
from skippyctl.events.reasons import ReasonCode

FINGERPRINT = bytes(range(32))
TOKENS = [1, 450, 4996, 17354, 1701]
STATE = bytes(range(256)) * 3


def written(tmp_path: Path) -> Path:
    path = tmp_path / "s-1.kvs"
    size = write_state(path, FINGERPRINT, Geometry(2, 512), TOKENS, STATE)
    assert size == file_bytes(len(TOKENS), len(STATE)) == path.stat().st_size
    return path


def test_a_written_file_reads_back_with_its_tokens_state_and_geometry(tmp_path: Path) -> None:
    path = written(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes()[:8] == MAGIC
    assert struct.unpack_from("<I", path.read_bytes(), 8) == (1,)  # format version
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind
    saved = read_state(path, FINGERPRINT, max_tokens=512, max_bytes=1 << 20)
    assert saved.tokens == tuple(TOKENS)
    assert saved.state == STATE
    assert saved.geometry == Geometry(2, 512)


def _refusal(
    path: Path, fingerprint: bytes = FINGERPRINT, max_tokens: int = 512, max_bytes: int = 1 << 20
) -> ReasonCode:
    with pytest.raises(StateRefused) as refused:
        read_state(path, fingerprint, max_tokens, max_bytes)
    return refused.value.reason


@pytest.mark.parametrize("offset", [0, 20, 40, 70, HEADER_BYTES + 2, -1])
def test_any_flipped_byte_is_refused_as_an_artifact_failure(tmp_path: Path, offset: int) -> None:
    path = written(tmp_path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    # Offset 40 is inside the fingerprint: then it reads as another model's file.
    in_fingerprint = 32 <= offset < 64
    expected = (
        ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
        if in_fingerprint
        else ReasonCode.ARTIFACT_IO_FAILURE
    )
    assert _refusal(path) is expected


@pytest.mark.parametrize("keep", [0, 10, HEADER_BYTES, HEADER_BYTES + 7, -1])
def test_a_truncated_file_is_refused_as_an_artifact_failure(tmp_path: Path, keep: int) -> None:
    path = written(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    assert _refusal(path) is ReasonCode.ARTIFACT_IO_FAILURE


def test_another_models_file_a_file_too_long_for_a_lane_or_over_the_cap_is_refused(
    tmp_path: Path,
) -> None:
    path = written(tmp_path)
    other = bytes(32)
    assert _refusal(path, fingerprint=other) is ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
    assert _refusal(path, max_tokens=4) is ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
    assert _refusal(path, max_bytes=100) is ReasonCode.ARTIFACT_IO_FAILURE
    assert _refusal(tmp_path / "missing.kvs") is ReasonCode.ARTIFACT_IO_FAILURE


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    path = written(tmp_path)
    write_state(path, FINGERPRINT, Geometry(2, 512), [7], b"x")
    saved = read_state(path, FINGERPRINT, max_tokens=512, max_bytes=1 << 20)
    assert (saved.tokens, saved.state) == ((7,), b"x")


def test_the_model_fingerprint_follows_the_file_not_its_path(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    os.utime(model, ns=(10**18, 10**18))
    first = model_fingerprint(model)
    moved = tmp_path / "moved.gguf"
    model.rename(moved)
    assert model_fingerprint(moved) == first  # same file, another path
    os.utime(moved, ns=(2 * 10**18, 2 * 10**18))
    assert model_fingerprint(moved) != first  # rewritten (mtime)
    moved.write_bytes(b"GGUF" + bytes(99) + b"\1")
    os.utime(moved, ns=(10**18, 10**18))
    assert model_fingerprint(moved) != first  # other bytes
