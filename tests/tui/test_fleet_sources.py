"""Fleet sources: a fleet recording's replay, the translation of a live stream's frames, and the
live source over fake runtimes (one answering, one not)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import orjson

from skippy_tui import demo
from skippy_tui.fleet_live import FleetLiveSource, fleet_items
from skippy_tui.fleet_source import (
    FleetReplaySource,
    FleetSourceItem,
    NodeDown,
    NodeGap,
    NodeItem,
    NodeUp,
    decode_fleet_line,
)
from skippy_tui.fleet_store import FleetStore, Reach
from skippy_tui.sources import DecodeSkipped, LoadableModels, SourceEnded
from skippyctl.client.fleet import ClientFactory, NodeFrame, node_status_record
from skippyctl.client.http import Frame, RuntimeClient, RuntimeUnreachable
from skippyctl.events.envelope import Event
from skippyctl.output.codec import SkipReason, event_object, event_record
from skippyctl.reducer.state import ModelState

T0_S = demo.T0_NS / 1e9


class Collect:
    def __init__(self) -> None:
        self.items: list[FleetSourceItem] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._wanted: list[tuple[Callable[[list[FleetSourceItem]], bool], threading.Event]] = []

    def __call__(self, item: FleetSourceItem) -> None:
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.items.append(item)
            for condition, seen in self._wanted:
                if condition(self.items):
                    seen.set()

    def when(self, condition: Callable[[list[FleetSourceItem]], bool]) -> threading.Event:
        """An event set once the items delivered so far satisfy `condition`."""
        seen = threading.Event()
        with self._lock:
            self._wanted.append((condition, seen))
            if condition(self.items):
                seen.set()
        return seen


def _event_line(node: str, event: Event, seq: int) -> bytes:
    return orjson.dumps({**event_record(event, seq=seq), "node": node})


def _status_line(item: NodeUp | NodeDown, at_s: float) -> bytes:
    return orjson.dumps(node_status_record(item, wall_s=at_s))


def _recording(path: Path) -> Path:
    """What `events --follow --fleet --json` writes for: local up and serving tiny (then a replay
    gap), gpu1 up and failing a load, then restarted, gpu2 unreachable; with lines that cannot
    be taken."""
    local = [_event_line("local", e, i) for i, e in enumerate(demo.available())]
    failed = [_event_line("gpu1", e, i) for i, e in enumerate(demo.failed())]
    lines = [
        _status_line(NodeUp("local", "rt-local", "0.1.0"), T0_S),
        _status_line(NodeUp("gpu1", "rt-gpu1-a", "0.1.0"), T0_S),
        _status_line(NodeDown("gpu2", "node_unreachable", "refused", 1, 0.25), T0_S),
        *local[:5],
        *failed,
        b"not json",
        b'{"schema_version":1,"event":"model_teleported","ts":"2026-01-15T09:00:00Z",'
        b'"node":"gpu1"}',
        _event_line("", demo.loading()[0], 0),  # no node's name: of no node
        b'{"record":"node_status","node":"gpu2","state":"sideways"}',
        *local[5:],
        orjson.dumps(
            {
                "schema_version": 1,
                "record": "replay_gap",
                "node": "local",
                "reason": "evicted",
                "oldest_available": "rt1:rt-local:40",
                "latest_available": "rt1:rt-local:90",
            }
        ),
        _status_line(NodeUp("gpu1", "rt-gpu1-b", "0.1.0", restarted=True), T0_S + 5),
        _status_line(NodeDown("gpu2", "node_unreachable", "refused", 2, 0.5), T0_S + 5),
        b"",
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_fleet_recording_replays_node_by_node(tmp_path: Path) -> None:
    source = FleetReplaySource(_recording(tmp_path / "fleet.ndjson"), speed=math.inf)
    sink = Collect()
    source.start(sink)
    assert source.done.wait(10)
    assert sink.threads == {"skippy-tui-fleet-replay"}
    assert isinstance(sink.items[-1], SourceEnded)
    events = {
        node: [i.item for i in sink.items if isinstance(i, NodeItem) and i.node == node]
        for node in ("local", "gpu1")
    }
    # Decoded events equal the originals on the wire, node by node, in order.
    assert [event_record(e) for e in events["local"] if isinstance(e, Event)] == [
        event_record(e) for e in demo.available()
    ]
    assert [event_record(e) for e in events["gpu1"] if isinstance(e, Event)] == [
        event_record(e) for e in demo.failed()
    ]
    skips = [
        (i.node if isinstance(i, NodeItem) else None, i.item if isinstance(i, NodeItem) else i)
        for i in sink.items
        if isinstance(i, DecodeSkipped)
        or (isinstance(i, NodeItem) and isinstance(i.item, DecodeSkipped))
    ]
    assert skips == [
        (None, DecodeSkipped(SkipReason.MALFORMED_LINE)),
        ("gpu1", DecodeSkipped(SkipReason.UNKNOWN_EVENT)),
        (None, DecodeSkipped(SkipReason.INVALID_RECORD)),
        ("gpu2", DecodeSkipped(SkipReason.INVALID_RECORD)),
    ]
    statuses = [i for i in sink.items if isinstance(i, NodeUp | NodeDown | NodeGap)]
    assert statuses == [
        NodeUp("local", "rt-local", "0.1.0"),
        NodeUp("gpu1", "rt-gpu1-a", "0.1.0"),
        NodeDown("gpu2", "node_unreachable", "refused", 1, 0.25),
        NodeGap("local", "evicted"),
        NodeUp("gpu1", "rt-gpu1-b", "0.1.0", restarted=True),
        NodeDown("gpu2", "node_unreachable", "refused", 2, 0.5),
    ]
    assert (source.skipped, source.delivered) == (4, 6 + len(demo.available() + demo.failed()))
    assert source.description == "fleet replay fleet.ndjson ×inf"


def test_a_replayed_fleet_recording_reduces_into_the_fleet_store(tmp_path: Path) -> None:
    source = FleetReplaySource(_recording(tmp_path / "fleet.ndjson"), speed=math.inf)
    store = FleetStore(source.nodes)
    source.start(store.deliver)
    assert source.done.wait(10)
    snapshot = store.snapshot()
    assert snapshot.names == ("local", "gpu1", "gpu2")
    local, gpu1, gpu2 = snapshot.nodes
    assert local.dashboard.view.models[demo.TINY].state is ModelState.AVAILABLE
    assert gpu1.health.restarts == 1
    assert gpu1.dashboard.view.models == {}  # restarted at the end: its new stream is empty
    assert (gpu2.health.reach, gpu2.health.reason_code, gpu2.health.attempt) == (
        Reach.UNREACHABLE,
        "node_unreachable",
        2,
    )
    assert (gpu1.health.skipped, gpu2.health.skipped) == (1, 1)
    assert local.health.gaps == 1
    assert dict(snapshot.skipped) == {SkipReason.MALFORMED_LINE: 1, SkipReason.INVALID_RECORD: 1}
    assert snapshot.ended


def test_a_fleet_line_paces_by_its_records_time() -> None:
    event = demo.available()[3]
    (item,), wall_ns = decode_fleet_line(_event_line("gpu1", event, 3))
    assert isinstance(item, NodeItem) and item.node == "gpu1"
    assert isinstance(item.item, Event) and event_record(item.item) == event_record(event)
    assert wall_ns == event.wall_ns
    status, at_ns = decode_fleet_line(_status_line(NodeUp("gpu1", "i", "v"), T0_S + 1.5))
    assert status == [NodeUp("gpu1", "i", "v")]
    assert at_ns == demo.T0_NS + 1_500_000_000


# -- the live stream ------------------------------------------------------------------------------


def _frame(name: str, data: dict[str, Any], cursor: str | None = None) -> Frame:
    return Frame(name, cursor, data)


def _event_frame(event: Event, sequence: int, instance: str = "rt-a") -> Frame:
    cursor = f"rt1:{instance}:{sequence}"
    data = {
        "version": 1,
        "cursor": cursor,
        "process_instance_id": instance,
        "sequence": sequence,
        "event": event_object(event),
    }
    return _frame("runtime_event", data, cursor)


def test_live_frames_become_node_items() -> None:
    event = demo.available()[4]
    (item,) = fleet_items(NodeFrame("gpu1", _event_frame(event, 5)))
    assert isinstance(item, NodeItem) and item.node == "gpu1"
    assert isinstance(item.item, Event)
    assert event_record(item.item) == event_record(event)
    state = {"state": {"loadable_models": [{"model_id": "qwen", "source": "preset"}]}}
    (loadable,) = fleet_items(NodeFrame("gpu1", _frame("runtime_state", state)))
    assert isinstance(loadable, NodeItem) and isinstance(loadable.item, LoadableModels)
    assert [m.model_id for m in loadable.item.models] == ["qwen"]
    gap = {"gap": {"reason": "evicted"}}
    assert fleet_items(NodeFrame("gpu1", _frame("runtime_replay_gap", gap))) == [
        NodeGap("gpu1", "evicted")
    ]
    assert fleet_items(NodeFrame("gpu1", _frame("runtime_health", {}))) == []
    bad = {"version": 1, "event": {"kind": "model_teleported"}}
    assert fleet_items(NodeFrame("gpu1", _frame("runtime_event", bad))) == [
        NodeItem("gpu1", DecodeSkipped(SkipReason.UNKNOWN_EVENT))
    ]
    down = NodeDown("gpu2", "node_unreachable", "refused", 1, 0.25)
    assert fleet_items(down) == [down]


class FakeRuntime:
    """Enough of a `RuntimeClient` for a fleet follower: /health, then a stream of frames that
    stays open until the client is closed."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.closed = threading.Event()

    def health(self) -> tuple[int, dict[str, Any]]:
        return 200, {"process_instance_id": "rt-a", "version": "0.1.0"}

    def frames(self, last_event_id: str | None = None) -> Iterator[Frame]:
        assert last_event_id == "rt1:rt-a:0"  # a first connection replays everything
        yield _frame("runtime_state", {"state": {}})
        for sequence, event in enumerate(self.events, start=1):
            yield _event_frame(event, sequence)
        self.closed.wait(30)

    def close(self) -> None:
        self.closed.set()


def test_the_live_source_follows_each_node_and_reports_one_that_cannot_be_reached() -> None:
    runtime = FakeRuntime(demo.available())

    def unreachable() -> RuntimeClient:
        raise RuntimeUnreachable("connection refused")

    factories: dict[str, ClientFactory] = {
        "local": lambda: cast(RuntimeClient, runtime),
        "gpu2": unreachable,
    }
    source = FleetLiveSource(factories, "live fleet · 2 nodes")
    store = FleetStore(source.nodes)
    sink = Collect()

    def deliver(item: FleetSourceItem) -> None:
        store.deliver(item)
        sink(item)

    events = len(demo.available())
    served = sink.when(lambda items: sum(isinstance(i, NodeItem) for i in items) > events)
    refused = sink.when(
        lambda items: any(isinstance(i, NodeDown) and i.attempt >= 2 for i in items)
    )
    source.start(deliver)
    try:
        assert served.wait(10), "the local node's events did not arrive"
        assert refused.wait(10), "the unreachable node was not retried"
    finally:
        source.stop(timeout_s=5)
    assert runtime.closed.is_set()  # stop closes every node's stream
    assert sink.threads == {"skippy-tui-fleet"}
    assert source.nodes == ("local", "gpu2")
    snapshot = store.snapshot()
    local, gpu2 = snapshot.nodes
    assert (local.health.reach, local.health.version, local.health.instance) == (
        Reach.REACHABLE,
        "0.1.0",
        "rt-a",
    )
    assert local.dashboard.view.models[demo.TINY].state is ModelState.AVAILABLE
    assert gpu2.health.reach is Reach.UNREACHABLE
    assert gpu2.health.reason_code == "node_unreachable"
    assert gpu2.health.attempt >= 2
    count = len(sink.items)
    source.stop()  # idempotent; nothing arrives after stop
    assert len(sink.items) == count
