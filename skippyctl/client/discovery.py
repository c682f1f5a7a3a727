"""The discovery file: how every command finds the running runtime host.

One JSON file per user, mode 0600, in a private runtime directory (or `SKIPPY_RUNTIME_DIR`):
pid, base url, bearer token, version, process instance id, start time, the identity of the
host process (`boot_id` + `start_ticks`, the kernel's start time of that pid in clock ticks),
and for a runtime served over TLS (an https url) the absolute path of the certificate a local
client trusts (`tls_cert`). Writes are atomic (temp file + rename).

Fields are only ever added, never renamed, with the schema version unchanged: a reader ignores
fields it does not know, and a field a file lacks reads as None (files of older versions).

Invariants:

- Whether the pid a file names is the runtime that wrote it, and signalling it only then, is
  `client/process_identity.py` (nothing here signals anything).
- A file that names a dead pid, or a pid now held by another process (pid reuse after a
  crash), is `stale`; one that does not parse or holds wrong types, an impossible pid, a bad url
  or no token is `corrupt`; one that is a symlink or owned by another user is `untrusted`; a
  runtime directory that is not a directory, cannot be used, or (when derived, not given) is not
  private is `unusable_directory`. `read_discovery` raises `DiscoveryProblem` with that reason;
  it never raises anything else for a bad file or directory.
- The runtime directory is chosen without platformdirs' "XDG_RUNTIME_DIR is not set" warning:
  `$XDG_RUNTIME_DIR/skippyctl` when that is a private directory, else
  `/run/user/<uid>/skippyctl` when that is, else `<tmp>/runtime-<uid>/skippyctl` (the same
  fallback platformdirs uses). A derived directory must be a real directory owned by the user
  with no group/other access (0700); it is refused otherwise, never repaired behind the user's
  back. `SKIPPY_RUNTIME_DIR` is the user's explicit choice: it only has to be a directory.
  Both variables come from the process's settings (`RuntimeSettings`, read once at start),
  which every function here that touches the directory takes.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from skippyctl.client.process_identity import (
    APP_NAME,
    PID_MAX_LIMIT,
    Verdict,
    boot_id,
    pid_limit,
    start_ticks,
    verify_runtime,
)
from skippyctl.config.runtime_settings import RuntimeSettings

FILE_NAME: Final = "runtime.json"
SCHEMA_VERSION: Final = 1
PRIVATE_MODE: Final = 0o700

# DiscoveryProblem reasons: stable tokens, shown in `runtime status --json` as `discovery`.
STALE: Final = "stale"
CORRUPT: Final = "corrupt"
UNTRUSTED: Final = "untrusted"
UNUSABLE_DIRECTORY: Final = "unusable_directory"

_PRINTABLE_TOKEN: Final = re.compile(r"[\x21-\x7e]+")
_JSON_TYPES: Final[dict[type, str]] = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


@dataclass(frozen=True, slots=True)
class Discovery:
    """What the runtime host advertises. `boot_id` and `start_ticks` identify the host process
    (None in files written by older versions); `write_discovery` stamps them for the writer's
    own pid."""

    pid: int
    url: str
    token: str
    version: str
    process_instance_id: str
    started_at: str
    schema_version: int = SCHEMA_VERSION
    boot_id: str | None = None
    start_ticks: int | None = None
    tls_cert: str | None = None
    """The absolute path of the certificate (PEM) an https runtime presents: what a local
    client verifies it against. None for plain http."""


class DiscoveryProblem(Exception):
    """The discovery file (or its directory) cannot be used; `reason` is a short stable token
    (`stale`, `corrupt`, `untrusted`, `unusable_directory`) and the message says why without
    an absolute path (it may end up in a JSON record)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# -- the runtime directory ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Location:
    path: Path
    explicit: bool
    """True for SKIPPY_RUNTIME_DIR; False for a derived directory (which must be private)."""
    base: Path | None = None
    """A derived directory's parent that must be private as well (the tmp fallback)."""


