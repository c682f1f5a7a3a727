"""`make test` is deterministic: hypothesis runs derandomized, without an example database, and
leaves no `.hypothesis/` directory behind (profiles: tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.conftest import HYPOTHESIS_PROFILE_ENV, ROOT

PROPERTY_TESTS = ROOT / "tests" / "stages" / "test_plan.py"
"""A quick module of property tests."""


def test_the_default_profile_is_derandomized_without_a_database() -> None:
    if settings.get_current_profile_name() != "ci":
        pytest.skip("another hypothesis profile was chosen for this run")
    assert settings.default.derandomize is True
    assert settings.default.database is None


def test_a_property_run_writes_no_hypothesis_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != HYPOTHESIS_PROFILE_ENV}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROPERTY_TESTS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert not (tmp_path / ".hypothesis").exists()
