"""The restart policy of a model whose engine dies while serving (``load --restart``).

With ``on-failure`` the scheduler starts the model's engine again with the same load options:
after a backoff (0.5 s, then 1 s, 2 s: doubling, at most 8 s), and at most ``RESTART_LIMIT``
times within ``RESTART_WINDOW_S``. A restart whose load fails is retried under the same rule,
so a model that cannot come back ends ``failed`` (``model_recovery_failed``) after its limit,
and one that keeps crashing once back (a crash loop) too: every restart counts, whether it
served or not. This module only keeps that count; the scheduler acts on it
(``Scheduler._recover``).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Final

from skippyctl.events.envelope import LogicalId

RESTART_LIMIT: Final = 3
"""Restarts of one model within ``RESTART_WINDOW_S``; the next death ends its recovery."""
RESTART_WINDOW_S: Final = 60.0
FIRST_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 8.0


class RestartBook:
    """When each model id was last restarted (the window's restarts), thread-safe. The
    policy's figures are the module's constants; a test may shorten the backoff."""

    def __init__(self, first_backoff_s: float = FIRST_BACKOFF_S) -> None:
        self.first_backoff_s = first_backoff_s
        self._lock = threading.Lock()
        self._restarts: dict[LogicalId, deque[float]] = {}

    def next_delay_s(self, model_id: LogicalId, now_s: float) -> float | None:
        """How long to wait before restarting ``model_id`` now, or None when it has been
        restarted ``RESTART_LIMIT`` times within the window (its recovery ends)."""
        with self._lock:
            recent = self._recent(model_id, now_s)
            if len(recent) >= RESTART_LIMIT:
                return None
            return float(min(MAX_BACKOFF_S, self.first_backoff_s * 2.0 ** len(recent)))

    def restarted(self, model_id: LogicalId, now_s: float) -> int:
        """Count a restart of ``model_id``; its number within the window (1 for the first)."""
        with self._lock:
            recent = self._recent(model_id, now_s)
            recent.append(now_s)
            return len(recent)

    def forget(self, model_id: LogicalId) -> None:
        """An operator's own load or unload: the next death starts a fresh count."""
        with self._lock:
            self._restarts.pop(model_id, None)

    def _recent(self, model_id: LogicalId, now_s: float) -> deque[float]:
        recent = self._restarts.setdefault(model_id, deque())
        while recent and now_s - recent[0] > RESTART_WINDOW_S:
            recent.popleft()
        return recent
