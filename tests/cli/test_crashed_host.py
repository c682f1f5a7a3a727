"""`crashed_host`: a discovery file left behind by a host that died (its pid gone, or reused
by another process) names a crash; a live runtime, no file or a corrupt one do not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from skippyctl.client.discovery import crashed_host
from skippyctl.config.runtime_settings import RuntimeSettings
from tests.cli.discovery_files import discovery_fields, stranger, write_discovery_file


def test_a_file_naming_a_dead_pid_is_a_crashed_host(isolated_runtime: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_discovery_file(isolated_runtime, discovery_fields(pid=child.pid))
    found = crashed_host(RuntimeSettings(runtime_dir=isolated_runtime))
    assert found is not None and found.pid == child.pid


def test_a_file_naming_a_reused_pid_is_a_crashed_host(isolated_runtime: Path) -> None:
    with stranger() as process:
        write_discovery_file(isolated_runtime, discovery_fields(pid=process.pid))
        assert crashed_host(RuntimeSettings(runtime_dir=isolated_runtime)) is not None


def test_no_file_or_a_corrupt_one_is_no_crash(isolated_runtime: Path) -> None:
    settings = RuntimeSettings(runtime_dir=isolated_runtime)
    isolated_runtime.mkdir(mode=0o700, exist_ok=True)
    assert crashed_host(settings) is None
    write_discovery_file(isolated_runtime, b"not json")
    assert crashed_host(settings) is None
