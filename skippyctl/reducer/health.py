"""Runtime lifecycle, native mode and event-system health totals.

native_library_loaded                          native mode (feature bits recorded)
native_library_unavailable | _rejected         legacy mode
runtime_initialized                            starting → running
runtime_stopping                               → stopping
runtime_stopped | runtime_crashed              → stopped
events_dropped_by_class, events_coalesced, events_sampled, unknown_native_event_received,
  native_sequence_gap_detected, subscriber_lagging, subscriber_disconnected, reducer_error,
  telemetry_exporter_degraded | _recovered, runtime_replay_gap
                                               event-system totals
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.state import EventSystemView, NativeMode, RuntimeState, RuntimeView


def _n(event: Event, key: SummaryKey) -> int:
    value = event.summary_value(key)
    return 0 if value is None else int(value)


def on_native_loaded(state: RuntimeView, event: Event) -> Step:
    features = event.summary_value(SummaryKey.FEATURE_BITS)
    return (
        evolve(
            state,
            native_mode=NativeMode.NATIVE,
            native_features=None if features is None else int(features),
        ),
        NO_TRANSITIONS,
    )


def on_native_unavailable(state: RuntimeView, event: Event) -> Step:
    return evolve(state, native_mode=NativeMode.LEGACY), NO_TRANSITIONS


def _runtime(target: RuntimeState, allowed: frozenset[RuntimeState]) -> Handler:
    def handler(state: RuntimeView, event: Event) -> Step:
        if state.runtime is target:
            return reject(state, duplicate=True)
        if state.runtime not in allowed:
            return reject(state)
        return evolve(state, runtime=target), NO_TRANSITIONS

    return handler


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
            degraded = event.id is EventId.TELEMETRY_EXPORTER_DEGRADED
            if view.exporter_degraded is degraded:
                return reject(state, duplicate=True)
            view = evolve(view, exporter_degraded=degraded)
        case EventId.RUNTIME_REPLAY_GAP:
            view = evolve(view, replay_gaps=view.replay_gaps + 1)
        case _:
            return reject(state)
    return evolve(state, event_system=view), NO_TRANSITIONS


_ANY: Final = frozenset(RuntimeState)

HANDLERS: Final[dict[EventId, Handler]] = {
    EventId.NATIVE_LIBRARY_LOADED: on_native_loaded,
    EventId.NATIVE_LIBRARY_UNAVAILABLE: on_native_unavailable,
    EventId.NATIVE_LIBRARY_REJECTED: on_native_unavailable,
    EventId.RUNTIME_INITIALIZED: _runtime(RuntimeState.RUNNING, frozenset({RuntimeState.STARTING})),
    EventId.RUNTIME_STOPPING: _runtime(
        RuntimeState.STOPPING, frozenset({RuntimeState.STARTING, RuntimeState.RUNNING})
    ),
    EventId.RUNTIME_STOPPED: _runtime(RuntimeState.STOPPED, _ANY),
    EventId.RUNTIME_CRASHED: _runtime(RuntimeState.STOPPED, _ANY),
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
