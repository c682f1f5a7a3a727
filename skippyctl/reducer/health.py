"""Runtime lifecycle, native mode and event-system health totals.

The allowed moves are the rows of `RUNTIME_MOVES`, `NATIVE_MODE_MOVES` and `EXPORTER_MOVES`
(reducer.moves); the handlers look each event up there and make the field updates.

    runtime              from → to
    runtime_initialized  starting → running
    runtime_stopping     starting | running → stopping
    runtime_stopped      any other → stopped
      runtime_crashed

    native mode                 from → to
    native_library_loaded       any → native — feature bits
    native_library_unavailable  any → legacy
      native_library_rejected

    telemetry exporter            from → to
    telemetry_exporter_degraded   ok → degraded
    telemetry_exporter_recovered  degraded → ok

Event-system totals (counted, no state moves): events_dropped_by_class, events_coalesced,
events_sampled, unknown_native_event_received, native_sequence_gap_detected, subscriber_lagging,
subscriber_disconnected, reducer_error, runtime_replay_gap.

Kept sets (no state moves; pipeline.warnings derives and rate-limits them): `warning_raised`
adds the warning under its operation id (at most `MAX_WARNINGS`; beyond, counted as rejected),
`warning_cleared` removes it; `degraded_operation_entered` adds its mode (`state.current`),
`degraded_operation_exited` removes it (`state.previous`). One without an id or mode is only
remembered. A reconciled `runtime_crashed` with reason `process_crash` is an earlier host's
(found dead at this host's start, daemon/serve.py): remembered, this runtime does not move.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.events.reasons import Producer, ReasonCode
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, drop, put, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.moves import Move, MoveTable, moves
from skippyctl.reducer.state import (
    MAX_WARNINGS,
    EventSystemView,
    NativeMode,
    RuntimeState,
    RuntimeView,
    WarningView,
)

_E = EventId
_RS = RuntimeState


class ExporterHealth(StrEnum):
    """The telemetry exporter flag (the view keeps it as a bool) as a state of its table."""

    OK = "ok"
    DEGRADED = "degraded"


RUNTIME_MOVES: Final[MoveTable[RuntimeState]] = MoveTable(
    "runtime",
    RuntimeState,
    (
        Move(frozenset({_RS.STARTING}), _E.RUNTIME_INITIALIZED, _RS.RUNNING),
        Move(frozenset({_RS.STARTING, _RS.RUNNING}), _E.RUNTIME_STOPPING, _RS.STOPPING),
        *moves(
            {_RS.STARTING, _RS.RUNNING, _RS.STOPPING},
            (_E.RUNTIME_STOPPED, _E.RUNTIME_CRASHED),
            _RS.STOPPED,
        ),
    ),
)

NATIVE_MODE_MOVES: Final[MoveTable[NativeMode]] = MoveTable(
    "native mode",
    NativeMode,
    (
        Move(
            frozenset(NativeMode), _E.NATIVE_LIBRARY_LOADED, NativeMode.NATIVE, note="feature bits"
        ),
        *moves(
            NativeMode,
            (_E.NATIVE_LIBRARY_UNAVAILABLE, _E.NATIVE_LIBRARY_REJECTED),
            NativeMode.LEGACY,
        ),
    ),
)

EXPORTER_MOVES: Final[MoveTable[ExporterHealth]] = MoveTable(
    "telemetry exporter",
    ExporterHealth,
    (
        Move(
            frozenset({ExporterHealth.OK}),
            _E.TELEMETRY_EXPORTER_DEGRADED,
            ExporterHealth.DEGRADED,
        ),
        Move(
            frozenset({ExporterHealth.DEGRADED}),
            _E.TELEMETRY_EXPORTER_RECOVERED,
            ExporterHealth.OK,
        ),
    ),
)
MOVE_TABLES: Final = (RUNTIME_MOVES, NATIVE_MODE_MOVES, EXPORTER_MOVES)


def _n(event: Event, key: SummaryKey) -> int:
    value = event.summary_value(key)
    return 0 if value is None else int(value)


def on_native_mode(state: RuntimeView, event: Event) -> Step:
    row = NATIVE_MODE_MOVES.find(event.id, state.native_mode)
    if row is None or not isinstance(row.target, NativeMode):
        return reject(state)
    if row.target is NativeMode.NATIVE:
        features = event.summary_value(SummaryKey.FEATURE_BITS)
        return (
            evolve(
                state,
                native_mode=row.target,
                native_features=None if features is None else int(features),
            ),
            NO_TRANSITIONS,
        )
    return evolve(state, native_mode=row.target), NO_TRANSITIONS


def on_runtime(state: RuntimeView, event: Event) -> Step:
    if (
        event.id is EventId.RUNTIME_CRASHED
        and event.producer is Producer.RECONCILED
        and event.reason_code is ReasonCode.PROCESS_CRASH
    ):
        return state, NO_TRANSITIONS  # an earlier host's crash, found at start: only remembered
    row = RUNTIME_MOVES.find(event.id, state.runtime)
    if row is None or not isinstance(row.target, RuntimeState):
        return reject(state, duplicate=RUNTIME_MOVES.repeats(event.id, state.runtime))
    return evolve(state, runtime=row.target), NO_TRANSITIONS


def on_health(state: RuntimeView, event: Event) -> Step:
    view: EventSystemView = state.event_system
    match event.id:
        case EventId.EVENTS_DROPPED_BY_CLASS:
            view = evolve(
                view,
                dropped_terminal=view.dropped_terminal + _n(event, SummaryKey.DROPPED_TERMINAL),
                dropped_state=view.dropped_state + _n(event, SummaryKey.DROPPED_STATE),
                dropped_progress=view.dropped_progress + _n(event, SummaryKey.DROPPED_PROGRESS),
                dropped_diagnostic=view.dropped_diagnostic
                + _n(event, SummaryKey.DROPPED_DIAGNOSTIC),
                dropped_native=view.dropped_native + _n(event, SummaryKey.COUNT),
            )
        case EventId.EVENTS_COALESCED:
            view = evolve(view, coalesced=view.coalesced + _n(event, SummaryKey.COALESCED))
        case EventId.EVENTS_SAMPLED:
            view = evolve(view, sampled=view.sampled + _n(event, SummaryKey.SAMPLED))
        case EventId.UNKNOWN_NATIVE_EVENT_RECEIVED:
            view = evolve(view, unknown_native=view.unknown_native + _n(event, SummaryKey.COUNT))
        case EventId.NATIVE_SEQUENCE_GAP_DETECTED:
            view = evolve(view, sequence_gaps=view.sequence_gaps + 1)
        case EventId.SUBSCRIBER_LAGGING:
            view = evolve(
                view, lagging_subscribers=view.lagging_subscribers + _n(event, SummaryKey.COUNT)
            )
        case EventId.SUBSCRIBER_DISCONNECTED:
            view = evolve(
                view,
                disconnected_subscribers=view.disconnected_subscribers
                + _n(event, SummaryKey.COUNT),
            )
        case EventId.REDUCER_ERROR:
            view = evolve(view, reducer_errors=view.reducer_errors + _n(event, SummaryKey.REJECTED))
        case EventId.TELEMETRY_EXPORTER_DEGRADED | EventId.TELEMETRY_EXPORTER_RECOVERED:
            now = ExporterHealth.DEGRADED if view.exporter_degraded else ExporterHealth.OK
            row = EXPORTER_MOVES.find(event.id, now)
            if row is None:
                return reject(state, duplicate=EXPORTER_MOVES.repeats(event.id, now))
            view = evolve(view, exporter_degraded=row.target is ExporterHealth.DEGRADED)
        case EventId.RUNTIME_REPLAY_GAP:
            view = evolve(view, replay_gaps=view.replay_gaps + 1)
        case _:
            return reject(state)
    return evolve(state, event_system=view), NO_TRANSITIONS


def on_warning(state: RuntimeView, event: Event) -> Step:
    warning_id = event.operation_id
    if warning_id is None or event.state is None:
        return state, NO_TRANSITIONS
    if event.id is EventId.WARNING_CLEARED:
        if warning_id not in state.warnings:
            return state, NO_TRANSITIONS
        return evolve(state, warnings=drop(state.warnings, warning_id)), NO_TRANSITIONS
    if warning_id not in state.warnings and len(state.warnings) >= MAX_WARNINGS:
        return reject(state)
    view = WarningView(
        warning_id=warning_id,
        code=event.state.current,
        reason_code=event.reason_code,
        model_id=event.scope.model_id,
        stage_id=event.scope.stage_id,
        raised_wall_ns=event.wall_ns,
    )
    return evolve(state, warnings=put(state.warnings, warning_id, view)), NO_TRANSITIONS


def on_degraded(state: RuntimeView, event: Event) -> Step:
    change = event.state
    if change is None:
        return state, NO_TRANSITIONS
    if event.id is EventId.DEGRADED_OPERATION_ENTERED:
        modes = state.degraded_modes | {change.current}
    else:
        modes = state.degraded_modes - {change.previous or ""}
    if modes == state.degraded_modes:
        return state, NO_TRANSITIONS
    return evolve(state, degraded_modes=frozenset(modes)), NO_TRANSITIONS


HANDLERS: Final[dict[EventId, Handler]] = {
    EventId.WARNING_RAISED: on_warning,
    EventId.WARNING_CLEARED: on_warning,
    EventId.DEGRADED_OPERATION_ENTERED: on_degraded,
    EventId.DEGRADED_OPERATION_EXITED: on_degraded,
    **{event_id: on_native_mode for event_id in NATIVE_MODE_MOVES.events},
    **{event_id: on_runtime for event_id in RUNTIME_MOVES.events},
    **{
        event_id: on_health
        for event_id in (
            EventId.EVENTS_DROPPED_BY_CLASS,
            EventId.EVENTS_COALESCED,
            EventId.EVENTS_SAMPLED,
            EventId.UNKNOWN_NATIVE_EVENT_RECEIVED,
            EventId.NATIVE_SEQUENCE_GAP_DETECTED,
            EventId.SUBSCRIBER_LAGGING,
            EventId.SUBSCRIBER_DISCONNECTED,
            EventId.REDUCER_ERROR,
            EventId.TELEMETRY_EXPORTER_DEGRADED,
            EventId.TELEMETRY_EXPORTER_RECOVERED,
            EventId.RUNTIME_REPLAY_GAP,
        )
    },
}
