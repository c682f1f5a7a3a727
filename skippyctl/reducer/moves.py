"""Transition tables as data: rows of (from-states, event id, to-state) that handlers consult.

Each reducer family declares the allowed moves of each entity it owns (a model, a stage, a
session, the runtime, …) as a ``MoveTable`` of frozen ``Move`` rows. Its handlers look the move
up (``find``) and still make the field updates themselves; a handler may refuse a move the
table allows when a guard the row's note names fails (another operation's event, a topology not
ready yet). No row for (event, current state) means the event does not fit: the handler counts
it as a rejection, or as a duplicate when it repeats the state the event leads to
(``repeats``), and leaves the state unchanged — never an exception.

Every family module's docstring carries its tables as ``render()`` prints them, and
tests/reducer/test_transition_tables.py fails when a docstring and its rows differ. Notation:
``absent`` the entity is not in the view; ``any`` every state; ``any other`` every state but the
one the row leads to; ``same`` the state does not change (the handler records fields);
``removed`` the entity leaves the view. A family may name groups of states (``settled``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Generic, TypeVar

from skippyctl.events.catalog import EventId

__all__ = [
    "ABSENT",
    "REMOVED",
    "SAME",
    "Effect",
    "Move",
    "MoveTable",
    "Presence",
    "all_but",
    "entering",
    "moves",
]


class Presence(StrEnum):
    """A source that is not a state: the entity is not in the view."""

    ABSENT = "absent"


class Effect(StrEnum):
    """A target that is not a state."""

    SAME = "same"
    """The state does not change; the handler records fields (counters, figures, flags)."""
    REMOVED = "removed"
    """The entity leaves the view."""


RENDER_WIDTH_CHARS: Final = 100
ABSENT: Final = Presence.ABSENT
SAME: Final = Effect.SAME
REMOVED: Final = Effect.REMOVED

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Move(Generic[S]):
    """From any of ``sources``, ``event`` moves the entity to ``target`` (announcing ``emits``)."""

    sources: frozenset[S | Presence]
    event: EventId
    target: S | Effect
    emits: EventId | None = None
    note: str = ""


def moves(
    sources: Iterable[S | Presence],
    events: Iterable[EventId],
    target: S | Effect,
    emits: EventId | None = None,
    note: str = "",
) -> tuple[Move[S], ...]:
    """One row per event, all with the same sources, target, announcement and note."""
    frozen = frozenset(sources)
    return tuple(Move(frozen, event, target, emits, note) for event in events)


def all_but(target: S) -> frozenset[S]:
    """Every state of ``target``'s enum except ``target``."""
    return frozenset(state for state in type(target) if state is not target)


def entering(target: S) -> frozenset[S | Presence]:
    """From absent or any other state: a repeat of ``target`` is a duplicate."""
    return frozenset({ABSENT, *all_but(target)})


class MoveTable(Generic[S]):
    """The moves of one entity. Immutable after construction; lookups are one dict probe."""

    __slots__ = ("entity", "states", "rows", "groups", "events", "_index", "_targets")

    def __init__(
        self,
        entity: str,
        states: type[S],
        rows: Iterable[Move[S]],
        groups: Mapping[str, frozenset[S]] | None = None,
    ) -> None:
        reserved = {ABSENT.value, SAME.value, REMOVED.value}
        if any(state.value in reserved for state in states):
            raise ValueError(f"{entity}: a state may not be named {sorted(reserved)}")
        self.entity = entity
        self.states = states
        self.rows: tuple[Move[S], ...] = tuple(rows)
        self.groups: Mapping[str, frozenset[S]] = dict(groups or {})
        # Two levels (event, then state): one tuple-keyed probe costs twice as much per event.
        index: dict[EventId, dict[S | Presence, Move[S]]] = {}
        targets: dict[EventId, set[S | Presence]] = {}
        for row in self.rows:
            if not row.sources:
                raise ValueError(f"{entity}: {row.event.value} has no source state")
            if not all(isinstance(x, (Presence, states)) for x in row.sources) or not isinstance(
                row.target, (Effect, states)
            ):
                raise ValueError(f"{entity}: {row.event.value} names a state of another table")
            moves_of_event = index.setdefault(row.event, {})
            for source in row.sources:
                if source in moves_of_event:
                    raise ValueError(f"{entity}: two moves for {row.event.value} from {source}")
                moves_of_event[source] = row
            # What a repeat of the event looks like: the entity already where it leads.
            if row.target is REMOVED:
                targets.setdefault(row.event, set()).add(ABSENT)
            elif not isinstance(row.target, Effect):
                targets.setdefault(row.event, set()).add(row.target)
        self._index = index
        self._targets = {event: frozenset(after) for event, after in targets.items()}
        self.events: frozenset[EventId] = frozenset(row.event for row in self.rows)

    def find(self, event: EventId, current: S | Presence) -> Move[S] | None:
        """The move ``event`` makes from ``current``; None when the table has none."""
        moves_of_event = self._index.get(event)
        return None if moves_of_event is None else moves_of_event.get(current)

    def repeats(self, event: EventId, current: S | Presence) -> bool:
        """Whether the entity already is where ``event`` leads (a duplicate, not a misfit)."""
        return current in self._targets.get(event, ())

    # ---- the docstring form ----

    def _sources_text(self, row: Move[S]) -> str:
        parts: list[str] = []
        if ABSENT in row.sources:
            parts.append(ABSENT.value)
        states = {s for s in row.sources if not isinstance(s, Presence)}
        every = set(self.states)
        missing = every - states
        if len(every) > 2 and len(missing) <= 1:  # "any" reads worse than a list of two
            if not missing:
                return " | ".join([*parts, "any"])
            (left_out,) = missing
            word = "any other" if left_out is row.target else f"any but {left_out.value}"
            return " | ".join([*parts, word])
        for name, group in self.groups.items():
            if group and group <= states:
                parts.append(name)
                states -= group
        parts += [s.value for s in self.states if s in states]
        return " | ".join(parts)

    def _move_text(self, row: Move[S]) -> str:
        text = f"{self._sources_text(row)} → {row.target.value}"
        if row.emits is not None:
            text += f", announces {row.emits.value}"
        return f"{text} — {row.note}" if row.note else text

    def render(self, width: int = RENDER_WIDTH_CHARS) -> str:
        """The table as the family docstrings state it: four-space indented, ``width`` wide."""
        groups: list[tuple[list[str], str]] = []
        for row in self.rows:
            text = self._move_text(row)
            if groups and groups[-1][1] == text:
                groups[-1][0].append(row.event.value)
            else:
                groups.append(([row.event.value], text))
        column = max(len(self.entity), *(len(events[0]) for events, _ in groups)) + 2
        indent = "    "
        room = width - len(indent) - column
        lines = [f"{self.entity:<{column}}from → to"]
        for events, text in groups:
            left = [events[0], *(f"  {event}" for event in events[1:])]
            right = textwrap.wrap(
                text, room, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
            )
            for i in range(max(len(left), len(right))):
                event = left[i] if i < len(left) else ""
                lines.append(f"{event:<{column}}{right[i] if i < len(right) else ''}".rstrip())
        return "".join(f"{indent}{line}\n" for line in lines)
