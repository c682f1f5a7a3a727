"""Client session identities → opaque logical session ids.

A session is named by the client (the OpenAI `user` field or an `X-Session-Id` header). That
name may be anything — an email, a prompt fragment — so it never leaves this registry: every
event and state carries the logical id (`s-<n>`) instead. Bounded (least recently used evicted),
with an idle TTL after which a session is abandoned.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from skippyctl.events.envelope import LogicalId

DEFAULT_MAX_SESSIONS: Final = 512
DEFAULT_SESSION_TTL_S: Final = 600.0


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
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def resolve(
        self, model_id: LogicalId, client_key: str
    ) -> tuple[SessionEntry, bool, SessionEntry | None]:
        """The session for this client key (created if new), whether it is new, and an entry
        evicted to make room (the caller tells the engine and reports it)."""
        key = (model_id, client_key)
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
            entry = SessionEntry(LogicalId(f"s-{next(self._counter)}"), model_id, now)
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

    def drop_model(self, model_id: LogicalId) -> list[SessionEntry]:
        with self._lock:
            keys = [k for k in self._entries if k[0] == model_id]
            return [self._entries.pop(k) for k in keys]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
