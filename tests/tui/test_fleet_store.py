"""The fleet store: one reduced runtime per node, each node's stream health, one fleet log."""

from __future__ import annotations

from skippy_tui import demo
from skippy_tui.fleet_source import NodeDown, NodeGap, NodeItem, NodeUp
from skippy_tui.fleet_store import FleetStore, NodeHealth, Reach
from skippy_tui.sources import DecodeSkipped, LoadableModels, SourceEnded
from skippy_tui.store import Connection
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.output.codec import SkipReason
from skippyctl.output.state_reader import LoadableEntry
from skippyctl.reducer.state import ModelState

TINY = LogicalId("tiny")
BROKEN = LogicalId("broken")


def _deliver_events(store: FleetStore, node: str, events: list[Event]) -> None:
    for event in events:
        store.deliver(NodeItem(node, event))


def test_each_node_is_reduced_on_its_own() -> None:
    store = FleetStore(["local", "gpu1"])
    store.deliver(NodeUp("local", "rt-a", "0.1.0"))
    store.deliver(NodeUp("gpu1", "rt-b", "0.1.0"))
    _deliver_events(store, "local", demo.available())
    _deliver_events(store, "gpu1", demo.failed())
    snapshot = store.snapshot()
    local, gpu1 = snapshot.nodes
    assert (local.name, gpu1.name) == ("local", "gpu1")
    assert set(local.dashboard.view.models) == {TINY}
    assert local.dashboard.view.models[TINY].state is ModelState.AVAILABLE
    assert gpu1.dashboard.view.models[BROKEN].state is ModelState.FAILED
    assert local.health.events == len(demo.available())
    assert gpu1.health.last_event_wall_ns == demo.failed()[-1].wall_ns
    # One fleet log, in arrival order, each event with its node.
    assert snapshot.events_total == len(demo.available()) + len(demo.failed())
    assert [node for node, _ in snapshot.recent[:1]] == ["local"]
    assert snapshot.recent[-1] == ("gpu1", demo.failed()[-1])
    # A node's own store keeps no second copy of the log.
    assert local.dashboard.recent == ()


def test_nodes_are_listed_from_the_start_and_then_as_they_first_appear() -> None:
    store = FleetStore(["local", "gpu1"])
    assert store.snapshot().names == ("local", "gpu1")
    assert store.snapshot().nodes[0].health == NodeHealth()
    store.deliver(NodeItem("gpu9", demo.loading()[0]))
    assert store.snapshot().names == ("local", "gpu1", "gpu9")


def test_an_unreachable_node_is_a_state_with_its_reason_and_recovers() -> None:
    store = FleetStore(["gpu2"])
    store.deliver(NodeUp("gpu2", "rt-2", "0.1.0"))
    _deliver_events(store, "gpu2", demo.available())
    store.deliver(NodeDown("gpu2", "node_unreachable", "connection refused", 1, 0.25))
    store.deliver(NodeDown("gpu2", "node_unreachable", "connection refused", 2, 0.5))
    down = store.snapshot().nodes[0]
    assert down.health.reach is Reach.UNREACHABLE
    assert (down.health.reason_code, down.health.attempt, down.health.retry_in_s) == (
        "node_unreachable",
        2,
        0.5,
    )
    assert down.health.downs == 1  # one episode, two attempts
    assert down.dashboard.connection is Connection.DOWN
    # Its last reduced state stays (stale, not "down"): the model is still known available.
    assert down.dashboard.view.models[TINY].state is ModelState.AVAILABLE

    store.deliver(NodeUp("gpu2", "rt-2", "0.1.0"))
    back = store.snapshot().nodes[0]
    assert back.health.reach is Reach.REACHABLE
    assert (back.health.reason_code, back.health.attempt, back.health.restarts) == (None, 0, 0)
    assert back.dashboard.connection is Connection.CONNECTED
    assert back.dashboard.view.models[TINY].state is ModelState.AVAILABLE  # resumed, not reset


