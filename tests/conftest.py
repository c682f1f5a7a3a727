from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

# llama.cpp must never run gdb for a backtrace when a fixture makes it abort.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The generated fixture models (`make fixtures`; generated here when missing)."""
    if not (FIXTURES / "tiny.gguf").exists():
        from skippyctl.fixtures import make_fixtures

        make_fixtures(FIXTURES)
    return FIXTURES
