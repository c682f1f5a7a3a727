"""Redaction of raw text (native log lines, doctor details): secrets and absolute paths go,
URLs, rates and relative paths stay."""

from __future__ import annotations

import pytest

from skippyctl.output.redact import TOKEN_MARK, redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "loaded meta data from /tmp/pytest-1/models/tiny.gguf (version GGUF V3)",
            "loaded meta data from <path:tiny.gguf> (version GGUF V3)",
        ),
        ("chmod 600 /run/user/0/skippyctl/runtime.json", "chmod 600 <path:runtime.json>"),
        ("http://127.0.0.1:8750/api answers", "http://127.0.0.1:8750/api answers"),
        ("160.5 tokens/s, models/tiny.gguf", "160.5 tokens/s, models/tiny.gguf"),
        ("'/home/me/a b.gguf'", "'<path:a> b.gguf'"),
    ],
)
def test_absolute_paths_become_their_basename(text: str, expected: str) -> None:
    assert redact(text)[0] == expected


def test_secrets_are_replaced_and_counted() -> None:
    text, count = redact("Bearer s3cret and again s3cret at /srv/x", ("s3cret",))
    assert text == f"Bearer {TOKEN_MARK} and again {TOKEN_MARK} at <path:x>"
    assert count == 3
