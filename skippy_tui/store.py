"""The dashboard's client-side copy of the reducer, shared between a source thread and the UI.

Contract:

- `SnapshotStore.deliver(item)` runs on the source's thread. Under one short lock it reduces an
  event with the core's pure `reduce` into a `RuntimeView`, appends it to a bounded deque of recent
  events, and updates a few client-side tallies (per-second rates, load phases, ingress pressure,
  decode skips, connection). It never touches the UI and never queues a UI message.
- `SnapshotStore.snapshot()` runs on the UI thread (polled on a timer): an immutable
  `DashboardSnapshot`, rebuilt only when something was delivered since the last call.
- Memory is flat whatever the event rate: the reducer's state is bounded by its caps, the recent
  deque by `max_recent_events`, the rate window by `rate_window_s`, phases by the model cap.

Reducer transitions arriving in the stream (`model_available`, `node_*`, …: projections the
runtime's reducer already made) are kept for the log but not reduced again: a projection is never
fed back in as a fact (ARCHITECTURE.md §3). The client reducer derives the same transitions itself.

A stream that does not begin with the runtime's own start (a replay of one command's `--json`
output, or attaching to a runtime that is already up) is taken to come from a running runtime:
the client reducer starts from `runtime=running` instead of waiting for a `runtime_initialized`
it will never see, so its node state is derived as the runtime's is. A live source that can fetch
the runtime's reduced state sends it with `RuntimeBack(state=...)`, which replaces the guess.

What the runtime may load on demand is in no event: a live source reads it from the state
document and delivers `LoadableModels`, which replaces the snapshot's `loadable` (the same list
again changes nothing, so the panes are not redrawn for it).

Rates are bucketed by the events' own wall-clock second, not by when they arrived, so a replay
shows the recorded rates at any speed and a scripted test renders deterministically; seconds with
no events between two that have some count as zero.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from skippy_tui.sources import (
    DecodeSkipped,
    LoadableModels,
    RuntimeBack,
    RuntimeDown,
    SourceEnded,
    SourceItem,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.native_kinds import load_phase
from skippyctl.events.reasons import Category
from skippyctl.output.codec import SkipReason
from skippyctl.output.state_reader import LoadableEntry
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import LOADING_MODEL_STATES, ModelState, RuntimeState, RuntimeView

DEFAULT_MAX_RECENT_EVENTS: Final = 2000
MAX_DOWNLOADS_SHOWN: Final = 8
"""Downloads the store follows at once (the runtime runs at most 4 pulls)."""
DEFAULT_RATE_WINDOW_S: Final = 60

PROJECTION_IDS: Final = frozenset(
    {
        EventId.NATIVE_MODEL_LOADED,
        EventId.MODEL_AVAILABLE,
        EventId.MODEL_DEGRADED,
        EventId.MODEL_UNAVAILABLE,
        *(event_id for event_id in EventId if event_id.value.startswith("node_")),
        EventId.AVAILABLE_MODEL_SET_CHANGED,
    }
)
"""Ids the runtime's reducer emits as transitions; the client reducer makes its own."""

RUNTIME_START_IDS: Final = frozenset(
    {
        EventId.RUNTIME_RESOLUTION_STARTED,
        EventId.RUNTIME_RESOLUTION_COMPLETED,
        EventId.RUNTIME_RESOLUTION_FAILED,
        EventId.NATIVE_LIBRARY_LOADED,
        EventId.NATIVE_LIBRARY_REJECTED,
        EventId.NATIVE_LIBRARY_UNAVAILABLE,
        EventId.ABI_FEATURE_COMPATIBILITY_ESTABLISHED,
        EventId.ABI_FEATURE_COMPATIBILITY_FAILED,
        EventId.RUNTIME_INITIALIZED,
    }
)
"""Ids a stream from the runtime's very start begins with (anything else: joined mid-stream)."""

_DROP_KEYS: Final = (
    SummaryKey.DROPPED_TERMINAL,
    SummaryKey.DROPPED_STATE,
    SummaryKey.DROPPED_PROGRESS,
    SummaryKey.DROPPED_DIAGNOSTIC,
    SummaryKey.COUNT,
)

# Phase labels are at most 15 characters (the Models pane's phase column).
_PHASES: Final[dict[EventId, str]] = {
    EventId.MODEL_LOAD_REQUESTED: "requested",
    EventId.MODEL_LOAD_STARTED: "opening",
    EventId.BACKEND_DEVICE_SELECTED: "device chosen",
    EventId.MODEL_LOAD_PROGRESS: "loading weights",
    EventId.MODEL_MEMORY_ALLOCATION_SUMMARY: "allocating mem",
    EventId.MODEL_LOAD_PHASE_CHANGED: "loading",
    EventId.NATIVE_MODEL_LOAD_COMPLETED: "weights loaded",
    EventId.SERVING_BACKEND_INITIALIZATION_STARTED: "serving init",
    EventId.KV_CACHE_INITIALIZATION_STARTED: "KV cache init",
}


