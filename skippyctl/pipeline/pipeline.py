"""The pipeline thread: takes the drained native batches (pipeline.drain) and host ingress,
adapts, reconciles, reduces, dispatches — and reports its own health, rate-limited.

Threads (all named): one `skippy-pipeline` thread owns the adapter, reconciler, reducer state
and dispatch; the engines' `skippy-drain-<engine>` threads (pipeline.drain) feed its bounded
inbox.

Ordering: authoritative items from an engine are queued after a synchronous final drain of its
ring (pipeline.drain), so the reconciler sees every native fact written before the engine
returned. Each cycle
takes the inbox snapshot before draining host ingress and reduces the host events first, so a host
event submitted before an engine fact is always reduced before it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event, summaries
from skippyctl.events.reasons import Category, DeliveryClass, Outcome, Producer, ReasonCode
from skippyctl.ingress.host import HostIngress, HostIngressConfig, HostIngressStats, SubmitOutcome
from skippyctl.pipeline.authority import Authoritative, OperationBound
from skippyctl.pipeline.dispatch import (
    DisconnectReason,
    Dispatcher,
    DispatcherStats,
    SubscriberStatus,
    Subscription,
)
from skippyctl.pipeline.drain import EngineChannel, Inbox, NativeBatch, NativeRing
from skippyctl.pipeline.native_adapter import AdapterCounters, NativeAdapter
from skippyctl.pipeline.reconcile import Reconciler, ReconcilerCounters
from skippyctl.pipeline.warnings import SOURCE_EVENTS as WARNING_SOURCES
from skippyctl.pipeline.warnings import WarningCounters, WarningDeriver
from skippyctl.reducer.reduce import BatchReducer
from skippyctl.reducer.state import RuntimeView

HEALTH_INTERVAL_S: Final = 0.5
LOG_SUMMARY_INTERVAL_S: Final = 5.0
"""The window of `native_log_summary`: at most one per engine per window (and one when an
engine detaches, for what its last window counted)."""
# ggml_log_level indexes of `log_messages_by_level` (NONE, DEBUG, INFO, WARN, ERROR, CONT).
_LOG_WARN: Final = 3
_LOG_ERROR: Final = 4

HEALTH_REPORTS: Final = frozenset(
    {
        EventId.EVENTS_DROPPED_BY_CLASS,
        EventId.EVENTS_COALESCED,
        EventId.EVENTS_SAMPLED,
        EventId.UNKNOWN_NATIVE_EVENT_RECEIVED,
        EventId.REDUCER_ERROR,
        EventId.SUBSCRIBER_LAGGING,
        EventId.SUBSCRIBER_DISCONNECTED,
    }
)
"""The event system's own health reports (`_report_health`, rate-limited), made from its
counters; it also forwards the rings' protocol violations and llama.cpp log counts."""

# The failure terminal that stands in for an undelivered terminal of each family.
SYNTHETIC_TERMINALS: Final[dict[Category, EventId]] = {
    Category.MODEL_LOADING: EventId.MODEL_LOAD_FAILED,
    Category.MODEL_AVAILABILITY: EventId.SERVING_BACKEND_INITIALIZATION_FAILED,
    Category.MODEL_UNLOADING: EventId.UNLOAD_FAILED,
    Category.MODEL_PREPARATION: EventId.MODEL_PREPARATION_FAILED,
    Category.SESSION: EventId.SESSION_FAILED,
    Category.REQUEST: EventId.REQUEST_FAILED,
    Category.PREFILL: EventId.PREFILL_FAILED,
    Category.GENERATION: EventId.GENERATION_FAILED,
    Category.STAGE_TOPOLOGY: EventId.STAGE_FAILED,
    Category.KV_RUNTIME_STATE: EventId.KV_CACHE_INITIALIZATION_FAILED,
    Category.RESOURCE_HEALTH: EventId.COMPUTE_FAILURE,
    Category.NATIVE_RUNTIME: EventId.RUNTIME_CRASHED,
    Category.DIAGNOSTIC: EventId.INVARIANT_PROTOCOL_VIOLATION,
}


@dataclass(frozen=True, slots=True)
class EventSystemHealth:
    """The queryable event-system health (also reported as events, rate-limited)."""

    host_ingress: HostIngressStats
    native_dropped: int
    native_coalesced: int
    native_rejected: int
    native_foreign_schema: int
    """Of ``native_rejected``: records of another event ABI version."""
    native_unknown: int
    dispatcher: DispatcherStats
    adapter: AdapterCounters
    reconciler: ReconcilerCounters
    reducer_rejected: int
    reducer_duplicates: int
    inbox_batches: int
    health_events_emitted: int
    native_facts_processed: int
    warnings: WarningCounters = field(default_factory=WarningCounters)


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    drained_in_time: bool
    undelivered: int


