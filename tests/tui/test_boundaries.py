"""Layering: only skippy_tui imports Textual, and its data modules do not need it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_core_never_imports_textual_or_the_dashboard() -> None:
    """Textual nowhere in skippyctl; the dashboard only inside a function (the `tui` command)."""
    textual = re.compile(r"^\s*(from|import)\s+textual\b", re.MULTILINE)
    dashboard = re.compile(r"^(from|import)\s+skippy_tui\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "skippyctl").rglob("*.py")
        if textual.search(text := path.read_text(encoding="utf-8")) or dashboard.search(text)
    ]
    assert offenders == []


def test_the_dashboard_never_imports_the_cli() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+skippyctl\.cli\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "skippy_tui").rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_decoder_sources_and_store_load_without_textual() -> None:
    code = (
        "import sys, skippy_tui, skippy_tui.sources, skippy_tui.store, skippy_tui.live, "
        "skippy_tui.demo, skippy_tui.fleet_source, skippy_tui.fleet_store, skippy_tui.fleet_live; "
        "print('textual' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "False"
