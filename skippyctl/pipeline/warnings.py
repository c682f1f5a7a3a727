"""Structured warnings (`warning_raised` / `warning_cleared`) and degraded operation
(`degraded_operation_entered` / `_exited`) derived from the conditions the runtime already
reports, on the pipeline thread.

Each warning is one condition about one thing: a code (`WarningCode`, in `state`), a scope (the
model or stage it is about; none for the event system's own), a stable reason code and an
operation id (`<code>.<n>`) that its clear repeats, so a raise and its clear pair up by id.

    condition            raised by                          cleared by
    kv_near_full         cache_pressure_crossed             cache_pressure_cleared
    queue_saturated      request_rejected                   the model's queue is empty again
                         (reservation_exhausted: a 429)     (a request event of that model)
    exporter_failing     telemetry_exporter_degraded        telemetry_exporter_recovered
    stage_link_degraded  stage_degraded with link figures   stage_ready of that stage
    subscriber_lagging   the pipeline's health report sees  ... sees none lagging any more
                         a lagging subscriber               (`observe_lagging`)

Degraded operation: `telemetry_export_down` follows the exporter (the same two events);
`legacy_ingress` is entered by the host when no native library can be used
(`runtime/host.py`) and lasts for the process.

No storms (spec, "Event-system health"): the deriver only looks at the source ids above, never
at its own output, and its output is reduced and dispatched but never derived from again. A
condition that is already active raises nothing; a raise of the same code and scope within
`RAISE_MIN_INTERVAL_S` of the previous one is suppressed (counted, `suppressed`) together with
its clear, so a flapping condition costs at most one pair per interval; at most
`MAX_ACTIVE_WARNINGS` are active at once (beyond: suppressed). Timing uses the source events'
own monotonic stamps, so the deriver is deterministic under test.

Owned by the pipeline thread only (not thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    NO_SCOPE,
    Event,
    LogicalId,
    NumericSummary,
    Scope,
    StateChange,
    SummaryKey,
    make_event,
    summaries,
)
from skippyctl.events.reasons import (
    CLEARED_STATE,
    NORMAL_STATE,
    DegradedMode,
    Outcome,
    ReasonCode,
    WarningCode,
)
from skippyctl.reducer.state import RuntimeView, queue_depth

RAISE_MIN_INTERVAL_S: Final = 10.0
"""The least time between two raises of one code and scope (a flapping condition)."""
MAX_ACTIVE_WARNINGS: Final = 64

_NS: Final = 1_000_000_000

REASONS: Final[dict[WarningCode, ReasonCode]] = {
    WarningCode.KV_NEAR_FULL: ReasonCode.CONTEXT_EXHAUSTED,
    WarningCode.QUEUE_SATURATED: ReasonCode.RESERVATION_EXHAUSTED,
    # A subscriber's bounded queue is being used up: the reservation is running out.
    WarningCode.SUBSCRIBER_LAGGING: ReasonCode.RESERVATION_EXHAUSTED,
    # Overridden by the exporter's own reason (timeout / unknown_failure) when it has one.
    WarningCode.EXPORTER_FAILING: ReasonCode.UNKNOWN_FAILURE,
    WarningCode.STAGE_LINK_DEGRADED: ReasonCode.TIMEOUT,
}

_KV_KEYS: Final = (SummaryKey.KV_CELLS_USED, SummaryKey.KV_CELLS_TOTAL)
_LINK_KEYS: Final = (
    SummaryKey.LINK_RTT_MS,
    SummaryKey.LINK_P95_MS,
    SummaryKey.LINK_JITTER_MS,
    SummaryKey.LINK_P95_THRESHOLD_MS,
)
_QUEUE_EVENTS: Final = frozenset(
    {
        EventId.REQUEST_ADMITTED,
        EventId.REQUEST_EXECUTION_STARTED,
        EventId.REQUEST_COMPLETED,
        EventId.REQUEST_CANCELLED,
        EventId.REQUEST_TIMED_OUT,
        EventId.REQUEST_FAILED,
        EventId.REQUEST_REJECTED,
    }
)
SOURCE_EVENTS: Final = _QUEUE_EVENTS | {
    EventId.CACHE_PRESSURE_CROSSED,
    EventId.CACHE_PRESSURE_CLEARED,
    EventId.TELEMETRY_EXPORTER_DEGRADED,
    EventId.TELEMETRY_EXPORTER_RECOVERED,
    EventId.STAGE_DEGRADED,
    EventId.STAGE_READY,
}
"""The only events :meth:`WarningDeriver.derive` looks at: the pipeline skips the call for the
rest (one set lookup per event on the drain path instead of a match and a try block)."""


@dataclass(slots=True)
class _Active:
    operation_id: LogicalId
    raised_mono_ns: int


@dataclass(slots=True)
class WarningCounters:
    raised: int = 0
    cleared: int = 0
    suppressed: int = 0


def _figures(event: Event, keys: tuple[SummaryKey, ...]) -> tuple[NumericSummary, ...]:
    if not event.summaries:
        return ()
    return tuple(s for s in event.summaries if s.key in keys)


class WarningDeriver:
    """Source events in, warning and degraded-operation events out (see the module table)."""

    def __init__(self) -> None:
        self._active: dict[tuple[WarningCode, Scope], _Active] = {}
        self._suppressed: set[tuple[WarningCode, Scope]] = set()
        self._last_raise_ns: dict[tuple[WarningCode, Scope], int] = {}
        self._serial = 0
        self.counters = WarningCounters()

    @property
    def active(self) -> int:
        return len(self._active)

    def derive(self, event: Event, state: RuntimeView) -> list[Event]:
        """What `event` (just reduced into `state`) raises or clears; [] for most events."""
        match event.id:
            case EventId.CACHE_PRESSURE_CROSSED:
                scope = Scope(model_id=event.scope.model_id)
                return self._raise(
                    WarningCode.KV_NEAR_FULL, scope, event, _figures(event, _KV_KEYS)
                )
            case EventId.CACHE_PRESSURE_CLEARED:
                scope = Scope(model_id=event.scope.model_id)
                return self._clear(
                    WarningCode.KV_NEAR_FULL, scope, event, _figures(event, _KV_KEYS)
                )
            case EventId.TELEMETRY_EXPORTER_DEGRADED:
                out = self._raise(WarningCode.EXPORTER_FAILING, NO_SCOPE, event)
                return out + [
                    self._degraded(True, DegradedMode.TELEMETRY_EXPORT_DOWN, event.reason_code)
                ]
            case EventId.TELEMETRY_EXPORTER_RECOVERED:
                out = self._clear(WarningCode.EXPORTER_FAILING, NO_SCOPE, event)
                return out + [self._degraded(False, DegradedMode.TELEMETRY_EXPORT_DOWN, None)]
            case EventId.STAGE_DEGRADED if event.summary_value(SummaryKey.LINK_P95_MS) is not None:
                scope = Scope(stage_id=event.scope.stage_id, topology_id=event.scope.topology_id)
                return self._raise(
                    WarningCode.STAGE_LINK_DEGRADED, scope, event, _figures(event, _LINK_KEYS)
                )
            case EventId.STAGE_READY:
                scope = Scope(stage_id=event.scope.stage_id, topology_id=event.scope.topology_id)
                return self._clear(
                    WarningCode.STAGE_LINK_DEGRADED, scope, event, _figures(event, _LINK_KEYS)
                )
            case _ if event.id in _QUEUE_EVENTS:
                return self._queue(event, state)
            case _:
                return []

    def _gate_shut(self, last_raise_ns: int | None, now_ns: int) -> bool:
        """Whether a raise now is suppressed: too soon after the last one, or too many active."""
        return (
            last_raise_ns is not None and now_ns - last_raise_ns < RAISE_MIN_INTERVAL_S * _NS
        ) or len(self._active) >= MAX_ACTIVE_WARNINGS

    def observe_lagging(self, lagging: int, now_ns: int) -> list[Event]:
        """The pipeline's health report: how many subscribers lag right now."""
        figures = summaries(lagging_subscribers=lagging)
        probe = make_event(EventId.SUBSCRIBER_LAGGING, mono_ns=now_ns)
        if lagging > 0:
            return self._raise(WarningCode.SUBSCRIBER_LAGGING, NO_SCOPE, probe, figures)
        return self._clear(WarningCode.SUBSCRIBER_LAGGING, NO_SCOPE, probe, figures)

    def _queue(self, event: Event, state: RuntimeView) -> list[Event]:
        model_id = event.scope.model_id
        if model_id is None:
            return []
        scope = Scope(model_id=model_id)
        if (
            event.id is EventId.REQUEST_REJECTED
            and event.reason_code is ReasonCode.RESERVATION_EXHAUSTED
        ):
            capacity = event.summary_value(SummaryKey.QUEUE_CAPACITY)
            figures = summaries(queue_depth=queue_depth(state, model_id), queue_capacity=capacity)
            return self._raise(WarningCode.QUEUE_SATURATED, scope, event, figures)
        key = (WarningCode.QUEUE_SATURATED, scope)
        watched = key in self._active or key in self._suppressed
        if watched and queue_depth(state, model_id) == 0:
            return self._clear(WarningCode.QUEUE_SATURATED, scope, event, summaries(queue_depth=0))
        return []

    # -- the gate -------------------------------------------------------------------------------
    def _raise(
        self,
        code: WarningCode,
        scope: Scope,
        cause: Event,
        figures: tuple[NumericSummary, ...] = (),
    ) -> list[Event]:
        key = (code, scope)
        if key in self._active or key in self._suppressed:
            return []
        now = cause.mono_ns
        if self._gate_shut(self._last_raise_ns.get(key), now):
            self._suppressed.add(key)
            self.counters.suppressed += 1
            return []
        if len(self._last_raise_ns) >= 4 * MAX_ACTIVE_WARNINGS:
            self._last_raise_ns.pop(next(iter(self._last_raise_ns)))
        self._last_raise_ns[key] = now
        self._serial += 1
        operation_id = LogicalId(f"{code.value}.{self._serial}")
        self._active[key] = _Active(operation_id, now)
        self.counters.raised += 1
        reason = REASONS[code]
        if code is WarningCode.EXPORTER_FAILING and cause.reason_code is not None:
            reason = cause.reason_code
        return [
            make_event(
                EventId.WARNING_RAISED,
                operation_id=operation_id,
                scope=scope,
                state=StateChange(previous=None, current=code.value),
                reason_code=reason,
                summaries=figures,
            )
        ]

    def _clear(
        self,
        code: WarningCode,
        scope: Scope,
        cause: Event,
        figures: tuple[NumericSummary, ...] = (),
    ) -> list[Event]:
        key = (code, scope)
        if key in self._suppressed:
            self._suppressed.discard(key)
            return []
        active = self._active.pop(key, None)
        if active is None:
            return []
        self.counters.cleared += 1
        return [
            make_event(
                EventId.WARNING_CLEARED,
                operation_id=active.operation_id,
                scope=scope,
                state=StateChange(previous=code.value, current=CLEARED_STATE),
                outcome=Outcome.SUCCESS,
                reason_code=REASONS[code] if code is not WarningCode.EXPORTER_FAILING else None,
                duration_ms=round(max(0, cause.mono_ns - active.raised_mono_ns) / 1e6, 3),
                summaries=figures,
            )
        ]

    @staticmethod
    def _degraded(entered: bool, mode: DegradedMode, reason: ReasonCode | None) -> Event:
        return degraded_operation(entered, mode, reason)


def degraded_operation(
    entered: bool, mode: DegradedMode, reason: ReasonCode | None = None
) -> Event:
    """`degraded_operation_entered` (state → mode) or `_exited` (mode → normal)."""
    if entered:
        return make_event(
            EventId.DEGRADED_OPERATION_ENTERED,
            state=StateChange(previous=NORMAL_STATE, current=mode.value),
            outcome=Outcome.FAILURE,
            reason_code=reason or ReasonCode.UNKNOWN_FAILURE,
        )
    return make_event(
        EventId.DEGRADED_OPERATION_EXITED,
        state=StateChange(previous=mode.value, current=NORMAL_STATE),
        outcome=Outcome.SUCCESS,
    )
