from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest


def stop_runtime(directory: Path) -> None:
    """Stop the runtime a test started (SIGTERM, then SIGKILL): no test leaves one behind."""
    discovery = directory / "runtime.json"
    try:
        pid = int(orjson.loads(discovery.read_bytes())["pid"])
    except (FileNotFoundError, KeyError, ValueError, orjson.JSONDecodeError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        # A runtime this test process spawned itself stays a zombie (and passes `kill(pid, 0)`)
        # until it is reaped; one started by `runtime start` is not our child.
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def isolated_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each CLI test gets its own runtime directory (discovery file, log) and its own host."""
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    yield directory
    stop_runtime(directory)
