"""Helpers shared by the reducer's family modules (pure functions over immutable state)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    NumericSummary,
    Scope,
    StateChange,
    make_event,
)
from skippyctl.events.reasons import Outcome, Producer
from skippyctl.reducer.immutable import remove_item, revise, revise_item
from skippyctl.reducer.state import RuntimeView

Transitions = tuple[Event, ...]
Step = tuple[RuntimeView, Transitions]
Handler = Callable[[RuntimeView, Event], Step]
NO_TRANSITIONS: Final[Transitions] = ()

V = TypeVar("V")


def count(state: RuntimeView, **increments: int) -> RuntimeView:
    """Add to reducer counters by name. In place within a batch (reducer.immutable.revise):
    every caller returns the counted state and never reads the one it passed again."""
    counters = state.counters
    changes = {name: getattr(counters, name) + value for name, value in increments.items()}
    return revise(state, counters=revise(counters, **changes))


def reject(state: RuntimeView, duplicate: bool = False) -> Step:
    """An event that does not fit the current state: counted, state unchanged."""
    if duplicate:
        return count(state, duplicate_transitions=1), NO_TRANSITIONS
    return count(state, rejected_transitions=1), NO_TRANSITIONS


def put(mapping: Mapping[LogicalId, V], key: LogicalId, value: V) -> Mapping[LogicalId, V]:
    updated = dict(mapping)
    updated[key] = value
    return MappingProxyType(updated)


def drop(mapping: Mapping[LogicalId, V], key: LogicalId) -> Mapping[LogicalId, V]:
    return MappingProxyType({k: v for k, v in mapping.items() if k != key})


def bounded_put(
    mapping: Mapping[LogicalId, V],
    key: LogicalId,
    value: V,
    limit: int,
    evictable: Callable[[V], bool],
    age: Callable[[V], int],
) -> tuple[Mapping[LogicalId, V], int] | None:
    """Insert, evicting the oldest evictable entry when full. None when nothing can be evicted.
    In place within a batch (reducer.immutable.revise_item): every caller stores the mapping
    it returns in the state it returns and never reads the one it passed again.

    Returns the new mapping and how many entries were evicted (0 or 1).
    """
    if key in mapping or len(mapping) < limit:
        return revise_item(mapping, key, value), 0
    candidates = [(age(v), k) for k, v in mapping.items() if evictable(v)]
    if not candidates:
        return None
    _, oldest = min(candidates)
    return revise_item(remove_item(mapping, oldest), key, value), 1


def transition(
    event_id: EventId,
    cause: Event,
    previous: str | None,
    current: str,
    *,
    scope: Scope | None = None,
    outcome: Outcome | None = None,
    duration_ms: float | None = None,
    extra: tuple[NumericSummary, ...] = (),
) -> Event:
    """A reducer-owned event announcing a state change it made."""
    return make_event(
        event_id,
        Producer.RUNTIME,
        operation_id=cause.operation_id,
        scope=scope if scope is not None else cause.scope,
        state=StateChange(previous=previous, current=current),
        outcome=outcome,
        reason_code=cause.reason_code,
        duration_ms=duration_ms,
        summaries=extra,
    )
