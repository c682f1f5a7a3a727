"""`evolve`: a copy of a frozen dataclass with some fields changed; `Draft`: the working copy of
one batch of events, whose own copies later events of the batch may update in place.

The reducer replaces its immutable state several times per event; `dataclasses.replace` re-runs
`__init__` through keyword arguments and costs ~9 µs for `RuntimeView`, several times this copy.
The reducer's dataclasses are frozen and slotted, with no `__post_init__` or `InitVar`, so
copying the fields is equivalent.

A batch of events (one drained native batch) still copies every view once per event if each
event starts from an immutable state. A `Draft` is the transient of persistent data structures:
an object it copied belongs to the batch — nobody outside the batch has seen it — so `revise`
and `revise_item` update it in place instead of copying it again, and the batch publishes one
immutable snapshot at its end (`reducer.reduce.BatchReducer`). Objects it did not copy (the
published snapshot's, or copies made by plain `evolve`) are never written.

Invariants the callers of `revise`/`revise_item` keep (the reducer's call sites are audited for
them; plain `evolve` stays the default everywhere else):

- the revised value replaces the old one, which the caller does not read or return afterwards
  (in place, "the old one" is the new one);
- the caller stores the result (a discarded in-place update would still have happened).

Identity no longer says "changed" for an object updated in place, so the draft records which
objects it updated during the current event (`begin_event`, `updated_any`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_COPIERS: Final[dict[type, Callable[[Any, dict[str, Any]], Any]]] = {}
_FIELDS: Final[dict[type, frozenset[str]]] = {}
_set_field: Final = object.__setattr__


def evolve(obj: T, /, **changes: Any) -> T:
    """Like `dataclasses.replace(obj, **changes)` for a frozen dataclass without `__post_init__`.

    Raises TypeError for a name that is not a field, as `dataclasses.replace` does.
    """
    cls = type(obj)
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _make_copier(cls)
    new: T = copier(obj, changes)
    return new


def _make_copier(cls: type) -> Callable[[Any, dict[str, Any]], Any]:
    """A function that copies `cls`'s fields, taking changed ones from a dict.

    Generated once per class: straight-line attribute access is ~2× a loop over field names.
    """
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"evolve() needs a dataclass without __post_init__, not {cls.__name__}")
    names = tuple(field.name for field in dataclasses.fields(cls))
    _FIELDS[cls] = frozenset(names)
    lines = ["def copy(obj, changes):", "    new = new_instance(cls)"]
    lines += [
        f"    set_field(new, {name!r}, obj.{name})"
        if name.isidentifier()
        else f"    set_field(new, {name!r}, getattr(obj, {name!r}))"
        for name in names
    ]
    lines += [
        "    for name, value in changes.items():",
        "        if name not in fields:",
        "            raise TypeError(f'{cls.__name__} has no field {name}')",
        "        set_field(new, name, value)",
        "    return new",
    ]
    namespace: dict[str, Any] = {
        "new_instance": object.__new__,
        "set_field": _set_field,
        "cls": cls,
        "fields": _FIELDS[cls],
        "getattr": getattr,
        "TypeError": TypeError,
    }
    exec("\n".join(lines), namespace)
    copier: Callable[[Any, dict[str, Any]], Any] = namespace["copy"]
    return copier


class Draft:
    """The objects one batch copied, which the batch may update in place.

    It holds each of them (not only its id) until the batch ends, so an id cannot be reused by
    another object while the draft lives. One thread uses a draft, between `activate` and
    `deactivate`; a published snapshot is never reachable through a new draft's objects until
    that draft copies them.
    """

    __slots__ = ("_owned", "_dicts", "_updated")

    def __init__(self) -> None:
        self._owned: dict[int, object] = {}
        self._dicts: dict[int, dict[Any, Any]] = {}
        """The dict behind each read-only mapping the draft made, by the mapping's id."""
        self._updated: set[int] = set()
        """Ids of the draft's objects updated in place during the current event."""

    def begin_event(self) -> None:
        self._updated.clear()

    def updated_any(self, objects: tuple[object, ...]) -> bool:
        """Whether any of `objects` was updated in place during the current event: with an
        identity check (a new object), what `is not` said when every update copied."""
        updated = self._updated
        if updated:
            for obj in objects:
                if id(obj) in updated:
                    return True
        return False

    def revise(self, obj: T, changes: dict[str, Any]) -> T:
        key = id(obj)
        if key not in self._owned:
            new = evolve(obj, **changes)
            self._owned[id(new)] = new
            return new
        if not _FIELDS[type(obj)].issuperset(changes):
            unknown = sorted(set(changes) - _FIELDS[type(obj)])
            raise TypeError(f"{type(obj).__name__} has no field {unknown[0]}")
        for name, value in changes.items():
            _set_field(obj, name, value)
        self._updated.add(key)
        return obj

    def revise_item(self, mapping: Mapping[K, V], key: K, value: V) -> Mapping[K, V]:
        backing = self._dicts.get(id(mapping))
        if backing is None:
            return self.revise_items(mapping, ((key, value),), ())
        backing[key] = value
        self._updated.add(id(mapping))
        return mapping

    def remove_item(self, mapping: Mapping[K, V], key: K) -> Mapping[K, V]:
        backing = self._dicts.get(id(mapping))
        if backing is None:
            return self.revise_items(mapping, (), (key,))
        if backing.pop(key, _MISSING) is not _MISSING:
            self._updated.add(id(mapping))
        return mapping

    def revise_items(
        self, mapping: Mapping[K, V], items: tuple[tuple[K, V], ...], removed: tuple[K, ...]
    ) -> Mapping[K, V]:
        """A copy of `mapping` that the draft owns, less `removed`, with `items` set."""
        backing = dict(mapping)
        for key in removed:
            backing.pop(key, None)
        backing.update(items)
        made: Mapping[K, V] = MappingProxyType(backing)
        self._owned[id(made)] = made
        self._dicts[id(made)] = backing
        return made


_MISSING: Final = object()


class _Active(threading.local):
    draft: Draft | None = None


_ACTIVE: Final = _Active()


def activate(draft: Draft) -> None:
    """Make `draft` the one `revise`/`revise_item` use on this thread (until `deactivate`)."""
    _ACTIVE.draft = draft


def deactivate() -> None:
    _ACTIVE.draft = None


def revise(obj: T, /, **changes: Any) -> T:
    """`evolve`, but in place when the active draft made `obj` (see the module docstring for
    the caller's side of the contract). Without an active draft, exactly `evolve`."""
    draft = _ACTIVE.draft
    if draft is None:
        return evolve(obj, **changes)
    return draft.revise(obj, changes)


def revise_item(mapping: Mapping[K, V], key: K, value: V) -> Mapping[K, V]:
    """A read-only mapping with `key` set to `value`: a new one (as `reducer.common.put`), or
    the same one updated in place when the active draft made it."""
    draft = _ACTIVE.draft
    if draft is None:
        updated = dict(mapping)
        updated[key] = value
        return MappingProxyType(updated)
    return draft.revise_item(mapping, key, value)


def remove_item(mapping: Mapping[K, V], key: K) -> Mapping[K, V]:
    """A read-only mapping without `key`: a new one (as `reducer.common.drop`), or the same one
    updated in place when the active draft made it."""
    draft = _ACTIVE.draft
    if draft is None:
        return MappingProxyType({k: v for k, v in mapping.items() if k != key})
    return draft.remove_item(mapping, key)
