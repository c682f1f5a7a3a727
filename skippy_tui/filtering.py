"""The events-log filter: a small query language over typed event fields.

Syntax: whitespace-separated terms, all of which must match (AND), case-insensitive.

- `cat:NAME` / `category:NAME`  the event's category contains NAME (`cat:model` → model_*)
- `id:NAME` / `event:NAME`      the event id contains NAME
- `model:NAME`                  the model id contains NAME
- `sev:LEVEL` / `severity:LEVEL` severity at least LEVEL (`sev:warning` → warning, error, fatal)
- `reason:NAME`                 the reason code contains NAME
- `node:NAME`                   the node's name contains NAME (the fleet dashboard's events)
- anything else                 contained in the id, category, model id, reason code or node

It filters only what is shown; it never changes what is reduced or buffered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Severity

_SEVERITY_ORDER: Final = tuple(Severity)
_FIELDS: Final = {
    "cat": "category",
    "category": "category",
    "id": "id",
    "event": "id",
    "model": "model",
    "sev": "severity",
    "severity": "severity",
    "reason": "reason",
    "node": "node",
}


@dataclass(frozen=True, slots=True)
class Term:
    field: str | None
    value: str


@dataclass(frozen=True, slots=True)
class EventFilter:
    """A parsed filter; the empty filter matches everything."""

    text: str = ""
    terms: tuple[Term, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EventFilter:
        terms: list[Term] = []
        for word in text.lower().split():
            name, sep, value = word.partition(":")
            if sep and name in _FIELDS and value:
                terms.append(Term(_FIELDS[name], value))
            else:
                terms.append(Term(None, word))
        return cls(text=text.strip(), terms=tuple(terms))

    @property
    def active(self) -> bool:
        return bool(self.terms)

    def matches(self, event: Event, node: str | None = None) -> bool:
        """Whether `event` (of `node`, in the fleet dashboard) matches every term."""
        return all(_match(term, event, node) for term in self.terms)


def _at_least(severity: Severity, level: str) -> bool:
    floor = next((s for s in _SEVERITY_ORDER if s.value.startswith(level)), None)
    if floor is None:
        return False
    return _SEVERITY_ORDER.index(severity) >= _SEVERITY_ORDER.index(floor)


def _match(term: Term, event: Event, node: str | None) -> bool:
    model = event.scope.model_id or ""
    reason = event.reason_code.value if event.reason_code is not None else ""
    node_name = node.lower() if node is not None else ""
    match term.field:
        case "category":
            return term.value in event.category.value
        case "id":
            return term.value in event.id.value
        case "model":
            return term.value in model.lower()
        case "severity":
            return _at_least(event.severity, term.value)
        case "reason":
            return term.value in reason
        case "node":
            return node is not None and term.value in node_name
        case _:
            value = term.value
            return (
                value in event.id.value
                or value in event.category.value
                or value in model.lower()
                or value in reason
                or value in node_name
            )
