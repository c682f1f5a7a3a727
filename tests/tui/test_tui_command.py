"""`skippyctl tui --fleet` / `top --fleet`: what it refuses before any dashboard opens (the
dashboard itself is covered by the Pilot tests). stdout and stderr are checked apart: the
command prints nothing on stdout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _skippyctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skippyctl", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("command", ["tui", "top"])
def test_an_unusable_fleet_file_exits_10_with_its_reason(tmp_path: Path, command: str) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[nodes.gpu1]\nurl = "ftp://10.0.0.5"\n', encoding="utf-8")
    result = _skippyctl(command, "--fleet", "--fleet-file", str(fleet))
    assert result.returncode == 10
    assert result.stdout == ""
    assert "node 'gpu1': url must be http(s)://HOST:PORT" in result.stderr


def test_a_key_written_in_the_fleet_file_is_refused(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[nodes.gpu1]\nurl = "http://10.0.0.5:8421"\nkey = "s3cr3t"\n')
    result = _skippyctl("top", "--fleet", "--fleet-file", str(fleet))
    assert result.returncode == 10
    assert "s3cr3t" not in result.stderr + result.stdout
    assert "a key is never written in the fleet file" in result.stderr


def test_a_fleet_file_without_fleet_is_a_usage_error(tmp_path: Path) -> None:
    result = _skippyctl("tui", "--fleet-file", str(tmp_path / "fleet.toml"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "add --fleet" in result.stderr


def test_a_missing_fleet_recording_is_a_usage_error(tmp_path: Path) -> None:
    result = _skippyctl("top", "--fleet", "--replay", str(tmp_path / "none.ndjson"))
    assert result.returncode == 2
    assert "no such file" in result.stderr


def test_the_live_fleet_dashboard_needs_a_terminal(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[nodes.gpu1]\nurl = "http://127.0.0.1:9"\n', encoding="utf-8")
    result = _skippyctl("tui", "--fleet", "--fleet-file", str(fleet))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "needs a terminal" in result.stderr
