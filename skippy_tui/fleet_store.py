"""The fleet dashboard's client-side state: one reduced runtime per node, and each node's stream.

Contract:

- `FleetStore.deliver(item)` runs on the source's thread (a `FleetSourceItem`,
  `skippy_tui.fleet_source`). Under one short lock it hands a node's own items to that node's
  `SnapshotStore` — the single-runtime dashboard's store, unchanged, so each node is reduced
  exactly as `skippyctl tui` reduces one runtime — and keeps what only a fleet has: each node's
  stream health (`NodeHealth`: reachable or not with the reason code and attempt, its version
  and instance, restarts, replay gaps, skipped records, its last event's time) and one bounded
  log of recent events across the nodes, in arrival order, each with its node.
- `NodeUp` makes the node's store connected; `NodeDown` makes it down (its last reduced state
  stays, stale, as one runtime's does while it reconnects). `NodeUp(restarted=True)` means a
  new runtime instance answers whose stream starts over from its own first event, so the node's
  reduced state starts over too (a fresh `SnapshotStore`); the restart is counted.
- `FleetStore.snapshot()` runs on the UI thread: an immutable `FleetSnapshot` (the nodes in
  the order they became known — the fleet file's, then first appearance — each with its health
  and its `DashboardSnapshot`), the same object while nothing was delivered.
- Memory is bounded: at most `MAX_FLEET_NODES` nodes (items about more are counted as skipped
  input, never stored), each node's store bounded as the single store is (it keeps no recent
  events of its own: the fleet log does), the fleet log by `max_recent_events`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final, assert_never

from skippy_tui.fleet_source import FleetSourceItem, NodeDown, NodeGap, NodeItem, NodeUp
from skippy_tui.sources import DecodeSkipped, RuntimeBack, RuntimeDown, SourceEnded
from skippy_tui.store import (
    DEFAULT_MAX_RECENT_EVENTS,
    DEFAULT_RATE_WINDOW_S,
    DashboardSnapshot,
    SnapshotStore,
)
from skippyctl.config.fleet import MAX_NODES
from skippyctl.events.envelope import Event
from skippyctl.output.codec import SkipReason

MAX_FLEET_NODES: Final = MAX_NODES + 1
"""The fleet file's limit and the local runtime."""


class Reach(StrEnum):
    """Whether a node's stream is open (the values are the `node_status` records' `state`)."""

    CONNECTING = "connecting"
    REACHABLE = "reachable"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """A node's event stream, as the dashboard has followed it."""

    reach: Reach = Reach.CONNECTING
    reason_code: str | None = None
    """Why it cannot be followed (`node_unreachable`, `node_unauthorized`, …) while unreachable."""
    message: str = ""
    attempt: int = 0
    """Reconnection attempts since it was last reachable (0 while reachable)."""
    retry_in_s: float | None = None
    version: str | None = None
    instance: str | None = None
    restarts: int = 0
    """Times a different runtime instance answered than before."""
    downs: int = 0
    """Times the node became unreachable."""
    events: int = 0
    last_event_wall_ns: int | None = None
    gaps: int = 0
    """Replay gaps: the stream resumed past what the runtime retained."""
    skipped: int = 0
    """Records, fields or values of this node's stream not taken as they came."""
    ended: bool = False
    """The source ran out (a replay's end)."""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node at one instant: its stream's health and its reduced runtime."""

    name: str
    health: NodeHealth
    dashboard: DashboardSnapshot


