"""Session KV state files: one session's KV sequence on disk, so it outlives its engine.

Pure Python, no llama.cpp: the decode core (``engine/session_files.py``) gets the bytes with
``llama_state_seq_get_data`` and gives them back with ``llama_state_seq_set_data``; this module
writes and reads the file around them. The host decides where (its per-runtime state directory,
``runtime/session_state.py``) and tells the engine each file's path in the ``Shutdown`` and
``Load`` commands, so the bulk bytes never cross the control channel.

Format (version 1, little endian)::

    offset size
         0    8  magic b"SKPYKVS\\0"
         8    4  u32 format version (1)
        12    4  u32 lanes of the context that wrote it
        16    4  u32 tokens per lane of that context
        20    4  u32 token count n
        24    8  u64 state byte count m (what llama_state_seq_get_data returned)
        32   32  model fingerprint (:func:`model_fingerprint`)
        64   32  SHA-256 of everything after the header (tokens, then state)
        96  4*n  the session's token ids, i32 each (to match the next prompt's prefix)
    96+4*n   m  the sequence's KV state, as llama.cpp wrote it

A file is refused (:class:`StateRefused`) unless it is exactly that long, its magic, version and
digest check out and its fingerprint is the loaded model's: a wrong model is
``incompatible_abi_or_feature_set``, anything unreadable, truncated or altered is
``artifact_io_failure``. The digest is checked before llama.cpp sees a byte, so a flipped bit
never reaches ``llama_state_seq_set_data``.

Files are written atomically (a temporary name in the same directory, fsync, rename, fsync of
the directory), mode 0600. Token ids are stored in the file only — never in a message or event.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippyctl.events.reasons import ReasonCode

MAGIC: Final = b"SKPYKVS\0"
FORMAT_VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sIIIIQ32s32s")
HEADER_BYTES: Final = _HEADER.size
TOKEN_BYTES: Final = 4
FINGERPRINT_HEAD_BYTES: Final = 1 << 20
"""How much of the model file the fingerprint hashes (the GGUF header and metadata sit there)."""
TEMP_SUFFIX: Final = ".tmp"


class StateRefused(Exception):
    """A state file that cannot be used; ``reason`` is the event's reason code."""

    def __init__(self, reason: ReasonCode, problem: str) -> None:
        super().__init__(problem)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Geometry:
    lanes: int
    tokens_per_lane: int


@dataclass(frozen=True, slots=True)
class SessionState:
    tokens: tuple[int, ...]
    state: bytes
    geometry: Geometry


def model_fingerprint(path: str | os.PathLike[str]) -> bytes:
    """SHA-256 over the model file's size, mtime and first ``FINGERPRINT_HEAD_BYTES`` bytes: a
    different file (or the same file rewritten) gets a different fingerprint. Never the path."""
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        head = handle.read(FINGERPRINT_HEAD_BYTES)
    digest = hashlib.sha256(b"skippy-model-fingerprint\0")
    digest.update(struct.pack("<QQ", info.st_size, info.st_mtime_ns))
    digest.update(head)
    return digest.digest()


def file_bytes(tokens: int, state_bytes: int) -> int:
    """The size of a file holding ``tokens`` tokens and ``state_bytes`` bytes of KV state."""
    return HEADER_BYTES + TOKEN_BYTES * tokens + state_bytes


def _payload_digest(tokens_blob: bytes, state: bytes | memoryview) -> bytes:
    digest = hashlib.sha256(tokens_blob)
    digest.update(state)
    return digest.digest()


def write_state(
    path: str | os.PathLike[str],
    fingerprint: bytes,
    geometry: Geometry,
    tokens: list[int] | tuple[int, ...],
    state: bytes | memoryview,
) -> int:
    """Write one session's state atomically; the bytes written. Raises OSError."""
    target = Path(path)
    tokens_blob = struct.pack(f"<{len(tokens)}i", *tokens)
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        geometry.lanes,
        geometry.tokens_per_lane,
        len(tokens),
        len(state),
        fingerprint,
        _payload_digest(tokens_blob, state),
    )
    temporary = target.with_name(target.name + TEMP_SUFFIX)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(header)
            handle.write(tokens_blob)
            handle.write(state)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):
        directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return len(header) + len(tokens_blob) + len(state)


def read_state(
    path: str | os.PathLike[str], fingerprint: bytes, max_tokens: int, max_bytes: int
) -> SessionState:
    """The state in ``path`` if it belongs to the model with ``fingerprint``, holds at most
    ``max_tokens`` tokens and is at most ``max_bytes`` long; :class:`StateRefused` otherwise."""
    io = ReasonCode.ARTIFACT_IO_FAILURE
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < HEADER_BYTES:
                raise StateRefused(io, "shorter than its header")
            if size > max_bytes:
                raise StateRefused(io, "larger than the state cap")
            header = handle.read(HEADER_BYTES)
            magic, version, lanes, per_lane, count, state_bytes, owner, digest = _HEADER.unpack(
                header
            )
            if magic != MAGIC or version != FORMAT_VERSION:
                raise StateRefused(io, "not a session state file of this format")
            if size != file_bytes(count, state_bytes):
                raise StateRefused(io, "truncated or padded")
            if owner != fingerprint:
                raise StateRefused(
                    ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET, "written for another model"
                )
            if count < 1 or count > max_tokens:
                raise StateRefused(
                    ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET, "more tokens than a lane holds"
                )
            tokens_blob = handle.read(TOKEN_BYTES * count)
            state = handle.read(state_bytes)
    except OSError as error:
        raise StateRefused(io, f"cannot be read ({type(error).__name__})") from error
    if len(tokens_blob) != TOKEN_BYTES * count or len(state) != state_bytes:
        raise StateRefused(io, "truncated while reading")
    if _payload_digest(tokens_blob, state) != digest:
        raise StateRefused(io, "its contents do not match their digest")
    tokens = struct.unpack(f"<{count}i", tokens_blob)
    return SessionState(tokens, state, Geometry(lanes, per_lane))
