"""Fan-out to subscribers, each with its own bounded queue, plus a bounded replay buffer.

The pipeline thread only appends (O(1)) to a subscriber's queue; it never waits for one. A
subscriber whose queue passes half its bound is marked lagging (`subscriber_lagging`, once per
episode); one whose queue is full is disconnected (`subscriber_disconnected`) and its reader is
told so. A callback subscriber that raises is disconnected and counted. Replay keeps the last
`max_replay_records` dispatched records, addressable by cursor `rt1:<instance>:<seq>`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from skippyctl.events.envelope import Event

DEFAULT_SUBSCRIBER_QUEUE_SIZE: Final = 1024
DEFAULT_REPLAY_RECORDS: Final = 4096
# Callback subscribers (metrics, telemetry intake) take what gathered every 20 ms: a bounded
# queue of thousands absorbs that at any realistic event rate.
CALLBACK_GATHER_S: Final = 0.02
CALLBACK_BATCH_ITEMS: Final = 1024


@dataclass(frozen=True, slots=True)
class Dispatched:
    """An event with its process-wide dispatch sequence (the cursor's last part)."""

    sequence: int
    event: Event


class SubscriberStatus(StrEnum):
    CONNECTED = "connected"
    LAGGING = "lagging"
    DISCONNECTED = "disconnected"


class DisconnectReason(StrEnum):
    LAG_BOUND_EXCEEDED = "lag_bound_exceeded"
    SUBSCRIBER_FAILED = "subscriber_failed"
    UNSUBSCRIBED = "unsubscribed"
    SHUTDOWN = "shutdown"


class SubscriptionClosed(Exception):
    """The subscription ended; `reason` says why."""

    def __init__(self, reason: DisconnectReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class Subscription:
    """A pull handle: the consumer thread calls `get`; the pipeline thread calls `offer`."""

    def __init__(self, name: str, max_queue_size: int) -> None:
        self.name = name
        self.max_queue_size = max_queue_size
        self._queue: deque[Dispatched] = deque()
        self._cond = threading.Condition()
        self.status = SubscriberStatus.CONNECTED
        self.disconnect_reason: DisconnectReason | None = None
        self.delivered = 0
        self.lag_episodes = 0

    def offer(self, item: Dispatched) -> SubscriberStatus:
        """Pipeline side. Returns the status after the offer (a change is the caller's news)."""
        return self.offer_many((item,))

    def offer_many(self, items: Sequence[Dispatched]) -> SubscriberStatus:
        """`offer` for each item in order, under one lock, waking the reader at most once."""
        with self._cond:
            was_empty = not self._queue
            queue = self._queue
            if (
                self.status is SubscriberStatus.CONNECTED
                and len(queue) + len(items) <= self.max_queue_size // 2
            ):
                # Nothing below can happen on the way: one extend.
                queue.extend(items)
                items = ()
            for item in items:
                if self.status is SubscriberStatus.DISCONNECTED:
                    break
                if len(self._queue) >= self.max_queue_size:
                    self._disconnect_locked(DisconnectReason.LAG_BOUND_EXCEEDED)
                    break
                self._queue.append(item)
                if (
                    self.status is SubscriberStatus.CONNECTED
                    and len(self._queue) > self.max_queue_size // 2
                ):
                    self.status = SubscriberStatus.LAGGING
                    self.lag_episodes += 1
            # A reader only waits on an empty queue: a non-empty one has been woken already.
            if was_empty and self._queue:
                self._cond.notify()
            return self.status

    def get(self, timeout_s: float | None = None) -> Dispatched | None:
        """Consumer side: the next item, None on timeout; raises SubscriptionClosed when ended
        and drained."""
        items = self.get_many(1, timeout_s)
        return items[0] if items else None

    def get_many(self, max_items: int, timeout_s: float | None = None) -> list[Dispatched]:
        """Consumer side: up to `max_items` queued items in order, waiting up to `timeout_s` for
        the first; [] on timeout; raises SubscriptionClosed when ended and drained."""
        with self._cond:
            if not self._queue and self.status is not SubscriberStatus.DISCONNECTED:
                self._cond.wait(timeout_s)
            if self._queue:
                count = min(max_items, len(self._queue))
                items = [self._queue.popleft() for _ in range(count)]
                self.delivered += count
                if (
                    self.status is SubscriberStatus.LAGGING
                    and len(self._queue) < self.max_queue_size // 4
                ):
                    self.status = SubscriberStatus.CONNECTED
                return items
            if self.status is SubscriberStatus.DISCONNECTED:
                raise SubscriptionClosed(self.disconnect_reason or DisconnectReason.SHUTDOWN)
            return []

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, reason: DisconnectReason) -> None:
        with self._cond:
            self._disconnect_locked(reason, keep_queue=True)

    def _disconnect_locked(self, reason: DisconnectReason, keep_queue: bool = False) -> None:
        if self.status is SubscriberStatus.DISCONNECTED:
            return
        self.status = SubscriberStatus.DISCONNECTED
        self.disconnect_reason = reason
        if not keep_queue:
            self._queue.clear()
        self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class DispatcherStats:
    dispatched: int
    subscribers: int
    lagging: int
    disconnected_lag: int
    disconnected_failed: int
    replay_retained: int
    replay_evicted: int


class Dispatcher:
    """Owned by the pipeline thread for `publish`; subscribe/unsubscribe from any thread."""

    def __init__(self, max_replay_records: int = DEFAULT_REPLAY_RECORDS) -> None:
        self.instance_id = uuid.uuid4()
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self._replay: deque[Dispatched] = deque(maxlen=max_replay_records)
        self._sequence = 0
        self._replay_evicted = 0
        self._disconnected_lag = 0
        self._disconnected_failed = 0
        self.on_status_change: Callable[[Subscription, SubscriberStatus], None] | None = None

    def cursor(self, sequence: int) -> str:
        return f"rt1:{self.instance_id}:{sequence}"

    def subscribe(
        self, name: str, max_queue_size: int = DEFAULT_SUBSCRIBER_QUEUE_SIZE, replay: bool = False
    ) -> Subscription:
        """A new subscription; with `replay`, it first receives what the replay buffer holds."""
        subscription = Subscription(name, max_queue_size)
        with self._lock:
            if replay:
                for item in self._replay:
                    subscription.offer(item)
            self._subscriptions.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        subscription.close(DisconnectReason.UNSUBSCRIBED)
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def publish(self, event: Event) -> Dispatched:
        return self.publish_many((event,))[0]

    def publish_many(self, events: Sequence[Event]) -> list[Dispatched]:
        """Dispatch `events` in order: one lock round and one offer per subscriber for all."""
        if not events:
            return []
        with self._lock:
            first = self._sequence + 1
            items = [Dispatched(first + offset, event) for offset, event in enumerate(events)]
            self._sequence += len(items)
            room = self._replay.maxlen or 0
            self._replay_evicted += max(0, len(self._replay) + len(items) - room)
            self._replay.extend(items)
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            before = subscription.status
            after = subscription.offer_many(items)
            if after is not before:
                self._status_changed(subscription, after)
        return items

    def mark_failed(self, subscription: Subscription) -> None:
        """A callback subscriber raised: disconnect and count it."""
        if subscription.status is not SubscriberStatus.DISCONNECTED:
            subscription.close(DisconnectReason.SUBSCRIBER_FAILED)
            self._status_changed(subscription, SubscriberStatus.DISCONNECTED)

    def _status_changed(self, subscription: Subscription, status: SubscriberStatus) -> None:
        with self._lock:
            if status is SubscriberStatus.DISCONNECTED:
                if subscription.disconnect_reason is DisconnectReason.LAG_BOUND_EXCEEDED:
                    self._disconnected_lag += 1
                elif subscription.disconnect_reason is DisconnectReason.SUBSCRIBER_FAILED:
                    self._disconnected_failed += 1
                if subscription in self._subscriptions:
                    self._subscriptions.remove(subscription)
        if self.on_status_change is not None:
            self.on_status_change(subscription, status)

    def replay_since(self, sequence: int) -> tuple[list[Dispatched], bool]:
        """Records after `sequence`, and whether some were already evicted (a gap)."""
        with self._lock:
            items = [item for item in self._replay if item.sequence > sequence]
            oldest = self._replay[0].sequence if self._replay else self._sequence + 1
        return items, sequence + 1 < oldest and self._replay_evicted > 0

    @property
    def max_replay_records(self) -> int:
        return self._replay.maxlen or 0

    def retained_range(self) -> tuple[int, int]:
        """The oldest and newest sequence still in the replay buffer."""
        with self._lock:
            if not self._replay:
                return self._sequence, self._sequence
            return self._replay[0].sequence, self._replay[-1].sequence

    def close_all(self, reason: DisconnectReason) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
            self._subscriptions.clear()
        for subscription in subscriptions:
            subscription.close(reason)

    def stats(self) -> DispatcherStats:
        with self._lock:
            return DispatcherStats(
                dispatched=self._sequence,
                subscribers=len(self._subscriptions),
                lagging=sum(1 for s in self._subscriptions if s.status is SubscriberStatus.LAGGING),
                disconnected_lag=self._disconnected_lag,
                disconnected_failed=self._disconnected_failed,
                replay_retained=len(self._replay),
                replay_evicted=self._replay_evicted,
            )


def run_callback_subscriber(
    dispatcher: Dispatcher,
    subscription: Subscription,
    callback: Callable[[Dispatched], None],
    name: str,
    gather_s: float = CALLBACK_GATHER_S,
) -> threading.Thread:
    """Run `callback` for each item on its own named thread; an exception disconnects it.

    After each pass the thread sleeps `gather_s` so items gather in the queue: it wakes at most
    about 1/`gather_s` times a second however many events flow, instead of once per event —
    each wake-up is a GIL hand-off taken from the serving path.
    """

    def loop() -> None:
        while True:
            try:
                items = subscription.get_many(CALLBACK_BATCH_ITEMS, 0.5)
            except SubscriptionClosed:
                return
            for item in items:
                try:
                    callback(item)
                except Exception:  # noqa: BLE001 - any subscriber failure disconnects it
                    dispatcher.mark_failed(subscription)
                    return
            if items and gather_s > 0:
                time.sleep(gather_s)

    thread = threading.Thread(target=loop, name=f"skippy-subscriber-{name}", daemon=True)
    thread.start()
    return thread