def test_a_restarted_runtime_starts_its_node_over_and_is_counted() -> None:
    store = FleetStore(["gpu1"])
    store.deliver(NodeUp("gpu1", "rt-a", "0.1.0"))
    _deliver_events(store, "gpu1", demo.failed())
    store.deliver(NodeDown("gpu1", "node_stream_closed", "closed", 1, 0.25))
    store.deliver(NodeUp("gpu1", "rt-b", "0.2.0", restarted=True))
    restarted = store.snapshot().nodes[0]
    assert restarted.health.restarts == 1
    assert (restarted.health.instance, restarted.health.version) == ("rt-b", "0.2.0")
    assert restarted.dashboard.view.models == {}  # the new instance's stream starts over
    _deliver_events(store, "gpu1", demo.loading())
    node = store.snapshot().nodes[0]
    assert set(node.dashboard.view.models) == {TINY}
    assert node.dashboard.events_total == len(demo.loading())
    assert node.health.events == len(demo.failed()) + len(demo.loading())  # the stream's total


def test_gaps_skips_and_loadable_models_are_the_nodes_own() -> None:
    store = FleetStore(["local", "gpu1"])
    store.deliver(NodeGap("local", "evicted"))
    store.deliver(NodeItem("local", DecodeSkipped(SkipReason.UNKNOWN_EVENT)))
    store.deliver(NodeItem("local", DecodeSkipped(SkipReason.UNKNOWN_FIELD, count=2)))
    entry = LoadableEntry(model_id="qwen", source="models_dir")
    store.deliver(NodeItem("gpu1", LoadableModels((entry,))))
    store.deliver(DecodeSkipped(SkipReason.MALFORMED_LINE))  # a line of no node
    snapshot = store.snapshot()
    local, gpu1 = snapshot.nodes
    assert (local.health.gaps, local.health.skipped) == (1, 3)
    assert dict(local.dashboard.skipped) == {
        SkipReason.UNKNOWN_EVENT: 1,
        SkipReason.UNKNOWN_FIELD: 2,
    }
    assert gpu1.dashboard.loadable == (entry,)
    assert local.dashboard.loadable == ()
    assert dict(snapshot.skipped) == {SkipReason.MALFORMED_LINE: 1}


def test_the_end_of_a_replay_ends_every_node() -> None:
    store = FleetStore(["local", "gpu1"])
    store.deliver(SourceEnded())
    snapshot = store.snapshot()
    assert snapshot.ended
    assert all(n.health.ended for n in snapshot.nodes)
    assert all(n.dashboard.connection is Connection.ENDED for n in snapshot.nodes)


def test_nodes_past_the_bound_are_counted_never_stored() -> None:
    store = FleetStore(max_nodes=2)
    for name in ("a", "b", "c", "d"):
        store.deliver(NodeUp(name, "rt", "0.1.0"))
    snapshot = store.snapshot()
    assert snapshot.names == ("a", "b")
    assert dict(snapshot.skipped) == {SkipReason.INVALID_RECORD: 2}


def test_the_fleet_log_is_bounded_and_the_snapshot_is_reused_while_nothing_arrives() -> None:
    store = FleetStore(["local"], max_recent_events=5)
    _deliver_events(store, "local", demo.available())
    first = store.snapshot()
    assert len(first.recent) == 5
    assert first.events_total == len(demo.available())
    assert store.snapshot() is first
    store.deliver(NodeGap("local", "evicted"))
    assert store.snapshot() is not first


def test_the_filter_selects_one_node_or_all() -> None:
    store = FleetStore(["local", "gpu1", "gpu2"])
    snapshot = store.snapshot()
    assert [n.name for n in snapshot.shown(None)] == ["local", "gpu1", "gpu2"]
    assert [n.name for n in snapshot.shown("gpu1")] == ["gpu1"]
    assert snapshot.node("gpu2") is snapshot.nodes[2]
    assert snapshot.node("nope") is None
