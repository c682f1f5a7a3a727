from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest


def _is_a_runtime(pid: int) -> bool:
    """Whether `pid` is a `skippyctl … runtime serve` process. Tests write discovery files
    naming other processes (a stranger, -1, 0, huge pids): those must never be signalled."""
    if not 0 < pid <= 2**22:
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(Path(a.decode(errors="replace")).name == "skippyctl" for a in args) and (
        b"serve" in args
    )


def stop_runtime(directory: Path) -> None:
    """Stop the runtime a test started (SIGTERM, then SIGKILL): no test leaves one behind.
    Only a pid that is a skippyctl runtime is signalled (see `_is_a_runtime`)."""
    discovery = directory / "runtime.json"
    try:
        pid = orjson.loads(discovery.read_bytes())["pid"]
    except (OSError, KeyError, TypeError, ValueError, orjson.JSONDecodeError):
        return
    if not isinstance(pid, int) or isinstance(pid, bool) or not _is_a_runtime(pid):
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
    if _is_a_runtime(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def isolated_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each CLI test gets its own runtime directory (discovery file, log), its own host and its
    own hub cache."""
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    # A hub cache of its own: what the machine's cache holds never changes a test's answers.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    yield directory
    stop_runtime(directory)