def _private_dir_problem(path: Path, missing_ok: bool) -> str | None:
    """Why `path` is not a private directory of this user (None when it is)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None if missing_ok else "does not exist"
    except OSError as error:
        return f"cannot be inspected ({error.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        return f"is mode {stat.S_IMODE(info.st_mode):04o}, not private (0700)"
    return None


def _location(settings: RuntimeSettings) -> _Location:
    if settings.runtime_dir is not None:
        return _Location(settings.runtime_dir, explicit=True)
    if sys.platform in ("win32", "darwin") or not hasattr(os, "geteuid"):
        import platformdirs

        # These platforms' runtime dirs live under the user's home; no XDG warning there.
        return _Location(
            Path(platformdirs.user_runtime_dir(APP_NAME, ensure_exists=False)), explicit=False
        )
    xdg = settings.xdg_runtime_dir
    if xdg is not None and xdg.is_absolute() and _private_dir_problem(xdg, False) is None:
        return _Location(xdg / APP_NAME, explicit=False)
    run_user = Path(f"/run/user/{os.geteuid()}")
    if _private_dir_problem(run_user, False) is None:
        return _Location(run_user / APP_NAME, explicit=False)
    # tempfile reads TMPDIR (and TEMP, TMP) itself: the standard library's own variables.
    base = Path(tempfile.gettempdir()) / f"runtime-{os.geteuid()}"
    return _Location(base / APP_NAME, explicit=False, base=base)


def runtime_dir(settings: RuntimeSettings) -> Path:
    """Where the discovery file and the runtime log live (not created, not checked)."""
    return _location(settings).path


def discovery_path(settings: RuntimeSettings) -> Path:
    return runtime_dir(settings) / FILE_NAME


def _directory_problem(location: _Location) -> DiscoveryProblem | None:
    """What is wrong with the runtime directory as it is now (a missing one is fine)."""
    if location.explicit:
        try:
            info = os.stat(location.path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return DiscoveryProblem(
                UNUSABLE_DIRECTORY,
                f"the runtime directory (SKIPPY_RUNTIME_DIR) cannot be used ({error.strerror})",
            )
        if not stat.S_ISDIR(info.st_mode):
            return DiscoveryProblem(
                UNUSABLE_DIRECTORY, "the runtime directory (SKIPPY_RUNTIME_DIR) is not a directory"
            )
        return None
    for directory in (location.base, location.path):
        if directory is None:
            continue
        problem = _private_dir_problem(directory, missing_ok=True)
        if problem is not None:
            which = "runtime directory" if directory == location.path else "its parent"
            return DiscoveryProblem(
                UNUSABLE_DIRECTORY,
                f"the {which} {problem}; refusing to use it (set SKIPPY_RUNTIME_DIR or "
                "XDG_RUNTIME_DIR to a private directory)",
            )
    return None


def check_runtime_dir(settings: RuntimeSettings) -> None:
    """Raise DiscoveryProblem(`unusable_directory`) if the runtime directory cannot be used as
    it is (without creating it)."""
    problem = _directory_problem(_location(settings))
    if problem is not None:
        raise problem


def ensure_runtime_dir(settings: RuntimeSettings) -> Path:
    """Create the runtime directory (0700) if needed and prove it usable for writing.

    Raises DiscoveryProblem(`unusable_directory`) when it is not a directory, not private (when
    derived), or not writable (for example read-only)."""
    location = _location(settings)
    problem = _directory_problem(location)
    if problem is not None:
        raise problem
    try:
        if location.base is not None:
            with contextlib.suppress(FileExistsError):
                location.base.mkdir(mode=PRIVATE_MODE)
        location.path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_MODE)
    except OSError as error:
        raise DiscoveryProblem(
            UNUSABLE_DIRECTORY, f"the runtime directory cannot be created ({error.strerror})"
        ) from error
    problem = _directory_problem(location)  # it may have been raced into something else
    if problem is not None:
        raise problem
    try:
        fd, probe = tempfile.mkstemp(dir=location.path, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise DiscoveryProblem(
            UNUSABLE_DIRECTORY, f"the runtime directory is not writable ({error.strerror})"
        ) from error
    return location.path


# -- the file -----------------------------------------------------------------------------------


def write_discovery(discovery: Discovery, settings: RuntimeSettings) -> Path:
    """Write the file atomically (0600). For the writer's own pid the identity (`boot_id`,
    `start_ticks`) is stamped when absent."""
    if discovery.pid == os.getpid() and discovery.start_ticks is None:
        discovery = replace(discovery, boot_id=boot_id(), start_ticks=start_ticks(os.getpid()))
    path = ensure_runtime_dir(settings) / FILE_NAME
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".runtime-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, orjson.dumps(asdict(discovery), option=orjson.OPT_INDENT_2))
    finally:
        os.close(fd)
    os.replace(temp, path)
    return path


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when absent; DiscoveryProblem for a file or directory that
    cannot be trusted or read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        return None
    except NotADirectoryError as error:
        raise DiscoveryProblem(
            UNUSABLE_DIRECTORY, "the runtime directory (SKIPPY_RUNTIME_DIR) is not a directory"
        ) from error
    except OSError as error:
        if os.path.islink(path):
            raise DiscoveryProblem(
                UNTRUSTED, "the discovery file is a symbolic link; refusing to follow it"
            ) from error
        raise DiscoveryProblem(
            UNUSABLE_DIRECTORY, f"the discovery file cannot be read ({error.strerror})"
        ) from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DiscoveryProblem(CORRUPT, "the discovery file is not a regular file")
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise DiscoveryProblem(
                UNTRUSTED, f"the discovery file is owned by uid {info.st_uid}, not by this user"
            )
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 1 << 20:
                raise DiscoveryProblem(CORRUPT, "the discovery file is implausibly large")
        return b"".join(chunks)
    except OSError as error:
        raise DiscoveryProblem(
            UNUSABLE_DIRECTORY, f"the discovery file cannot be read ({error.strerror})"
        ) from error
    finally:
        os.close(fd)


def _field(data: dict[str, Any], key: str, kind: type, *, required: bool = True) -> Any:
    if key not in data or data[key] is None:
        if required:
            raise DiscoveryProblem(CORRUPT, f"the discovery file has no {key!r}")
        return None
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DiscoveryProblem(
            CORRUPT,
            f"the discovery file's {key!r} is {_JSON_TYPES.get(type(value), 'a value')}, "
            f"not {_JSON_TYPES[kind]}",
        )
    return value


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or too big
    except ValueError as error:
        raise DiscoveryProblem(CORRUPT, f"the discovery file's url is invalid ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DiscoveryProblem(
            CORRUPT, "the discovery file's url is not an http(s)://host:port address"
        )


def parse_discovery(raw: bytes) -> Discovery:
    """A Discovery from the file's bytes, checked field by field; DiscoveryProblem(`corrupt`)
    for anything a runtime could not have written (or `stale` for a pid above pid_max)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise DiscoveryProblem(CORRUPT, f"the discovery file is not JSON ({error})") from error
    if not isinstance(data, dict):
        raise DiscoveryProblem(CORRUPT, "the discovery file is not a JSON object")
    pid = _field(data, "pid", int)
    if pid <= 0 or pid > PID_MAX_LIMIT:
        raise DiscoveryProblem(CORRUPT, f"the discovery file's pid {pid} is not a process id")
    url = _field(data, "url", str)
    _check_url(url)
    token = _field(data, "token", str)
    if not _PRINTABLE_TOKEN.fullmatch(token):
        raise DiscoveryProblem(CORRUPT, "the discovery file's token is empty or not printable")
    discovery = Discovery(
        pid=pid,
        url=url,
        token=token,
        version=_field(data, "version", str),
        process_instance_id=_field(data, "process_instance_id", str),
        started_at=_field(data, "started_at", str),
        schema_version=_field(data, "schema_version", int, required=False) or SCHEMA_VERSION,
        boot_id=_field(data, "boot_id", str, required=False),
        start_ticks=_field(data, "start_ticks", int, required=False),
        tls_cert=_field(data, "tls_cert", str, required=False),
    )
    if discovery.tls_cert is not None and not (
        discovery.tls_cert and os.path.isabs(discovery.tls_cert)
    ):
        raise DiscoveryProblem(CORRUPT, "the discovery file's tls_cert is not an absolute path")
    if pid > pid_limit():
        raise DiscoveryProblem(
            STALE, f"the discovery file names pid {pid}, above this system's pid_max: not running"
        )
    return discovery


