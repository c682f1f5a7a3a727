"""Helpers that write discovery files by hand (stale, tampered, naming other processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from tests.cli.helpers import CliResult

SCRIPT = Path(sys.executable).parent / "skippyctl"
"""The installed console script (`.venv/bin/skippyctl`): the real CLI as users run it."""


def run_script(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, new_session: bool = False
) -> CliResult:
    """Run `.venv/bin/skippyctl ARGS` (env: the test's environment plus `env`)."""
    proc = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        start_new_session=new_session,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def discovery_fields(*, drop: tuple[str, ...] = (), **overrides: Any) -> dict[str, Any]:
    """A discovery file's fields (a dead pid by default) with `overrides`, without `drop`."""
    fields: dict[str, Any] = {
        "pid": 2**22 - 3,
        "url": "http://127.0.0.1:9",
        "token": "t0ken",
        "version": "0",
        "process_instance_id": "x",
        "started_at": "then",
        "schema_version": 1,
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if k not in drop}


def write_discovery_file(directory: Path, content: dict[str, Any] | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "runtime.json"
    path.write_bytes(content if isinstance(content, bytes) else orjson.dumps(content))
    path.chmod(0o600)
    return path


@contextmanager
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's own that is not a runtime: what a reused pid would name."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def start_ticks_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rfind(b")") + 1 :].split()[19])


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
