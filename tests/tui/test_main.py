"""`python -m skippy_tui`: argument handling (the app itself is covered by the Pilot tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from skippy_tui.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skippy_tui", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_without_a_source_it_says_what_is_needed() -> None:
    result = _run()
    assert result.returncode == 2
    assert "--replay FILE or --demo is required" in result.stderr


def test_a_missing_replay_file_is_a_usage_error() -> None:
    result = _run("--replay", "no/such/file.ndjson")
    assert result.returncode == 2
    assert "no such file" in result.stderr


@pytest.mark.parametrize(("text", "value"), [("2", 2.0), ("0.5", 0.5), ("inf", float("inf"))])
def test_speed_accepts_factors_and_inf(text: str, value: float) -> None:
    args = build_parser().parse_args(["--replay", "x.ndjson", "--speed", text])
    assert args.speed == value


def test_speed_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--speed", "0"])