def read_discovery(settings: RuntimeSettings) -> Discovery | None:
    """The live host's discovery, None when there is no file.

    Raises DiscoveryProblem: `stale` when the file names a dead pid or one now held by another
    process, `corrupt` when it cannot be parsed or holds impossible values, `untrusted` for a
    symlink or another user's file, `unusable_directory` when the runtime directory is not a
    (private) directory. Never signals anything but kill(pid, 0) on a valid pid.
    """
    check_runtime_dir(settings)
    raw = _read_bytes(discovery_path(settings))
    if raw is None:
        return None
    discovery = parse_discovery(raw)
    verdict = verify_runtime(discovery)
    if verdict is Verdict.GONE:
        raise DiscoveryProblem(
            STALE, f"the discovery file names pid {discovery.pid}, which is not running"
        )
    if verdict is Verdict.FOREIGN:
        raise DiscoveryProblem(
            STALE,
            f"the discovery file names pid {discovery.pid}, which is now another process "
            "(not the runtime that wrote it)",
        )
    return discovery


def crashed_host(settings: RuntimeSettings) -> Discovery | None:
    """The discovery of a host that died without removing its file (its pid is gone, or now
    another process's), else None: no file, a live host, or a file that is corrupt, untrusted
    or in an unusable directory (those say nothing about a crash). An orderly exit removes the
    file, so a file left behind by a dead pid means the host ended abnormally."""
    try:
        check_runtime_dir(settings)
        raw = _read_bytes(discovery_path(settings))
        if raw is None:
            return None
        discovery = parse_discovery(raw)
    except DiscoveryProblem:
        return None
    if verify_runtime(discovery) in (Verdict.GONE, Verdict.FOREIGN):
        return discovery
    return None


