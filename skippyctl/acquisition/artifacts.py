"""Pre-checks of a model artifact before any engine work, each with a specific reason code.

llama.cpp returns NULL for every load failure without saying why (and we never parse its log
text), so the host checks what it can first: existence, type, readability, the GGUF magic and
version, and the presence of every part of a split set.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from skippyctl.events.reasons import ReasonCode

GGUF_MAGIC: Final = b"GGUF"
GGUF_HEADER_BYTES: Final = 24  # magic, version u32, tensor count u64, kv count u64
_SPLIT: Final = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True, slots=True)
class ArtifactProblem:
    reason: ReasonCode
    message: str
    """For people (stderr). Names the problem, never the absolute path."""


def split_parts(path: Path) -> list[Path] | None:
    """All part paths of a split set named like `x-00001-of-00003.gguf`, or None if not split."""
    match = _SPLIT.match(path.name)
    if match is None:
        return None
    count = int(match["count"])
    return [
        path.with_name(f"{match['prefix']}-{n:05d}-of-{count:05d}.gguf")
        for n in range(1, count + 1)
    ]


def check_artifact(path: Path) -> ArtifactProblem | None:
    """None when the file looks loadable; otherwise the first problem found."""
    try:
        info = path.stat()
    except ValueError:  # an embedded NUL byte: no such path can exist
        return ArtifactProblem(ReasonCode.INVALID_CONFIGURATION, "model path is not a valid path")
    except FileNotFoundError:
        return ArtifactProblem(ReasonCode.MISSING_ARTIFACT, "model file not found")
    except OSError as error:
        return ArtifactProblem(
            ReasonCode.ARTIFACT_IO_FAILURE, f"cannot stat model file ({error.strerror})"
        )
    if stat.S_ISDIR(info.st_mode):
        return ArtifactProblem(
            ReasonCode.ARTIFACT_IO_FAILURE, "model path is a directory, not a GGUF file"
        )
    if not stat.S_ISREG(info.st_mode):
        return ArtifactProblem(ReasonCode.ARTIFACT_IO_FAILURE, "model path is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        return ArtifactProblem(
            ReasonCode.ARTIFACT_IO_FAILURE, f"cannot read model file ({error.strerror})"
        )
    try:
        header = os.read(fd, GGUF_HEADER_BYTES)
    except OSError as error:
        return ArtifactProblem(
            ReasonCode.ARTIFACT_IO_FAILURE, f"cannot read model file ({error.strerror})"
        )
    finally:
        os.close(fd)
    if len(header) < GGUF_HEADER_BYTES:
        return ArtifactProblem(
            ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE, "file is too short to be GGUF"
        )
    if header[:4] != GGUF_MAGIC:
        return ArtifactProblem(
            ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE, "not a GGUF file (bad magic)"
        )
    parts = split_parts(path)
    if parts is not None:
        missing = [part for part in parts if not part.exists()]
        if missing:
            names = ", ".join(part.name for part in missing)
            return ArtifactProblem(
                ReasonCode.MISSING_ARTIFACT, f"split set is missing part(s): {names}"
            )
    return None


def split_group(name: str) -> str:
    """The artifact a file belongs to: a split set's parts share one key (its first part)."""
    parts = part_names(name)
    return parts[0]


def first_part(names: Sequence[str]) -> str:
    return sorted(names)[0]


def part_names(filename: str) -> list[str]:
    parts = split_parts(Path(filename))
    if parts is None:
        return [filename]
    parent = PurePosixPath(filename).parent
    return [str(parent / p.name) if str(parent) != "." else p.name for p in parts]
