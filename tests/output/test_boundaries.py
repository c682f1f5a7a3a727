"""Layering: the projections in skippyctl.output are headless (presentation lives in the CLI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI_AND_WEB: tuple[str, ...] = ("rich", "typer", "textual", "fastapi", "starlette", "uvicorn")


def test_no_output_module_imports_a_ui_or_web_framework() -> None:
    pattern = re.compile(rf"^\s*(from|import)\s+({'|'.join(UI_AND_WEB)})\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "skippyctl" / "output").rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_importing_every_output_module_loads_no_ui_or_web_framework() -> None:
    modules = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / "skippyctl" / "output").rglob("*.py")
    )
    assert "skippyctl.output.codec" in modules and "skippyctl.output.state_reader" in modules
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        f"print(sorted(m for m in {UI_AND_WEB!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"