def _empty_skips() -> Mapping[SkipReason, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Everything the fleet panes draw, at one instant. Immutable; compared by `version`."""

    version: int = 0
    nodes: tuple[NodeSnapshot, ...] = ()
    recent: tuple[tuple[str, Event], ...] = ()
    """Recent events of every node, oldest first, in arrival order, with their node."""
    events_total: int = 0
    skipped: Mapping[SkipReason, int] = field(default_factory=_empty_skips)
    """Input attributed to no node (a line that is not a record, names no node, or one node
    too many)."""
    ended: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes)

    def node(self, name: str) -> NodeSnapshot | None:
        return next((node for node in self.nodes if node.name == name), None)

    def shown(self, node_filter: str | None) -> tuple[NodeSnapshot, ...]:
        """The nodes a filter selects: all of them (None), or the one named."""
        if node_filter is None:
            return self.nodes
        return tuple(node for node in self.nodes if node.name == node_filter)


class _Node:
    """A node's mutable parts, only touched under the fleet store's lock."""

    __slots__ = ("health", "store")

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.health = NodeHealth()


class FleetStore:
    """Reduces each node's items into its own `SnapshotStore`; hands the UI `FleetSnapshot`s."""

    def __init__(
        self,
        nodes: Sequence[str] = (),
        max_recent_events: int = DEFAULT_MAX_RECENT_EVENTS,
        rate_window_s: int = DEFAULT_RATE_WINDOW_S,
        max_nodes: int = MAX_FLEET_NODES,
    ) -> None:
        self.max_recent_events = max_recent_events
        self.rate_window_s = rate_window_s
        self.max_nodes = max_nodes
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._recent: deque[tuple[str, Event]] = deque(maxlen=max_recent_events)
        self._skipped: dict[SkipReason, int] = {}
        self._events_total = 0
        self._ended = False
        self._version = 1  # the first snapshot lists the nodes known from the start
        self._cached = FleetSnapshot()
        for name in nodes[:max_nodes]:
            self._node(name)

    def _new_store(self) -> SnapshotStore:
        # The fleet log holds the recent events (with their node); a node keeps none twice.
        return SnapshotStore(max_recent_events=0, rate_window_s=self.rate_window_s)

    def _node(self, name: str) -> _Node | None:
        node = self._nodes.get(name)
        if node is None and len(self._nodes) < self.max_nodes:
            node = self._nodes[name] = _Node(self._new_store())
        return node

    def deliver(self, item: FleetSourceItem) -> None:
        """Source thread: take one item. Bounded work, never blocks on the UI."""
        with self._lock:
            self._version += 1
            match item:
                case DecodeSkipped(reason=reason, count=count):
                    self._skip(reason, count)
                case SourceEnded():
                    self._ended = True
                    for each in self._nodes.values():
                        each.store.deliver(item)
                        each.health = dataclasses.replace(each.health, ended=True)
                case NodeItem() | NodeUp() | NodeDown() | NodeGap():
                    node = self._node(item.node)
                    if node is None:
                        self._skip(SkipReason.INVALID_RECORD, 1)
                    else:
                        self._take(item.node, node, item)
                case _:
                    assert_never(item)

    def _skip(self, reason: SkipReason, count: int) -> None:
        self._skipped[reason] = self._skipped.get(reason, 0) + count

    def _take(self, name: str, node: _Node, item: NodeItem | NodeUp | NodeDown | NodeGap) -> None:
        health = node.health
        match item:
            case NodeItem(item=Event() as event):
                node.store.deliver(event)
                self._events_total += 1
                self._recent.append((name, event))
                last = health.last_event_wall_ns
                node.health = dataclasses.replace(
                    health,
                    events=health.events + 1,
                    last_event_wall_ns=event.wall_ns if last is None else max(last, event.wall_ns),
                )
            case NodeItem(item=DecodeSkipped(count=count) as skipped):
                node.store.deliver(skipped)
                node.health = dataclasses.replace(health, skipped=health.skipped + count)
            case NodeItem(item=inner):
                node.store.deliver(inner)
            case NodeUp(instance=instance, version=version, restarted=restarted):
                if restarted:
                    node.store = self._new_store()
                node.store.deliver(RuntimeBack())
                node.health = dataclasses.replace(
                    health,
                    reach=Reach.REACHABLE,
                    reason_code=None,
                    message="",
                    attempt=0,
                    retry_in_s=None,
                    version=version or None,
                    instance=instance or None,
                    restarts=health.restarts + (1 if restarted else 0),
                )
            case NodeDown(reason_code=reason, message=message, attempt=attempt, retry_in_s=wait):
                node.store.deliver(RuntimeDown(attempt))
                node.health = dataclasses.replace(
                    health,
                    reach=Reach.UNREACHABLE,
                    reason_code=reason,
                    message=message,
                    attempt=attempt,
                    retry_in_s=wait,
                    downs=health.downs + (1 if health.reach is not Reach.UNREACHABLE else 0),
                )
            case NodeGap():
                node.health = dataclasses.replace(health, gaps=health.gaps + 1)
            case _:
                assert_never(item)

    def snapshot(self) -> FleetSnapshot:
        """UI thread: the current snapshot (the same object while nothing new arrived)."""
        with self._lock:
            if self._cached.version == self._version:
                return self._cached
            self._cached = FleetSnapshot(
                version=self._version,
                nodes=tuple(
                    NodeSnapshot(name, node.health, node.store.snapshot())
                    for name, node in self._nodes.items()
                ),
                recent=tuple(self._recent),
                events_total=self._events_total,
                skipped=MappingProxyType(dict(self._skipped)),
                ended=self._ended,
            )
            return self._cached
