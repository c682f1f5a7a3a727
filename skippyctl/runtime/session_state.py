"""Where sessions' KV state files live between an unload and the next load of the same model.

The host owns the directory (a ``sessions`` subdirectory of the runtime directory, mode 0700,
made private here), the engine writes and reads the files (``engine/kv_state.py``): the host
only names them in ``Shutdown.save`` / ``Load.restore`` and learns the outcome from the engine's
``StateExported`` / ``StateImported`` messages, so the KV bytes never cross the control channel.

- One file per session, named after its opaque logical id (``s-<n>.kvs``): nothing a client
  sent or a prompt holds is in a file name.
- The store remembers which model each file was written for and how big it is. A file is
  offered to the next load of that model id only (the engine checks the model fingerprint
  itself), most recently written first, and removed once the engine reported its import —
  restored or refused: a restored session is saved again at its next unload.
- The cap (``max_bytes``, default :data:`DEFAULT_MAX_BYTES`) bounds the bytes of all stored
  files. An unload's budget is the cap minus what other sessions' files hold; the engine
  writes its sessions most recently used first and skips one that does not fit
  (``cache_state_export_failed``, ``reservation_exhausted``): that session prefills again
  after the reload. Older files are never evicted to make room.
- Session ids are this runtime's own: files a previous runtime left behind mean nothing now and
  are removed when the store opens.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippyctl.config.runtime_settings import DEFAULT_SESSION_STATE_MAX_MIB
from skippyctl.engine.protocol_commands import SessionFile
from skippyctl.engine.protocol_messages import StateExported, StateImported
from skippyctl.events.envelope import LogicalId

DEFAULT_MAX_BYTES: Final = DEFAULT_SESSION_STATE_MAX_MIB * 1024 * 1024
"""Default cap of all stored session state files (the SKIPPY_SESSION_STATE_MAX_MIB setting's
default, 256 MiB)."""
FILE_SUFFIX: Final = ".kvs"
DIRECTORY_NAME: Final = "sessions"


class StateDirectoryUnusable(Exception):
    """The state directory is not a private directory of this user."""


@dataclass(frozen=True, slots=True)
class _Stored:
    model_id: LogicalId
    size_bytes: int
    written_mono: float


class SessionStateStore:
    """The index of stored session state files; thread-safe."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.directory = directory
        self.max_bytes = max_bytes
        self._files: dict[str, _Stored] = {}
        self._lock = threading.Lock()
        _make_private_dir(directory)
        for leftover in directory.iterdir():
            if leftover.suffix in (FILE_SUFFIX, ".tmp") and leftover.is_file():
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def path_for(self, session_id: str) -> str:
        return str(self.directory / f"{session_id}{FILE_SUFFIX}")

    def stored_bytes(self) -> int:
        with self._lock:
            return sum(entry.size_bytes for entry in self._files.values())

    def stored_sessions(self, model_id: LogicalId) -> list[str]:
        with self._lock:
            return [s for s, entry in self._files.items() if entry.model_id == model_id]

    def save_plan(self, session_ids: list[LogicalId]) -> tuple[tuple[SessionFile, ...], int]:
        """The files to name in an unload's ``Shutdown`` and the bytes they may take (the cap
        minus the other stored files; a session's own earlier file is overwritten)."""
        names = {str(s) for s in session_ids}
        with self._lock:
            others = sum(e.size_bytes for s, e in self._files.items() if s not in names)
        files = tuple(SessionFile(s, self.path_for(s)) for s in sorted(names))
        return files, max(0, self.max_bytes - others)

    def restore_plan(self, model_id: LogicalId) -> tuple[tuple[SessionFile, ...], int]:
        """The files written for ``model_id`` (most recent first) and the largest file size
        the engine may read."""
        with self._lock:
            mine = sorted(
                ((s, e) for s, e in self._files.items() if e.model_id == model_id),
                key=lambda item: -item[1].written_mono,
            )
        return tuple(SessionFile(s, self.path_for(s)) for s, _e in mine), self.max_bytes

    def exported(self, model_id: LogicalId, message: StateExported) -> None:
        """The engine's outcome for one file of an unload."""
        with self._lock:
            if message.ok:
                self._files[message.session] = _Stored(
                    model_id, message.size_bytes, time.monotonic()
                )
                return
            self._files.pop(message.session, None)
        self._remove(message.session)

    def imported(self, message: StateImported) -> None:
        """The engine read (or refused) a file: it is used up either way."""
        with self._lock:
            self._files.pop(message.session, None)
        self._remove(message.session)

    def _remove(self, session_id: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path_for(session_id))


def _make_private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StateDirectoryUnusable("the session state directory is not a directory")
    if info.st_uid != os.geteuid():
        raise StateDirectoryUnusable("the session state directory belongs to another user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)
