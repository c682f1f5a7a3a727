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
    # Every file of the set: a checkout made before a fixture was added gets it too.
    if not all((FIXTURES / name).exists() for name in ("tiny.gguf", "tiny-successor.gguf")):
        from skippyctl.fixtures import make_fixtures

        make_fixtures(FIXTURES)
    return FIXTURES
