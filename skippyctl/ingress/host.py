"""Bounded, nonblocking host ingress for runtime (Python-produced) events.

Lanes mirror the native rings' delivery classes:

- terminal/state: a FIFO of `max_state_queue_size`; terminal events may also use
  `terminal_reserve_size` extra places that state transitions cannot take. A terminal refused even
  by the reserve is remembered (bounded) so the pipeline emits a synthetic terminal with reason
  `terminal_not_delivered` for its operation: never silently lost.
- progress: the latest value per operation (and per topology and stage, for link figures); a
  value not greater than the last one accepted or delivered for that operation is suppressed;
  replacing an undelivered value coalesces it. An operation's undelivered progress is delivered
  just before its terminal (the lanes drain state first, which would otherwise put it after).
- diagnostic: a FIFO that samples (keeps one in `diagnostic_sample_every`) above half full and
  drops when full.
- debug: accepted only when enabled.

`submit` never waits: it takes one short lock for O(1) work. Every submit has an outcome, and the
counters conserve exactly: submitted = delivered + coalesced + dropped + rejected + pending.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import DeliveryClass


class SubmitOutcome(StrEnum):
    ACCEPTED = "accepted"
    COALESCED = "coalesced"
    DROPPED_QUEUE_FULL = "dropped_queue_full"
    DROPPED_SAMPLED = "dropped_sampled"
    DROPPED_DISABLED = "dropped_disabled"
    REJECTED_SHUTTING_DOWN = "rejected_shutting_down"


@dataclass(frozen=True, slots=True)
class HostIngressConfig:
    max_state_queue_size: int = 4096
    terminal_reserve_size: int = 1024
    max_progress_operations: int = 1024
    max_diagnostic_queue_size: int = 2048
    diagnostic_sample_every: int = 8
    max_undelivered_terminals: int = 4096
    debug_enabled: bool = False


@dataclass(frozen=True, slots=True)
class LaneCounters:
    submitted: int = 0
    delivered: int = 0
    coalesced: int = 0
    dropped: int = 0
    rejected: int = 0
    pending: int = 0


@dataclass(frozen=True, slots=True)
class HostIngressStats:
    lanes: dict[DeliveryClass, LaneCounters] = field(default_factory=dict)
    sampled: int = 0
    suppressed_regression: int = 0
    terminal_reserve_used: int = 0
    undelivered_terminals: int = 0
    undelivered_terminal_overflow: int = 0

    def total(self, name: str) -> int:
        return sum(int(getattr(counters, name)) for counters in self.lanes.values())


_CLASSES: Final = tuple(DeliveryClass)

_ProgressKey = tuple[LogicalId | None, str, LogicalId | None, LogicalId | None]
"""Operation, event id, topology, stage."""


class _Counter:
    __slots__ = ("coalesced", "delivered", "dropped", "rejected", "submitted")

    def __init__(self) -> None:
        self.submitted = 0
        self.delivered = 0
        self.coalesced = 0
        self.dropped = 0
        self.rejected = 0


@dataclass(frozen=True, slots=True)
class UndeliveredTerminal:
    """An operation whose terminal event could not be queued (the event itself is kept)."""

    event: Event


class HostIngress:
    def __init__(self, config: HostIngressConfig | None = None) -> None:
        self.config = config or HostIngressConfig()
        self._lock = threading.Lock()
        self._closed = False
        self._state: deque[Event] = deque()
        self._progress: OrderedDict[_ProgressKey, Event] = OrderedDict()
        self._pending_ops: Counter[LogicalId | None] = Counter()
        self._state_high_water = 0
        """The most events the state lane held since :meth:`take_state_high_water`."""
        """Undelivered progress values per operation: a terminal looks through ``_progress``
        only when its operation has some (the drain path stays O(1) per terminal)."""
        self._last_progress: OrderedDict[_ProgressKey, int] = OrderedDict()
        self._diagnostic: deque[Event] = deque()
        self._debug: deque[Event] = deque()
        self._undelivered: deque[UndeliveredTerminal] = deque()
        self._counters = {cls: _Counter() for cls in _CLASSES}
        self._sampled = 0
        self._sample_tick = 0
        self._suppressed = 0
        self._reserve_used = 0
        self._undelivered_overflow = 0
        self.doorbell = threading.Event()

    # -- producer side ----------------------------------------------------------------------
    def submit(self, event: Event) -> SubmitOutcome:
        delivery = event.delivery
        with self._lock:
            counter = self._counters[delivery]
            counter.submitted += 1
            if self._closed:
                counter.rejected += 1
                return SubmitOutcome.REJECTED_SHUTTING_DOWN
            if delivery is DeliveryClass.PROGRESS:
                outcome = self._submit_progress(event, counter)
            elif delivery is DeliveryClass.DIAGNOSTIC:
                outcome = self._submit_bounded(
                    self._diagnostic, event, counter, self.config.max_diagnostic_queue_size, True
                )
            elif delivery is DeliveryClass.DEBUG:
                if not self.config.debug_enabled:
                    counter.dropped += 1
                    return SubmitOutcome.DROPPED_DISABLED
                outcome = self._submit_bounded(
                    self._debug, event, counter, self.config.max_diagnostic_queue_size, False
                )
            else:
                outcome = self._submit_state(event, delivery, counter)
        # Ring only when it is not ringing (`Event.set` takes a lock and notifies every time).
        # No wake-up is lost: the event was queued before this check, and `drain` clears the
        # bell under the lock before it takes the queue, so it takes this event with it.
        if (
            outcome is SubmitOutcome.ACCEPTED or outcome is SubmitOutcome.COALESCED
        ) and not self.doorbell.is_set():
            self.doorbell.set()
        return outcome

    def _submit_state(
        self, event: Event, delivery: DeliveryClass, counter: _Counter
    ) -> SubmitOutcome:
        size = len(self._state)
        if size >= self._state_high_water:
            self._state_high_water = size + 1
        if size < self.config.max_state_queue_size:
            self._state.append(event)
            return SubmitOutcome.ACCEPTED
        if (
            delivery is DeliveryClass.TERMINAL
            and size < self.config.max_state_queue_size + self.config.terminal_reserve_size
        ):
            self._reserve_used += 1
            self._state.append(event)
            return SubmitOutcome.ACCEPTED
        counter.dropped += 1
        if delivery is DeliveryClass.TERMINAL:
            if len(self._undelivered) < self.config.max_undelivered_terminals:
                self._undelivered.append(UndeliveredTerminal(event))
            else:
                self._undelivered_overflow += 1
        return SubmitOutcome.DROPPED_QUEUE_FULL

    def _submit_progress(self, event: Event, counter: _Counter) -> SubmitOutcome:
        # A stage's link figures carry no operation once the model serves: the stage is what
        # tells one link's latest value from another's.
        key = (event.operation_id, event.id.value, event.scope.topology_id, event.scope.stage_id)
        value = event.progress.current if event.progress is not None else 0
        last = self._last_progress.get(key)
        if last is not None and value <= last:
            self._suppressed += 1
            counter.coalesced += 1
            return SubmitOutcome.COALESCED
        if key in self._progress:
            counter.coalesced += 1  # the undelivered older value will never be delivered
            self._progress[key] = event
            self._progress.move_to_end(key)
        elif len(self._progress) >= self.config.max_progress_operations:
            counter.dropped += 1
            return SubmitOutcome.DROPPED_QUEUE_FULL
        else:
            self._progress[key] = event
            self._pending_ops[event.operation_id] += 1
        self._last_progress[key] = value
        self._last_progress.move_to_end(key)
        while len(self._last_progress) > 4 * self.config.max_progress_operations:
            self._last_progress.popitem(last=False)
        return SubmitOutcome.ACCEPTED

    def _submit_bounded(
        self, lane: deque[Event], event: Event, counter: _Counter, capacity: int, sample: bool
    ) -> SubmitOutcome:
        size = len(lane)
        if size >= capacity:
            counter.dropped += 1
            return SubmitOutcome.DROPPED_QUEUE_FULL
        if sample and size >= capacity // 2:
            self._sample_tick += 1
            if self._sample_tick % self.config.diagnostic_sample_every != 0:
                counter.dropped += 1
                self._sampled += 1
                return SubmitOutcome.DROPPED_SAMPLED
        lane.append(event)
        return SubmitOutcome.ACCEPTED

    # -- consumer side (the pipeline thread) ----------------------------------------------------
    def drain(self, max_events: int = 1024) -> list[Event]:
        """Take up to `max_events`: state/terminal first, then progress, diagnostics, debug."""
        out: list[Event] = []
        with self._lock:
            self.doorbell.clear()
            while self._state and len(out) < max_events:
                event = self._state.popleft()
                self._counters[event.delivery].delivered += 1
                if event.delivery is DeliveryClass.TERMINAL and event.operation_id is not None:
                    out += self._progress_before_terminal(event.operation_id)
                    self._forget_progress(event.operation_id)
                out.append(event)
            while self._progress and len(out) < max_events:
                _, event = self._progress.popitem(last=False)
                self._taken_progress(event.operation_id, 1)
                self._counters[DeliveryClass.PROGRESS].delivered += 1
                out.append(event)
            for lane in (self._diagnostic, self._debug):
                while lane and len(out) < max_events:
                    event = lane.popleft()
                    self._counters[event.delivery].delivered += 1
                    out.append(event)
            if self._pending_locked():
                self.doorbell.set()
        return out

    def _progress_before_terminal(self, operation_id: LogicalId) -> list[Event]:
        """The operation's undelivered progress, taken now: it was submitted before its
        terminal, so it is delivered before it (per-operation order), never after."""
        if not self._pending_ops[operation_id]:
            return []
        keys = [key for key in self._progress if key[0] == operation_id]
        self._counters[DeliveryClass.PROGRESS].delivered += len(keys)
        self._taken_progress(operation_id, len(keys))
        return [self._progress.pop(key) for key in keys]

    def _taken_progress(self, operation_id: LogicalId | None, count: int) -> None:
        left = self._pending_ops[operation_id] - count
        if left > 0:
            self._pending_ops[operation_id] = left
        else:
            del self._pending_ops[operation_id]

    def _forget_progress(self, operation_id: LogicalId) -> None:
        for key in [k for k in self._last_progress if k[0] == operation_id]:
            del self._last_progress[key]

    def take_undelivered_terminals(self) -> list[UndeliveredTerminal]:
        with self._lock:
            taken = list(self._undelivered)
            self._undelivered.clear()
        return taken

    def _pending_locked(self) -> int:
        return len(self._state) + len(self._progress) + len(self._diagnostic) + len(self._debug)

    def take_state_high_water(self) -> int:
        """The most events the state/terminal lane held since the last call (then reset)."""
        with self._lock:
            high, self._state_high_water = self._state_high_water, len(self._state)
            return high

    def pending(self) -> int:
        with self._lock:
            return self._pending_locked()

    def close(self) -> None:
        """Refuse new submissions (`rejected_shutting_down`); pending ones stay drainable."""
        with self._lock:
            self._closed = True
        self.doorbell.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> HostIngressStats:
        with self._lock:
            pending = {
                DeliveryClass.TERMINAL: sum(
                    1 for e in self._state if e.delivery is DeliveryClass.TERMINAL
                ),
                DeliveryClass.STATE_TRANSITION: sum(
                    1 for e in self._state if e.delivery is DeliveryClass.STATE_TRANSITION
                ),
                DeliveryClass.PROGRESS: len(self._progress),
                DeliveryClass.DIAGNOSTIC: len(self._diagnostic),
                DeliveryClass.DEBUG: len(self._debug),
            }
            lanes = {
                cls: LaneCounters(
                    submitted=c.submitted,
                    delivered=c.delivered,
                    coalesced=c.coalesced,
                    dropped=c.dropped,
                    rejected=c.rejected,
                    pending=pending[cls],
                )
                for cls, c in self._counters.items()
            }
            return HostIngressStats(
                lanes=lanes,
                sampled=self._sampled,
                suppressed_regression=self._suppressed,
                terminal_reserve_used=self._reserve_used,
                undelivered_terminals=len(self._undelivered),
                undelivered_terminal_overflow=self._undelivered_overflow,
            )
