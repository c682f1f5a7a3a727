"""The drain side of the pipeline: engine rings into one bounded inbox.

One `skippy-drain-<engine>` thread per engine (`EngineChannel`) waits on that engine's
shared-memory ring with the GIL released and hands batches to the pipeline thread through the
`Inbox`. When the inbox is full the drainer stops draining, so pressure lands in the ring, where
it is dropped by class and counted — never on the native producer.

Ordering: an engine's authoritative items are queued after a synchronous final drain of its
ring (`EngineChannel.submit_authority`), so the reconciler sees every native fact written before
the engine returned.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Final, Protocol

from skippyctl.events.envelope import LogicalId
from skippyctl.pipeline.authority import Authoritative
from skippyctl.pipeline.native_adapter import FactColumns

MAX_INBOX_BATCHES: Final = 64
DRAIN_BATCH_RECORDS: Final = 512


class LaneCounts(Protocol):
    @property
    def dropped_full(self) -> int: ...
    @property
    def coalesced(self) -> int: ...


class RingStats(Protocol):
    """What the pipeline reads from a native ring's counters (skippyctl.native.ingress)."""

    @property
    def terminal(self) -> LaneCounts: ...
    @property
    def progress(self) -> LaneCounts: ...
    @property
    def diagnostic(self) -> LaneCounts: ...
    @property
    def unknown_kind(self) -> int: ...
    @property
    def total_rejected(self) -> int: ...
    @property
    def rejected_abi_version(self) -> int:
        """Of ``total_rejected``: records of another event ABI version."""
        ...

    @property
    def log_messages_by_level(self) -> tuple[int, ...]: ...


class NativeRing(Protocol):
    """The host side of one engine's shared-memory ring (skippyctl.native.ingress)."""

    def wait(self, timeout_s: float) -> bool: ...
    def drain_batch(self, max_records: int = ...) -> FactColumns: ...
    def stats(self) -> RingStats: ...


@dataclass(frozen=True, slots=True)
class NativeBatch:
    engine_key: str
    facts: FactColumns


class Inbox:
    """The bounded queue from the drainers (and host authority) to the pipeline thread; every
    put rings the pipeline's doorbell."""

    def __init__(self, doorbell: threading.Event) -> None:
        self._items: deque[NativeBatch | Authoritative] = deque()
        self._lock = threading.Lock()
        self.room = threading.Event()
        """Set while the inbox holds fewer than `MAX_INBOX_BATCHES` items."""
        self.room.set()
        self._doorbell = doorbell

    def put(self, item: NativeBatch | Authoritative) -> None:
        with self._lock:
            self._items.append(item)
            if len(self._items) >= MAX_INBOX_BATCHES:
                self.room.clear()
        self._doorbell.set()

    def size(self) -> int:
        with self._lock:
            return len(self._items)

    def take(self) -> list[NativeBatch | Authoritative]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self.room.set()
        return items


class EngineChannel:
    """One engine's ring and its drainer thread."""

    def __init__(self, inbox: Inbox, key: str, ring: NativeRing) -> None:
        self.key = key
        self.ring = ring
        self._inbox = inbox
        self.model_id: LogicalId | None = None
        """What the channel's summaries are about (set by the host once it knows)."""
        self.logged: tuple[int, ...] = ()
        """`log_messages_by_level` at the last `native_log_summary`."""
        self.next_log_summary = 0.0
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"skippy-drain-{key}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._inbox.room.is_set():
                self._inbox.room.wait(0.05)
                continue
            if self.ring.wait(0.2):
                self.flush()

    def flush(self) -> int:
        """Drain everything pending now, in order, into the pipeline inbox."""
        total = 0
        with self._drain_lock:
            while True:
                facts = self.ring.drain_batch(DRAIN_BATCH_RECORDS)
                if not len(facts):
                    return total
                total += len(facts)
                self._inbox.put(NativeBatch(self.key, facts))

    def submit_authority(self, item: Authoritative) -> None:
        """Queue an authoritative item after every fact the engine has written so far."""
        with self._drain_lock:
            while len(facts := self.ring.drain_batch(DRAIN_BATCH_RECORDS)):
                self._inbox.put(NativeBatch(self.key, facts))
            self._inbox.put(item)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.flush()
