"""What the API handlers share: the host, the scheduler, the token, identity and limits."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from skippyctl.api.edge import MAX_REQUEST_BODY_BYTES
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.scheduler import Scheduler
from skippyctl.telemetry.metrics import MetricsCollector


@dataclass(slots=True)
class ReconnectLimiter:
    """Per-peer limit on event-stream connections: at most `burst` within `window_s`."""

    burst: int = 20
    window_s: float = 10.0
    _seen: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))

    def allow(self, peer: str) -> bool:
        now = time.monotonic()
        seen = self._seen[peer]
        while seen and now - seen[0] > self.window_s:
            seen.popleft()
        if len(seen) >= self.burst:
            return False
        seen.append(now)
        if len(self._seen) > 4096:  # bounded: forget the quietest peers
            for key in [k for k, v in self._seen.items() if not v][:1024]:
                del self._seen[key]
        return True


@dataclass(slots=True)
class ApiContext:
    host: RuntimeHost
    scheduler: Scheduler
    token: str
    version: str
    model_root: Path | None
    metrics: MetricsCollector
    request_shutdown: Callable[[], None]
    started_wall: float = field(default_factory=time.time)
    keepalive_s: float = 15.0
    stream_queue_size: int = 1024
    limiter: ReconnectLimiter = field(default_factory=ReconnectLimiter)
    max_body_bytes: int = MAX_REQUEST_BODY_BYTES
    """Larger request bodies are refused with 413 while they are read (api/edge.py)."""
    stopping: Callable[[], bool] = lambda: False
    """True once the server is shutting down: long-lived streams end so shutdown is prompt."""

    @property
    def instance_id(self) -> str:
        return str(self.host.pipeline.dispatcher.instance_id)
