"""Redaction for the few projections that carry raw text (opt-in native log lines, a
diagnostics bundle's doctor findings): secrets become `[redacted-token]`, an absolute path
becomes `<path:BASENAME>` (ARCHITECTURE.md §4: no absolute paths, no credentials).

A path is a `/` that does not follow a word character, `:`, `/`, `.`, `~` or `-` (so `tokens/s`,
`http://host:1/x` and relative paths stay), then path characters.
"""

from __future__ import annotations

import re
from typing import Final

TOKEN_MARK: Final = "[redacted-token]"
_ABSOLUTE_PATH: Final = re.compile(r"(?<![\w:/.~-])/(?:[\w.+@~-]+/)*[\w.+@~-]+")


def redact(text: str, secrets: tuple[str, ...] = ()) -> tuple[str, int]:
    """`text` without the secrets and absolute paths, and how many replacements were made."""
    count = 0
    for secret in secrets:
        if secret and secret in text:
            count += text.count(secret)
            text = text.replace(secret, TOKEN_MARK)

    def _path(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"<path:{match.group(0).rsplit('/', 1)[-1]}>"

    return _ABSOLUTE_PATH.sub(_path, text), count
