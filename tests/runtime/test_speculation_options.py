"""A load's speculation and plugin options are refused with a reason before anything starts
(runtime/host.py `speculation_problem`, shared by the CLI and the host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippyctl.runtime.host import speculation_problem


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"mode": "eager"}, "--spec must be one of"),
        ({"mode": "ngram", "draft_tokens": 0}, "--spec-draft-tokens"),
        ({"mode": "plugin", "deadline_ms": 0.0}, "--spec-deadline-ms"),
        ({"mode": "plugin", "deadline_ms": float("nan")}, "--spec-deadline-ms"),
        ({"mode": "plugin", "runahead_tokens": 257}, "--spec-runahead-tokens must be"),
        ({"mode": "off", "runahead_tokens": 8}, "needs --spec plugin or ngram"),
        ({"mode": "draft", "draft": "d.gguf", "runahead_tokens": 8}, "needs --spec plugin or"),
        ({"mode": "draft"}, "go together"),
        ({"mode": "ngram", "draft": "d.gguf"}, "go together"),
        ({"mode": "plugin", "plugins": ("relative.so",)}, "absolute path"),
        ({"mode": "plugin", "plugins": ("/nowhere/p.so",)}, "p.so: no such file"),
        ({"mode": "plugin", "plugins": ("bad name!",)}, "entry-point name"),
    ],
)
def test_an_unusable_option_is_refused_with_what_to_change(
    options: dict[str, object], says: str
) -> None:
    mode = str(options.pop("mode"))
    problem = speculation_problem(mode, options.pop("draft_tokens", None), **options)  # type: ignore[arg-type]
    assert problem is not None and says in problem
    assert "/nowhere" not in problem  # a file is named by its basename


def test_usable_options_pass(tmp_path: Path) -> None:
    plugin = tmp_path / "p.so"
    plugin.write_bytes(b"")
    assert speculation_problem("off", None) is None
    assert speculation_problem("ngram", 8) is None
    assert speculation_problem("ngram", 8, runahead_tokens=32) is None
    assert speculation_problem("off", None, runahead_tokens=0) is None  # 0 is fixed depth
    assert speculation_problem("plugin", None, (str(plugin), "ngram-py"), 2.0, 64) is None
    assert speculation_problem("draft", None, draft="d.gguf") is None
