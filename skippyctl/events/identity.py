"""Logical identities: model ids from artifacts, operation ids from counters.

Ids are opaque and never derived from prompt or completion content, never a path or pointer.
"""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import PurePath
from typing import Final

from skippyctl.events.envelope import InvalidLogicalId, LogicalId

_SPLIT_SUFFIX: Final = re.compile(r"-\d{5}-of-\d{5}$")
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._:+=-]+")


def is_logical_id(text: str) -> bool:
    """Whether ``text`` can be an id (a name a client sent, before it is looked up)."""
    try:
        LogicalId(text)
    except InvalidLogicalId:
        return False
    return True


def model_id_for(artifact: str, alias: str | None = None) -> LogicalId:
    """The public id of a model: its alias, else the artifact's basename without `.gguf` and
    without a split suffix (`tiny-split-00001-of-00003.gguf` → `tiny-split`). Characters outside
    the id alphabet are replaced, so an absolute path can never become an id.
    """
    if alias is not None:
        return LogicalId(alias)
    stem = PurePath(artifact).name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    stem = _SPLIT_SUFFIX.sub("", stem)
    cleaned = _UNSAFE.sub("_", stem).strip("._:+=-")[:64] or "model"
    if not cleaned[0].isalnum():
        cleaned = "m" + cleaned[:63]
    return LogicalId(cleaned)


class OperationIds:
    """Process-local operation ids `<prefix>-<n>` with a matching nonzero native u64."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self, prefix: str) -> tuple[LogicalId, int]:
        with self._lock:
            number = next(self._counter)
        return LogicalId(f"{prefix}-{number}"), number
