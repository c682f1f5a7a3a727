from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    def records(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as one JSON object (fails the test if one is not)."""
        return ndjson_objects(self.stdout)

    def events(self) -> list[str]:
        return [r["event"] for r in self.records()]


def ndjson_objects(text: str | bytes) -> list[dict[str, Any]]:
    """Every line of `text` parsed as one JSON object (fails the test if one is not)."""
    out = []
    for line in text.splitlines():
        value = orjson.loads(line)
        assert isinstance(value, dict), line
        out.append(value)
    return out


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "skippyctl", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