CRASH_NOTE_NAME: Final = "runtime.crashed.json"
"""What is left of a crashed host's discovery file once a command removed it: its process
instance id only (no token, url or pid), for the next host to report (`take_crashed_host`)."""


def note_crashed_host(settings: RuntimeSettings) -> None:
    """Before a stale file is removed: if it names a host that died, keep a note of it for the
    next host. Best effort, never raises (the removal matters more)."""
    crashed = crashed_host(settings)
    if crashed is None:
        return
    path = discovery_path(settings).with_name(CRASH_NOTE_NAME)
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".crashed-", suffix=".json")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, orjson.dumps({"process_instance_id": crashed.process_instance_id}))
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError:
        return


def take_crashed_host(settings: RuntimeSettings) -> str | None:
    """The process instance id of a host that died without removing its discovery file — still
    in place, or noted by the command that removed it — consuming the note, so one crash is
    reported once. None when there is nothing to report."""
    crashed = crashed_host(settings)
    note = discovery_path(settings).with_name(CRASH_NOTE_NAME)
    noted: str | None = None
    try:
        raw = note.read_bytes() if not note.is_symlink() else b""
        note.unlink()
        data = orjson.loads(raw) if raw else None
        value = data.get("process_instance_id") if isinstance(data, dict) else None
        noted = value if isinstance(value, str) else None
    except (OSError, orjson.JSONDecodeError):
        noted = None
    if crashed is not None:
        return crashed.process_instance_id
    return noted


def remove_discovery(settings: RuntimeSettings, expected_pid: int | None = None) -> None:
    """Delete the file (only if it still belongs to `expected_pid`, when given). Never raises
    for a file or directory that is gone or cannot be changed (it runs on shutdown paths)."""
    path = discovery_path(settings)
    if expected_pid is not None:
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return
        if not isinstance(data, dict) or data.get("pid") != expected_pid:
            return
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        path.unlink()


def remove_if_stale(settings: RuntimeSettings) -> bool:
    """Delete a stale, corrupt or untrusted file; True if one was removed. A file in an
    unusable directory is left alone. OSError from the deletion (a read-only directory)
    propagates."""
    try:
        read_discovery(settings)
    except DiscoveryProblem as problem:
        if problem.reason == UNUSABLE_DIRECTORY:
            return False
        note_crashed_host(settings)
        try:
            discovery_path(settings).unlink()
        except FileNotFoundError:
            return False
        return True
    return False
