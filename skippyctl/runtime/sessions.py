"""Client session identities → opaque logical session ids.

A session is named by the client (the OpenAI `user` field or an `X-Session-Id` header). That
name may be anything — an email, a prompt fragment — so it never leaves this registry: every
event and state carries the logical id (`s-<n>`) instead. Bounded (least recently used evicted),
with an idle TTL after which a session is abandoned.

Sessions whose KV state was saved at an unload (``runtime/session_state.py``) are *parked*: the
client key keeps its logical id while the model is away (bounded like the live entries, least
recently parked dropped first), and a session the next load restored is revived with that id —
so the client's next request with the same key lands in the restored lane. An orderly runtime
stop hands the parked sessions to the store (:meth:`SessionRegistry.parked`) and the next
runtime takes them back (:meth:`SessionRegistry.adopt_parked`).

The registry holds a key's SHA-256 (:func:`key_digest`), never the key itself: nothing a client
sent stays in memory or reaches the disk a stopped runtime leaves behind.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from skippyctl.events.envelope import LogicalId

DEFAULT_MAX_SESSIONS: Final = 512
DEFAULT_SESSION_TTL_S: Final = 600.0
SESSION_ID_PATTERN: Final = re.compile(r"s-([1-9][0-9]{0,17})")
"""A session's logical id: ``s-`` and its number in the runtime that made it."""


def key_digest(client_key: str) -> str:
    """What the registry keeps of a client's session key (hex SHA-256 of its UTF-8)."""
    return hashlib.sha256(client_key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(slots=True)
class SessionEntry:
    session_id: LogicalId
    model_id: LogicalId
    last_used_mono: float
    active_requests: int = 0


class SessionRegistry:
    def __init__(
        self, max_sessions: int = DEFAULT_MAX_SESSIONS, ttl_s: float = DEFAULT_SESSION_TTL_S
    ) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._entries: OrderedDict[tuple[LogicalId, str], SessionEntry] = OrderedDict()
        self._parked: OrderedDict[tuple[LogicalId, str], LogicalId] = OrderedDict()
        self._next_id = 1
        self._lock = threading.Lock()

    def resolve(
        self, model_id: LogicalId, client_key: str
    ) -> tuple[SessionEntry, bool, SessionEntry | None]:
        """The session for this client key (created if new), whether it is new, and an entry
        evicted to make room (the caller tells the engine and reports it)."""
        key = (model_id, key_digest(client_key))
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.last_used_mono = now
                self._entries.move_to_end(key)
                return entry, False, None
            evicted = None
            if len(self._entries) >= self.max_sessions:
                for old_key, old in self._entries.items():
                    if old.active_requests == 0:
                        evicted = self._entries.pop(old_key)
                        break
            # A parked key takes its id back (its restored lane may be waiting for it).
            session_id = self._parked.pop(key, None)
            if session_id is None:
                session_id = LogicalId(f"s-{self._next_id}")
                self._next_id += 1
            entry = SessionEntry(session_id, model_id, now)
            self._entries[key] = entry
            return entry, True, evicted

    def expired(self) -> list[SessionEntry]:
        """Remove and return idle sessions past their TTL."""
        deadline = time.monotonic() - self.ttl_s
        with self._lock:
            keys = [
                k
                for k, e in self._entries.items()
                if e.active_requests == 0 and e.last_used_mono < deadline
            ]
            return [self._entries.pop(k) for k in keys]

    def release(self, session_id: LogicalId) -> None:
        """A request of this session ended: it is idle from now (its TTL starts again)."""
        with self._lock:
            for entry in self._entries.values():
                if entry.session_id == session_id:
                    entry.active_requests = max(0, entry.active_requests - 1)
                    entry.last_used_mono = time.monotonic()
                    return

    def count_for_model(self, model_id: LogicalId) -> int:
        with self._lock:
            return sum(1 for key in self._entries if key[0] == model_id)

    def sessions_of(self, model_id: LogicalId) -> list[LogicalId]:
        """The model's session ids (a snapshot)."""
        with self._lock:
            return [entry.session_id for key, entry in self._entries.items() if key[0] == model_id]

    def drop_model(self, model_id: LogicalId, park: bool = False) -> list[SessionEntry]:
        """Remove the model's sessions; with ``park`` their client keys keep their ids for a
        later :meth:`revive` (an unload that saves the sessions' KV state)."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == model_id]
            dropped = [self._entries.pop(k) for k in keys]
            if park:
                for key, entry in zip(keys, dropped, strict=True):
                    self._parked[key] = entry.session_id
                    self._parked.move_to_end(key)
                while len(self._parked) > self.max_sessions:
                    self._parked.popitem(last=False)
            return dropped

    def revive(self, model_id: LogicalId, session_id: LogicalId) -> bool:
        """A parked session of ``model_id`` was restored: live again under its id (idle, its TTL
        starting now). False when it is not parked (never was, or dropped since)."""
        with self._lock:
            key = next(
                (k for k, s in self._parked.items() if k[0] == model_id and s == session_id), None
            )
            if key is None or key in self._entries:
                return False
            del self._parked[key]
            self._entries[key] = SessionEntry(session_id, model_id, time.monotonic())
            return True

    def model_of(self, session_id: str) -> LogicalId | None:
        """The model of the live session ``session_id`` (None: no such live session)."""
        with self._lock:
            for entry in self._entries.values():
                if entry.session_id == session_id:
                    return entry.model_id
        return None

    def parked(self) -> list[tuple[LogicalId, str, LogicalId]]:
        """Every parked session as (model id, key digest, session id), least recently parked
        first (what an orderly stop leaves for the next runtime)."""
        with self._lock:
            return [(model, digest, session) for (model, digest), session in self._parked.items()]

    def adopt_parked(self, model_id: LogicalId, digest: str, session_id: LogicalId) -> bool:
        """Park a session a previous runtime saved (its key's digest, its id): the key's next
        request takes that id once the model's next load restored it. New ids are made above
        it. False (nothing changed) for an id that is not a session id or is taken."""
        number = SESSION_ID_PATTERN.fullmatch(session_id)
        if number is None or len(digest) != 64:
            return False
        with self._lock:
            taken = session_id in self._parked.values() or any(
                entry.session_id == session_id for entry in self._entries.values()
            )
            if taken:
                return False
            self._parked[(model_id, digest)] = session_id
            self._next_id = max(self._next_id, int(number[1]) + 1)
            while len(self._parked) > self.max_sessions:
                self._parked.popitem(last=False)
            return True

    def unpark(self, model_id: LogicalId, session_id: LogicalId) -> None:
        """Forget a parked session (its state was not saved or could not be restored)."""
        with self._lock:
            for key, parked in list(self._parked.items()):
                if key[0] == model_id and parked == session_id:
                    del self._parked[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