def phase_of(event: Event) -> str | None:
    """The load phase an event announces, if it is a loading fact. Native kinds share
    `model_load_phase_changed`; the native kind table names the phase of each, and a phase the
    engine observed between its llama.cpp calls is the event's state (`weights loaded`,
    `allocating ctx`, `context ready`)."""
    label = _PHASES.get(event.id)
    if event.id is EventId.MODEL_LOAD_PHASE_CHANGED:
        kind = event.summary_value(SummaryKey.NATIVE_KIND)
        label = (load_phase(int(kind)) if kind is not None else None) or label
        if kind is None and event.state is not None and len(event.state.current) <= 15:
            label = event.state.current
    return label


def drops_in(event: Event) -> int:
    """How many events an `events_dropped_by_class` report says were dropped (all classes)."""
    if event.id is not EventId.EVENTS_DROPPED_BY_CLASS:
        return 0
    return sum(int(event.summary_value(key) or 0) for key in _DROP_KEYS)


class Connection(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DOWN = "down"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class RateSample:
    """Events and reported drops whose wall time falls in one second."""

    second: int
    events: int
    drops: int


@dataclass(frozen=True, slots=True)
class IngressPressure:
    """`ingress_queue_pressure` reports (the core reducer keeps no state for them)."""

    reports: int = 0
    last_depth: int | None = None
    last_capacity: int | None = None


def _empty_skips() -> Mapping[SkipReason, int]:
    return MappingProxyType({})


def _empty_phases() -> Mapping[LogicalId, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Download:
    """A download in the runtime (a pull's ``model_download_*`` events), while it runs."""

    model_id: LogicalId | None
    bytes_done: int = 0
    bytes_total: int | None = None
    bytes_per_s: float | None = None
    started_wall_ns: int = 0
    bytes_at_start: int = 0
    """What a resumed download's partial file already had (not counted in its rate)."""


def _empty_downloads() -> Mapping[str, Download]:
    return MappingProxyType({})


_DOWNLOAD_ENDS: Final = frozenset(
    {
        EventId.MODEL_DOWNLOAD_COMPLETED,
        EventId.MODEL_DOWNLOAD_FAILED,
        EventId.MODEL_DOWNLOAD_CANCELLED,
    }
)


@dataclass(frozen=True, slots=True)
class DashboardSnapshot:
    """Everything the panes draw, at one instant. Immutable; cheap to compare by `version`."""

    version: int = 0
    view: RuntimeView = field(default_factory=RuntimeView)
    recent: tuple[Event, ...] = ()
    """Recent events, oldest first, bounded by the store's `max_recent_events`."""
    events_total: int = 0
    recent_evicted: int = 0
    connection: Connection = Connection.CONNECTING
    reconnect_attempt: int = 0
    phases: Mapping[LogicalId, str] = field(default_factory=_empty_phases)
    rates: tuple[RateSample, ...] = ()
    skipped: Mapping[SkipReason, int] = field(default_factory=_empty_skips)
    ingress: IngressPressure = field(default_factory=IngressPressure)
    downloads: Mapping[str, Download] = field(default_factory=_empty_downloads)
    """Downloads running in the runtime, by their operation id (``pull-N.download``)."""
    loadable: tuple[LoadableEntry, ...] = ()
    """The models the runtime may load on demand that were neither loaded nor loading when the
    source last read them (a live source only)."""


class _RateWindow:
    """Per-second (events, drops) buckets over the last `window_s` seconds of event time."""

    def __init__(self, window_s: int) -> None:
        self.window_s = window_s
        self._buckets: deque[list[int]] = deque(maxlen=window_s)

    def add(self, wall_ns: int, drops: int) -> None:
        second = wall_ns // 1_000_000_000
        buckets = self._buckets
        if not buckets or second > buckets[-1][0]:
            if buckets:
                gap = min(second - buckets[-1][0] - 1, self.window_s)
                first = second - gap
                buckets.extend([first + i, 0, 0] for i in range(gap))
            buckets.append([second, 1, drops])
            return
        offset = buckets[-1][0] - second
        if offset < len(buckets):
            bucket = buckets[-1 - offset]
            if bucket[0] == second:
                bucket[1] += 1
                bucket[2] += drops

    def samples(self) -> tuple[RateSample, ...]:
        return tuple(RateSample(second, events, drops) for second, events, drops in self._buckets)


class SnapshotStore:
    """Reduces delivered items under a lock; hands the UI immutable snapshots."""

    def __init__(
        self,
        max_recent_events: int = DEFAULT_MAX_RECENT_EVENTS,
        rate_window_s: int = DEFAULT_RATE_WINDOW_S,
    ) -> None:
        self.max_recent_events = max_recent_events
        self._lock = threading.Lock()
        self._view = RuntimeView()
        self._recent: deque[Event] = deque(maxlen=max_recent_events)
        self._rates = _RateWindow(rate_window_s)
        self._phases: dict[LogicalId, str] = {}
        self._downloads: dict[str, Download] = {}
        self._loadable: tuple[LoadableEntry, ...] = ()
        self._skipped: dict[SkipReason, int] = {}
        self._ingress = IngressPressure()
        self._connection = Connection.CONNECTING
        self._attempt = 0
        self._events_total = 0
        self._evicted = 0
        self._version = 0
        self._cached = DashboardSnapshot()

    def deliver(self, item: SourceItem) -> None:
        """Source thread: take one item. Bounded work, never blocks on the UI."""
        with self._lock:
            if isinstance(item, LoadableModels) and item.models == self._loadable:
                return  # nothing changed: the snapshot stays the same object
            self._version += 1
            match item:
                case LoadableModels(models=models):
                    self._loadable = models
                case Event():
                    self._take_event(item)
                case RuntimeDown(attempt=attempt):
                    self._connection = Connection.DOWN
                    self._attempt = attempt
                case RuntimeBack(state=state):
                    self._connection = Connection.CONNECTED
                    self._attempt = 0
                    if state is not None:
                        self._view = state
                        self._prune_phases()
                case DecodeSkipped(reason=reason, count=count):
                    self._skipped[reason] = self._skipped.get(reason, 0) + count
                case SourceEnded():
                    self._connection = Connection.ENDED

    def _take_event(self, event: Event) -> None:
        if self._connection is Connection.CONNECTING:
            self._connection = Connection.CONNECTED
        if self._events_total == 0 and event.id not in RUNTIME_START_IDS:
            self._view = dataclasses.replace(self._view, runtime=RuntimeState.RUNNING)
        self._events_total += 1
        if len(self._recent) == self._recent.maxlen:
            self._evicted += 1
        self._recent.append(event)
        self._rates.add(event.wall_ns, drops_in(event))
        if event.id in PROJECTION_IDS:
            return
        self._view, _ = reduce(self._view, event)
        if event.id is EventId.INGRESS_QUEUE_PRESSURE:
            depth = event.summary_value(SummaryKey.QUEUE_DEPTH)
            capacity = event.summary_value(SummaryKey.QUEUE_CAPACITY)
            self._ingress = IngressPressure(
                reports=self._ingress.reports + 1,
                last_depth=None if depth is None else int(depth),
                last_capacity=None if capacity is None else int(capacity),
            )
        if event.category in (Category.MODEL_LOADING, Category.MODEL_AVAILABILITY) or (
            event.category is Category.KV_RUNTIME_STATE
        ):
            self._track_phase(event)
        elif event.category is Category.MODEL_PREPARATION:
            self._track_download(event)

    def _track_download(self, event: Event) -> None:
        key = str(event.operation_id)
        if event.id in _DOWNLOAD_ENDS:
            self._downloads.pop(key, None)
            return
        if event.id is EventId.MODEL_DOWNLOAD_STARTED:
            if len(self._downloads) < MAX_DOWNLOADS_SHOWN:
                at = event.progress
                self._downloads[key] = Download(
                    event.scope.model_id,
                    bytes_done=at.current if at is not None else 0,
                    bytes_total=at.total if at is not None else None,
                    started_wall_ns=event.wall_ns,
                    bytes_at_start=at.current if at is not None else 0,
                )
            return
        known = self._downloads.get(key)
        progress = event.progress
        if event.id is not EventId.MODEL_DOWNLOAD_PROGRESS or known is None or progress is None:
            return
        elapsed_s = (event.wall_ns - known.started_wall_ns) / 1e9
        self._downloads[key] = dataclasses.replace(
            known,
            bytes_done=progress.current,
            bytes_total=progress.total,
            bytes_per_s=(progress.current - known.bytes_at_start) / elapsed_s
            if elapsed_s > 0
            else None,
        )

    def _track_phase(self, event: Event) -> None:
        model_id = event.scope.model_id
        label = phase_of(event)
        if model_id is not None and label is not None:
            model = self._view.models.get(model_id)
            if model is not None and model.state in LOADING_MODEL_STATES:
                self._phases[model_id] = label
        self._prune_phases()

    def _prune_phases(self) -> None:
        models = self._view.models
        for model_id in [
            m
            for m in self._phases
            if m not in models or models[m].state not in LOADING_MODEL_STATES
        ]:
            del self._phases[model_id]

    def snapshot(self) -> DashboardSnapshot:
        """UI thread: the current snapshot (the same object while nothing new arrived)."""
        with self._lock:
            if self._cached.version == self._version:
                return self._cached
            self._cached = DashboardSnapshot(
                version=self._version,
                view=self._view,
                recent=tuple(self._recent),
                events_total=self._events_total,
                recent_evicted=self._evicted,
                connection=self._connection,
                reconnect_attempt=self._attempt,
                phases=MappingProxyType(dict(self._phases)),
                rates=self._rates.samples(),
                skipped=MappingProxyType(dict(self._skipped)),
                ingress=self._ingress,
                downloads=MappingProxyType(dict(self._downloads)),
                loadable=self._loadable,
            )
            return self._cached


def model_phase(snapshot: DashboardSnapshot, model_id: LogicalId, state: ModelState) -> str:
    """What a loading model is doing, for people ("opening", "loading weights", …)."""
    if state is ModelState.INITIALIZING:
        return snapshot.phases.get(model_id, "serving init")
    return snapshot.phases.get(model_id, state.value)
