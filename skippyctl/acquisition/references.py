"""Model references: the three forms a model is named by, parsed without touching the network.

- a local path: a GGUF file, or the first part of a split set;
- ``hf://ORG/REPO/PATH.gguf``: one file of a Hugging Face model repo (the first part of a split
  set brings every part);
- ``ORG/REPO:QUANT``: the repo's one GGUF artifact whose file name contains QUANT
  (case-insensitive, e.g. ``Q4_K_M``); the parts of one split set count as one artifact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Final

_REPO = r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*"
_HF_URI: Final = re.compile(rf"^hf://(?P<repo>{_REPO})/(?P<file>[^\s\\]+)$")
_QUANT_REF: Final = re.compile(rf"^(?P<repo>{_REPO}):(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]*)$")


class RefKind(StrEnum):
    LOCAL = "local"
    HF_FILE = "hf_file"
    HF_QUANT = "hf_quant"


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed model reference."""

    kind: RefKind
    text: str
    repo_id: str | None = None
    filename: str | None = None
    """The file in the repo (``HF_FILE``)."""
    quant: str | None = None
    """The quant tag (``HF_QUANT``)."""

    @property
    def remote(self) -> bool:
        return self.kind is not RefKind.LOCAL


class RefError(ValueError):
    """A reference that cannot be parsed (``invalid_configuration``)."""


def parse_ref(text: str) -> ModelRef:
    """The reference `text` names: ``hf://`` first, then an existing local path, then
    ``ORG/REPO:QUANT``; anything else is a local path (whose absence preparation reports)."""
    if "\x00" in text:
        raise RefError("the model reference must not contain NUL characters")
    if text.startswith("hf://"):
        match = _HF_URI.match(text)
        if match is None:
            raise RefError("an hf:// reference is hf://ORG/REPO/FILE.gguf")
        filename = match["file"]
        parts = PurePosixPath(filename).parts
        if not filename.lower().endswith(".gguf") or any(p in ("", ".", "..") for p in parts):
            raise RefError("an hf:// reference must name a .gguf file inside the repo")
        return ModelRef(RefKind.HF_FILE, text, match["repo"], filename=filename)
    if Path(text).expanduser().exists():
        return ModelRef(RefKind.LOCAL, text)
    match = _QUANT_REF.match(text)
    if match is not None:
        return ModelRef(RefKind.HF_QUANT, text, match["repo"], quant=match["quant"])
    return ModelRef(RefKind.LOCAL, text)


def is_remote_ref(text: str) -> bool:
    """Whether `text` names a Hugging Face file (so it must be pulled before a load)."""
    try:
        return parse_ref(text).remote
    except RefError:
        return text.startswith("hf://")
