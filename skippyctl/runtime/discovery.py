"""The discovery file: how every command finds the running runtime host.

One JSON file per user, mode 0600, in the platformdirs user runtime directory (or
`SKIPPY_RUNTIME_DIR`): pid, base url, bearer token, version, process instance id, start time.
A file whose pid is gone is stale: `read_discovery` reports it and `remove_if_stale` deletes it so
a new host can take its place. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson
import platformdirs

FILE_NAME: Final = "runtime.json"
SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Discovery:
    pid: int
    url: str
    token: str
    version: str
    process_instance_id: str
    started_at: str
    schema_version: int = SCHEMA_VERSION


class DiscoveryProblem(Exception):
    """The discovery file exists but cannot be used; `reason` is a short stable token."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def runtime_dir() -> Path:
    override = os.environ.get("SKIPPY_RUNTIME_DIR")
    if override:
        return Path(override)
    return Path(platformdirs.user_runtime_dir("skippyctl", ensure_exists=False))


def discovery_path() -> Path:
    return runtime_dir() / FILE_NAME


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_discovery(discovery: Discovery) -> Path:
    path = discovery_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".runtime-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, orjson.dumps(asdict(discovery), option=orjson.OPT_INDENT_2))
    finally:
        os.close(fd)
    os.replace(temp, path)
    return path


def read_discovery() -> Discovery | None:
    """The live host's discovery, None when there is no file.

    Raises DiscoveryProblem("stale", …) when the file names a dead pid and ("corrupt", …) when
    it cannot be parsed.
    """
    path = discovery_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = orjson.loads(raw)
        discovery = Discovery(**{k: data[k] for k in Discovery.__dataclass_fields__ if k in data})
    except (orjson.JSONDecodeError, TypeError, KeyError) as error:
        raise DiscoveryProblem("corrupt", f"discovery file unreadable: {error}") from error
    if not pid_alive(discovery.pid):
        raise DiscoveryProblem("stale", f"discovery file names pid {discovery.pid}, not running")
    return discovery


def remove_discovery(expected_pid: int | None = None) -> None:
    """Delete the file (only if it still belongs to `expected_pid`, when given)."""
    path = discovery_path()
    if expected_pid is not None:
        try:
            data = orjson.loads(path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return
        if data.get("pid") != expected_pid:
            return
    path.unlink(missing_ok=True)


def remove_if_stale() -> bool:
    """Delete a stale or corrupt file; True if one was removed."""
    try:
        read_discovery()
    except DiscoveryProblem:
        discovery_path().unlink(missing_ok=True)
        return True
    return False
