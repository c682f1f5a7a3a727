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
- Across runtimes: an orderly stop (``Scheduler.shutdown``) has each engine write its sessions'
  files and then :meth:`SessionStateStore.persist` writes a manifest (``index.json``, 0600):
  per file its session id, model id, size, when it was written and the SHA-256 of the client's
  session key (never the key). The next store opened on the directory reads it once
  (:attr:`SessionStateStore.persisted`, for the session registry) and removes it; a file it
  does not list, or whose size differs, is removed. The engine still checks each file's
  version, model fingerprint, geometry and digest when it reads it, so a file changed in
  between is refused (``cache_state_import_failed`` with its reason), never loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.config.runtime_settings import DEFAULT_SESSION_STATE_MAX_MIB
from skippyctl.engine.protocol_commands import SessionFile
from skippyctl.engine.protocol_messages import StateExported, StateImported
from skippyctl.events.envelope import LogicalId
from skippyctl.events.identity import is_logical_id
from skippyctl.runtime.sessions import SESSION_ID_PATTERN

DEFAULT_MAX_BYTES: Final = DEFAULT_SESSION_STATE_MAX_MIB * 1024 * 1024
"""Default cap of all stored session state files (the SKIPPY_SESSION_STATE_MAX_MIB setting's
default, 256 MiB)."""
FILE_SUFFIX: Final = ".kvs"
DIRECTORY_NAME: Final = "sessions"
MANIFEST_NAME: Final = "index.json"
MANIFEST_VERSION: Final = 1
MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
"""A manifest larger than this is not read (it lists at most the registry's sessions)."""


class StateDirectoryUnusable(Exception):
    """The state directory is not a private directory of this user."""


@dataclass(frozen=True, slots=True)
class _Stored:
    model_id: LogicalId
    size_bytes: int
    written_mono: float


@dataclass(frozen=True, slots=True)
class PersistedSession:
    """A session an orderly stop of the previous runtime saved, for the session registry."""

    session_id: LogicalId
    model_id: LogicalId
    key_digest: str


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
        self.persisted = self._adopt_previous()
        """The sessions the previous runtime in this directory saved at its orderly stop."""
        for leftover in directory.iterdir():
            unlisted = leftover.stem not in self._files or leftover.suffix != FILE_SUFFIX
            if leftover.suffix in (FILE_SUFFIX, ".tmp") and unlisted and leftover.is_file():
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _adopt_previous(self) -> tuple[PersistedSession, ...]:
        """Index the files the manifest lists (present, regular, of the listed size); the
        manifest is used up."""
        manifest = self.directory / MANIFEST_NAME
        entries = _read_manifest(manifest, self.max_bytes)
        with contextlib.suppress(OSError):
            manifest.unlink()
        now_mono, now_ns = time.monotonic(), time.time_ns()
        adopted: list[PersistedSession] = []
        for entry in entries:
            session_id, size = entry["session_id"], entry["size_bytes"]
            try:
                info = os.lstat(self.path_for(session_id))
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_size != size or session_id in self._files:
                continue
            age_s = max(0.0, (now_ns - entry["written_unix_ns"]) / 1e9)
            model_id = LogicalId(entry["model_id"])
            self._files[session_id] = _Stored(model_id, size, now_mono - age_s)
            adopted.append(PersistedSession(LogicalId(session_id), model_id, entry["key_sha256"]))
        return tuple(adopted)

    def persist(self, parked: Iterable[tuple[LogicalId, str, LogicalId]]) -> int:
        """At an orderly stop, after the engines wrote their files: the manifest of the stored
        files whose sessions are ``parked`` (model id, key digest, session id), for the next
        runtime in this directory (atomically, 0600). How many it lists."""
        now_mono, now_ns = time.monotonic(), time.time_ns()
        with self._lock:
            listed = [
                {
                    "session_id": str(session_id),
                    "model_id": str(model_id),
                    "size_bytes": stored.size_bytes,
                    "written_unix_ns": now_ns - int((now_mono - stored.written_mono) * 1e9),
                    "key_sha256": digest,
                }
                for model_id, digest, session_id in parked
                if (stored := self._files.get(str(session_id))) is not None
                and stored.model_id == model_id
            ]
        document = json.dumps({"version": MANIFEST_VERSION, "sessions": listed}).encode()
        temporary = self.directory / f"{MANIFEST_NAME}.tmp"
        with contextlib.suppress(OSError):
            temporary.unlink()
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(document)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.directory / MANIFEST_NAME)
        return len(listed)

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


def _read_manifest(path: Path, max_file_bytes: int) -> list[dict[str, Any]]:
    """The manifest's well-formed entries; none when it is missing, too large, not JSON or not
    this version (a hostile or damaged manifest only loses sessions, never names a file
    outside the directory: a session id is ``s-<n>``)."""
    try:
        # Never follows a link, never waits on a FIFO: only a regular file is read.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return []
        raw = os.read(descriptor, MAX_MANIFEST_BYTES + 1)
        document = json.loads(raw) if len(raw) <= MAX_MANIFEST_BYTES else None
    except (OSError, ValueError, RecursionError):  # nested past the parser's depth: damaged
        return []
    finally:
        os.close(descriptor)
    if not isinstance(document, dict) or document.get("version") != MANIFEST_VERSION:
        return []
    sessions = document.get("sessions")
    if not isinstance(sessions, list):
        return []
    return [entry for entry in sessions if _well_formed(entry, max_file_bytes)]


def _well_formed(entry: object, max_file_bytes: int) -> bool:
    if not isinstance(entry, dict):
        return False
    session_id, model_id = entry.get("session_id"), entry.get("model_id")
    size, written, digest = (
        entry.get("size_bytes"),
        entry.get("written_unix_ns"),
        entry.get("key_sha256"),
    )
    return (
        isinstance(session_id, str)
        and SESSION_ID_PATTERN.fullmatch(session_id) is not None
        and isinstance(model_id, str)
        and is_logical_id(model_id)
        and type(size) is int
        and 0 < size <= max_file_bytes
        and type(written) is int
        and isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )
