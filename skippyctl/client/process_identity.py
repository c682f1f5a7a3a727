"""Whether the pid a discovery file names is the runtime that wrote it, and signalling it only
then.

Invariants:

- Nothing here signals a process that is not the runtime which wrote the file. A pid is used
  only when it is a valid process id (1 ≤ pid ≤ pid_max, never 0 or -1, which address process
  groups or every process); a live pid counts as the runtime only when its identity matches
  (`verify_runtime`: the kernel's start time of the pid and the boot id the file recorded);
  `signal_runtime` verifies the identity through a pidfd, so a pid reused between the check
  and the signal is never hit.
"""

from __future__ import annotations

import enum
import os
import signal
from pathlib import Path
from typing import Final, Protocol

APP_NAME: Final = "skippyctl"
"""The program's name: what a runtime's command line runs, and the runtime directory's name."""
PID_MAX_LIMIT: Final = 2**22
"""The kernel's absolute ceiling for pid_max (PID_MAX_LIMIT on 64-bit Linux)."""
_PROC: Final = Path("/proc")
_BOOT_ID_PATH: Final = _PROC / "sys/kernel/random/boot_id"
_PID_MAX_PATH: Final = _PROC / "sys/kernel/pid_max"
_STAT_STARTTIME_INDEX: Final = 19
"""Field 22 of /proc/<pid>/stat (starttime) is the 20th after the `(comm)` field ends."""


class ProcessIdentity(Protocol):
    """What a discovery file says about the process that wrote it (``Discovery``)."""

    @property
    def pid(self) -> int: ...
    @property
    def boot_id(self) -> str | None: ...
    @property
    def start_ticks(self) -> int | None: ...


class Verdict(enum.Enum):
    """Whether the pid a discovery file names is the runtime that wrote it."""

    VERIFIED = "verified"
    """Alive and its identity matches (or, for a file without identity, its command line is a
    `skippyctl … serve`)."""
    UNVERIFIED = "unverified"
    """Alive, but no /proc to check it with: usable over HTTP, never signalled."""
    GONE = "gone"
    """No such process (or not a valid pid)."""
    FOREIGN = "foreign"
    """Alive, but another process: the pid was reused."""


def pid_limit() -> int:
    """The largest pid this system can hand out now (pid_max, at most PID_MAX_LIMIT)."""
    try:
        return min(int(_PID_MAX_PATH.read_text().strip()), PID_MAX_LIMIT)
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def valid_pid(pid: object) -> bool:
    """True only for an int a single process can have: never 0, -1 or a negative number (those
    address process groups or every process) and never above pid_max."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= pid_limit()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists. Invalid pids are never passed to kill(2)."""
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def boot_id() -> str | None:
    try:
        return _BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """(state letter, start time in clock ticks since boot) of `pid`; None if unknown/gone."""
    if not valid_pid(pid):
        return None
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: the fields after it start after the
    # last ')'; the first of them is the state (field 3).
    fields = raw[raw.rfind(b")") + 1 :].split()
    try:
        return fields[0], int(fields[_STAT_STARTTIME_INDEX])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if unknown or gone."""
    found = _proc_stat(pid)
    return None if found is None else found[1]


def _looks_like_runtime(pid: int) -> bool | None:
    """For a file without identity: is `pid` a `skippyctl … serve` process? None: unknown."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    named = any(Path(a).name == APP_NAME for a in args)
    return named and "serve" in args


def verify_runtime(discovery: ProcessIdentity) -> Verdict:
    """Whether the pid in `discovery` is still the runtime that wrote it (a zombie is gone)."""
    if not pid_alive(discovery.pid):
        return Verdict.GONE
    if not (_PROC / "self" / "stat").exists():
        return Verdict.UNVERIFIED
    found = _proc_stat(discovery.pid)
    if found is None:
        return Verdict.GONE if not pid_alive(discovery.pid) else Verdict.UNVERIFIED
    state, ticks = found
    if state in (b"Z", b"X"):
        return Verdict.GONE
    if discovery.start_ticks is None or discovery.boot_id is None:
        # Written by a version that recorded no identity: the command line must be a runtime.
        looks = _looks_like_runtime(discovery.pid)
        if looks is None:
            return Verdict.UNVERIFIED
        return Verdict.VERIFIED if looks else Verdict.FOREIGN
    if ticks != discovery.start_ticks or boot_id() != discovery.boot_id:
        return Verdict.FOREIGN
    return Verdict.VERIFIED


def signal_runtime(discovery: ProcessIdentity, signum: int) -> bool:
    """Send `signum` to the runtime `discovery` names, only if its identity is verified.

    True when sent. The process is pinned with a pidfd before the identity check, and the
    signal goes through that pidfd: if the pid was reused in between, the pidfd names the dead
    process and nothing else is hit. Without pidfds (old kernels) the window is the few
    microseconds between check and kill(2).
    """
    if not valid_pid(discovery.pid):
        return False
    pidfd: int | None = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(discovery.pid)
        except ProcessLookupError:
            return False
        except OSError:
            pidfd = None  # pidfds unsupported here (ENOSYS, seccomp): fall back to kill(2)
    try:
        if verify_runtime(discovery) is not Verdict.VERIFIED:
            return False
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(discovery.pid, signum)
        except ProcessLookupError:
            return False
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)