INGRESS_PRESSURE_FRACTION: Final = 0.5
"""A state/terminal lane this full (of ``max_state_queue_size``) at any moment between two health
reports is under pressure: producers outrun the pipeline (drops begin at the bound)."""


@dataclass(slots=True)
class _HealthMarks:
    ingress_pressure: bool = False
    """The last report found the state lane past :data:`INGRESS_PRESSURE_FRACTION` (re-armed
    once a report finds it below half of that)."""
    dropped: dict[str, int] = field(default_factory=dict)
    coalesced: int = 0
    sampled: int = 0
    unknown: int = 0
    reducer_rejected: int = 0
    native_rejected: int = 0
    native_foreign_schema: int = 0
    status_changes: deque[tuple[str, SubscriberStatus]] = field(default_factory=deque)
    emitted: int = 0


class Pipeline:
    def __init__(
        self,
        ingress_config: HostIngressConfig | None = None,
        max_replay_records: int = 4096,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.ingress = HostIngress(ingress_config)
        self.dispatcher = Dispatcher(max_replay_records)
        self.dispatcher.on_status_change = self._on_subscriber_status
        self.adapter = NativeAdapter()
        self.reconciler = Reconciler()
        self.warnings = WarningDeriver()
        """Structured warnings derived from source events (pipeline thread only)."""
        self._state = RuntimeView()
        """The last published snapshot: immutable, what every other thread reads."""
        self._reducer = BatchReducer(self._state)
        """The working copy the events since the last publish were reduced into (pipeline
        thread only); `_publish_state` swaps its snapshot into `_state` once per batch."""
        self._state_lock = threading.Lock()
        self._state_changed = threading.Condition(self._state_lock)
        self._doorbell = self.ingress.doorbell
        self._inbox = Inbox(self._doorbell)
        self._engines: dict[str, EngineChannel] = {}
        self._debug_lock = threading.Lock()
        """One reader at a time for the engines' debug-log rings."""
        self._stopping = threading.Event()
        self._health_interval_s = health_interval_s
        self._health = _HealthMarks()
        self._next_health = 0.0
        self._reducer_errors = 0
        self._internal_errors = 0
        self._native_facts_processed = 0
        self._outbox: list[Event] = []
        """Reduced events of the current inbox item, dispatched together (`_publish_outbox`)."""
        self._thread = threading.Thread(target=self._run, name="skippy-pipeline", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Pipeline:
        self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 2.0) -> ShutdownReport:
        """Stop accepting, drain what is pending within `timeout_s`, end subscriptions.

        Idempotent and bounded. Reports how many pending items could not be processed.
        """
        self.ingress.close()
        for channel in list(self._engines.values()):
            channel.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.ingress.pending() or self._inbox.size()):
            self._doorbell.set()
            time.sleep(0.01)
        self._stopping.set()
        self._doorbell.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()) + 0.5)
        undelivered = self.ingress.pending() + self._inbox.size()
        self.dispatcher.close_all(DisconnectReason.SHUTDOWN)
        return ShutdownReport(drained_in_time=undelivered == 0, undelivered=undelivered)

    # -- producers ------------------------------------------------------------------------------
    def submit(self, event: Event) -> SubmitOutcome:
        return self.ingress.submit(event)

    def submit_authority(self, item: Authoritative) -> None:
        """Queue an authoritative item that belongs to no engine ring (host decisions)."""
        self._inbox.put(item)

    def attach_engine(
        self, key: str, ring: NativeRing, model_id: LogicalId | None = None
    ) -> EngineChannel:
        channel = EngineChannel(self._inbox, key, ring)
        channel.model_id = model_id
        self._engines[key] = channel
        return channel

    def detach_engine(self, key: str) -> None:
        channel = self._engines.pop(key, None)
        if channel is not None:
            channel.close()
            # The engine's last window of llama.cpp log counts (a load's, when it never served).
            summary = self._log_summary(channel, force=True)
            if summary is not None:
                self.submit(summary)

    def subscribe(
        self, name: str, max_queue_size: int = 1024, replay: bool = False
    ) -> Subscription:
        return self.dispatcher.subscribe(name, max_queue_size, replay)

    # -- state ----------------------------------------------------------------------------------
    @property
    def state(self) -> RuntimeView:
        with self._state_lock:
            return self._state

    def wait_state(
        self, predicate: Callable[[RuntimeView], bool], timeout_s: float
    ) -> RuntimeView | None:
        """Block until the reduced state satisfies `predicate`; None on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._state_changed:
            while not predicate(self._state):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._state_changed.wait(remaining)
            return self._state

    def native_debug_log(self, max_lines: int) -> list[tuple[LogicalId | None, list[str], int]]:
        """Drain each engine's opt-in debug-log ring (raw llama.cpp lines; present only with
        `--capture-debug-log`): per engine its model id, its last `max_lines` lines and how many
        earlier ones were cut. Rings without a debug reader are skipped. Raw text: callers
        redact it before it leaves the host."""
        out: list[tuple[LogicalId | None, list[str], int]] = []
        with self._debug_lock:
            for channel in list(self._engines.values()):
                reader = getattr(channel.ring, "read_debug_log", None)
                if reader is None:
                    continue
                try:
                    lines = list(reader())
                except Exception:  # noqa: BLE001 - a closed ring has nothing to give
                    continue
                cut = max(0, len(lines) - max_lines)
                out.append((channel.model_id, lines[cut:], cut))
        return out

    def health(self) -> EventSystemHealth:
        dropped = coalesced = rejected = foreign = unknown = 0
        for channel in list(self._engines.values()):
            stats = channel.ring.stats()
            lanes = (stats.terminal, stats.progress, stats.diagnostic)
            dropped += sum(lane.dropped_full for lane in lanes)
            coalesced += sum(lane.coalesced for lane in lanes)
            rejected += stats.total_rejected
            foreign += stats.rejected_abi_version
            unknown += stats.unknown_kind
        state = self.state
        return EventSystemHealth(
            host_ingress=self.ingress.stats(),
            native_dropped=dropped,
            native_coalesced=coalesced,
            native_rejected=rejected,
            native_foreign_schema=foreign,
            native_unknown=unknown + self.adapter.counters.unknown,
            dispatcher=self.dispatcher.stats(),
            adapter=self.adapter.counters,
            reconciler=self.reconciler.counters,
            reducer_rejected=state.counters.rejected_transitions
            + self._reducer_errors
            + self._internal_errors,
            reducer_duplicates=state.counters.duplicate_transitions,
            inbox_batches=self._inbox.size(),
            health_events_emitted=self._health.emitted,
            native_facts_processed=self._native_facts_processed,
            warnings=self.warnings.counters,
        )

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._doorbell.wait(self._health_interval_s)
                self._guarded(self._cycle)
                now = time.monotonic()
                if now >= self._next_health:
                    self._next_health = now + self._health_interval_s
                    self._guarded(self._report_health)
            self._guarded(self._cycle)
        finally:
            # Whatever ends this thread, readers must not wait for events that cannot come,
            # nor miss the state of events reduced before a defect stopped a cycle.
            self._publish_state()
            self.dispatcher.close_all(DisconnectReason.SHUTDOWN)

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run one pipeline step; a defect in it is counted, never fatal to the thread."""
        try:
            step()
        except Exception:  # noqa: BLE001 - the pipeline thread must outlive any single defect
            self._internal_errors += 1

    def _cycle(self) -> None:
        while True:
            items = self._inbox.take()
            events = self.ingress.drain()
            if not items and not events:
                break
            for event in events:
                self._process(event, notify=False)
            self._publish_outbox()
            for item in items:
                if isinstance(item, NativeBatch):
                    self._process_batch(item)
                else:
                    if isinstance(item, OperationBound):
                        self.adapter.bind(item)
                    for event in self.reconciler.on_authority(item):
                        self._process(event, notify=False)
                self._publish_outbox()
            self._notify_state()
        for undelivered in self.ingress.take_undelivered_terminals():
            self._process(self._synthetic_terminal(undelivered.event))

    def _process_batch(self, batch: NativeBatch) -> None:
        # The reconciler decides from its own records alone, so a batch's events can be taken
        # from it before any is reduced.
        on_native = self.reconciler.on_native
        # A fact outside any operation (a fatal ggml abort while serving) is about the model
        # the engine serves.
        engine_model = self.reconciler.model_of_engine(batch.engine_key)
        events = [
            e
            for adapted in self.adapter.adapt_batch(batch.facts, engine_model)
            for e in on_native(adapted)
        ]
        for event in events:
            self._process(event, notify=False)
        self._native_facts_processed += len(batch.facts)

    def _process(self, event: Event, notify: bool = True) -> None:
        """Reduce and queue one event. With `notify=False` the caller publishes the state,
        wakes state waiters and dispatches the batch's events once for a whole batch
        (`_publish_outbox`, `_notify_state`); with `notify=True` this event is its own batch.
        """
        try:
            working, transitions = self._reducer.reduce(event)
        except Exception:  # noqa: BLE001 - the reducer is total by contract; count, never die
            self._reducer_errors += 1
            working, transitions = self._reducer.state, ()
        self._outbox.append(event)
        self._outbox.extend(transitions)
        if event.id in WARNING_SOURCES:
            try:
                # The working copy, read during the call only (it changes in place later).
                derived = self.warnings.derive(event, working)
            except Exception:  # noqa: BLE001 - diagnostics never cost the event that caused them
                self._internal_errors += 1
                derived = []
            for warning in derived:
                self._reduce_derived(warning)
        if notify:
            self._notify_state()
            self._publish_outbox()

    def _reduce_derived(self, event: Event) -> None:
        """Reduce and queue a derived diagnostic (a warning): never derived from again."""
        try:
            _, transitions = self._reducer.reduce(event)
        except Exception:  # noqa: BLE001 - the reducer is total by contract; count, never die
            self._reducer_errors += 1
            transitions = ()
        self._outbox.append(event)
        self._outbox.extend(transitions)

    def _publish_state(self) -> None:
        """End the reducer's batch: its immutable snapshot becomes what readers see."""
        if self._reducer.pending:
            # Only this thread writes `_state`; a reference swap is atomic, readers copy it.
            self._state = self._reducer.publish()

    def _publish_outbox(self) -> None:
        # The state first: a subscriber that reads `state` after an event finds it reduced.
        self._publish_state()
        if self._outbox:
            events, self._outbox = self._outbox, []
            self.dispatcher.publish_many(events)

    def _notify_state(self) -> None:
        self._publish_state()
        with self._state_changed:
            self._state_changed.notify_all()

    @staticmethod
    def _synthetic_terminal(lost: Event) -> Event:
        return make_event(
            SYNTHETIC_TERMINALS.get(lost.category, EventId.INVARIANT_PROTOCOL_VIOLATION),
            Producer.RECONCILED,
            operation_id=lost.operation_id,
            scope=lost.scope,
            outcome=Outcome.FAILURE,
            reason_code=ReasonCode.TERMINAL_NOT_DELIVERED,
        )

    # -- health (rate-limited; never fed back into ingress) --------------------------------------
    def _on_subscriber_status(self, subscription: Subscription, status: SubscriberStatus) -> None:
        marks = self._health.status_changes
        if len(marks) < 64:
            marks.append((subscription.name, status))

    def _ingress_pressure(self, marks: _HealthMarks) -> list[Event]:
        """``ingress_queue_pressure`` once the state/terminal lane has held more than
        :data:`INGRESS_PRESSURE_FRACTION` of its bound since the last report (its peak and
        bound as figures); again only after it fell below half that."""
        capacity = self.ingress.config.max_state_queue_size
        peak = self.ingress.take_state_high_water()
        if peak >= capacity * INGRESS_PRESSURE_FRACTION:
            if marks.ingress_pressure:
                return []
            marks.ingress_pressure = True
            return [
                make_event(
                    EventId.INGRESS_QUEUE_PRESSURE,
                    summaries=summaries(queue_depth=peak, queue_capacity=capacity),
                )
            ]
        if peak < capacity * INGRESS_PRESSURE_FRACTION / 2:
            marks.ingress_pressure = False
        return []

    def _report_health(self) -> None:
        health = self.health()
        marks = self._health
        lanes = health.host_ingress.lanes
        dropped = {cls.value: counters.dropped for cls, counters in lanes.items()}
        dropped["native"] = health.native_dropped
        delta = {key: value - marks.dropped.get(key, 0) for key, value in dropped.items()}
        reports: list[Event] = []
        if any(value > 0 for value in delta.values()):
            reports.append(
                make_event(
                    EventId.EVENTS_DROPPED_BY_CLASS,
                    summaries=summaries(
                        dropped_terminal=delta.get(DeliveryClass.TERMINAL.value),
                        dropped_state=delta.get(DeliveryClass.STATE_TRANSITION.value),
                        dropped_progress=delta.get(DeliveryClass.PROGRESS.value),
                        dropped_diagnostic=delta.get(DeliveryClass.DIAGNOSTIC.value),
                        count=delta.get("native"),
                    ),
                )
            )
        marks.dropped = dropped
        reports += self._ingress_pressure(marks)
        coalesced = (
            health.host_ingress.total("coalesced")
            + health.native_coalesced
            + health.adapter.coalesced
        )
        if coalesced > marks.coalesced:
            reports.append(
                make_event(
                    EventId.EVENTS_COALESCED,
                    summaries=summaries(coalesced=coalesced - marks.coalesced),
                )
            )
            marks.coalesced = coalesced
        sampled = health.host_ingress.sampled + health.adapter.sampled
        if sampled > marks.sampled:
            reports.append(
                make_event(
                    EventId.EVENTS_SAMPLED, summaries=summaries(sampled=sampled - marks.sampled)
                )
            )
            marks.sampled = sampled
        if health.native_unknown > marks.unknown:
            reports.append(
                make_event(
                    EventId.UNKNOWN_NATIVE_EVENT_RECEIVED,
                    summaries=summaries(count=health.native_unknown - marks.unknown),
                )
            )
            marks.unknown = health.native_unknown
        if health.reducer_rejected > marks.reducer_rejected:
            reports.append(
                make_event(
                    EventId.REDUCER_ERROR,
                    summaries=summaries(rejected=health.reducer_rejected - marks.reducer_rejected),
                )
            )
            marks.reducer_rejected = health.reducer_rejected
        lagging = disconnected = 0
        while marks.status_changes:
            _, status = marks.status_changes.popleft()
            lagging += status is SubscriberStatus.LAGGING
            disconnected += status is SubscriberStatus.DISCONNECTED
        if lagging:
            reports.append(
                make_event(EventId.SUBSCRIBER_LAGGING, summaries=summaries(count=lagging))
            )
        if disconnected:
            reports.append(
                make_event(EventId.SUBSCRIBER_DISCONNECTED, summaries=summaries(count=disconnected))
            )
        foreign = health.native_foreign_schema
        if foreign > marks.native_foreign_schema:
            # Records of another event ABI version (a native producer built for another
            # schema): ignored whole by the ring, as the schema says.
            reports.append(
                make_event(
                    EventId.EVENT_SCHEMA_INCOMPATIBILITY,
                    outcome=Outcome.REJECTED,
                    reason_code=ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
                    summaries=summaries(count=foreign - marks.native_foreign_schema),
                )
            )
        malformed = health.native_rejected - foreign
        if malformed > marks.native_rejected - marks.native_foreign_schema:
            # The native ring refused records as malformed (struct size, detail,
            # discriminant): a producer broke the protocol. Counted there; reported here.
            reports.append(
                make_event(
                    EventId.INVARIANT_PROTOCOL_VIOLATION,
                    outcome=Outcome.FAILURE,
                    reason_code=ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
                    summaries=summaries(
                        count=malformed - (marks.native_rejected - marks.native_foreign_schema),
                        rejected=health.native_rejected,
                    ),
                )
            )
        marks.native_rejected = health.native_rejected
        marks.native_foreign_schema = foreign
        for channel in list(self._engines.values()):
            summary = self._log_summary(channel)
            if summary is not None:
                reports.append(summary)
        now_ns = time.monotonic_ns()
        for report in reports:
            marks.emitted += 1
            self._process(report)
        # Lagging is a level, not an edge: the dispatcher's count now (readers recover on their
        # own threads); the deriver raises once and clears when none lags.
        for warning in self.warnings.observe_lagging(health.dispatcher.lagging, now_ns):
            marks.emitted += 1
            self._reduce_derived(warning)
        self._notify_state()
        self._publish_outbox()

    def _log_summary(self, channel: EngineChannel, force: bool = False) -> Event | None:
        """`native_log_summary` for one engine: llama.cpp log messages counted by level since
        the last one (counts only; the text is never read). At most one per
        `LOG_SUMMARY_INTERVAL_S`, none for a quiet window."""
        now = time.monotonic()
        if not force and now < channel.next_log_summary:
            return None
        try:
            counts = tuple(channel.ring.stats().log_messages_by_level)
        except Exception:  # noqa: BLE001 - a ring without log counters reports nothing
            return None
        before = channel.logged or (0,) * len(counts)
        delta = [now_count - then for now_count, then in zip(counts, before, strict=False)]
        if not any(value > 0 for value in delta):
            return None
        channel.logged = counts
        channel.next_log_summary = now + LOG_SUMMARY_INTERVAL_S
        return make_event(
            EventId.NATIVE_LOG_SUMMARY,
            scope=Scope(model_id=channel.model_id),
            duration_ms=None,
            summaries=summaries(
                count=sum(delta),
                log_messages_warn=delta[_LOG_WARN] if len(delta) > _LOG_WARN else 0,
                log_messages_error=delta[_LOG_ERROR] if len(delta) > _LOG_ERROR else 0,
            ),
        )
