"""The client-side reducer copy: bounded, thread-safe, and fed only facts."""

from __future__ import annotations

import threading

from skippy_tui import demo
from skippy_tui.sources import DecodeSkipped, RuntimeBack, RuntimeDown, SourceEnded
from skippy_tui.store import RUNTIME_START_IDS, Connection, SnapshotStore, model_phase
from skippyctl.events.catalog import EventId
from skippyctl.output.codec import SkipReason
from skippyctl.reducer.state import ModelState, NodeState, RuntimeView


def _store(events: list[demo.Event], **kw: int) -> SnapshotStore:
    store = SnapshotStore(**kw)
    for event in events:
        store.deliver(event)
    return store


def test_loading_model_has_a_phase_and_progress_and_the_node_is_starting() -> None:
    snapshot = _store(demo.loading()).snapshot()
    model = snapshot.view.models[demo.TINY]
    assert model.state is ModelState.LOADING
    assert model.progress is not None and model.progress.current == 639
    assert model_phase(snapshot, demo.TINY, model.state) == "loading weights"
    assert snapshot.view.node is NodeState.STARTING


def test_phase_is_forgotten_once_the_model_is_available() -> None:
    snapshot = _store(demo.available()).snapshot()
    assert snapshot.view.models[demo.TINY].state is ModelState.AVAILABLE
    assert snapshot.phases == {}


def test_reducer_transitions_in_the_stream_are_logged_but_not_reduced_again() -> None:
    events = demo.available()
    snapshot = _store(events).snapshot()
    assert [e.id for e in snapshot.recent] == [e.id for e in events]
    assert EventId.MODEL_AVAILABLE in {e.id for e in snapshot.recent}
    assert snapshot.view.counters.rejected_transitions == 0
    assert snapshot.view.counters.duplicate_transitions == 0


def test_recent_events_are_bounded_and_evictions_counted() -> None:
    events = demo.flood(3000)
    snapshot = _store(events, max_recent_events=100).snapshot()
    assert len(snapshot.recent) == 100
    assert snapshot.recent[-1] is events[-1]
    assert snapshot.events_total == len(events)
    assert snapshot.recent_evicted == len(events) - 100


def test_rates_are_bucketed_by_event_second_with_gaps_as_zero() -> None:
    snapshot = _store(demo.pressure(), rate_window_s=60).snapshot()
    seconds = [sample.second for sample in snapshot.rates]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    assert sum(sample.drops for sample in snapshot.rates) == (
        snapshot.view.event_system.dropped_progress + snapshot.view.event_system.dropped_diagnostic
    )
    assert max(sample.events for sample in snapshot.rates) > 40


def test_rate_window_keeps_only_the_last_seconds() -> None:
    snapshot = _store(demo.pressure(), rate_window_s=5).snapshot()
    assert len(snapshot.rates) == 5


def test_connection_facts_and_decode_skips() -> None:
    store = _store(demo.loading())
    assert store.snapshot().connection is Connection.CONNECTED
    store.deliver(RuntimeDown(attempt=3))
    down = store.snapshot()
    assert (down.connection, down.reconnect_attempt) == (Connection.DOWN, 3)
    assert down.view.models[demo.TINY].state is ModelState.LOADING  # stale, never "down"
    store.deliver(RuntimeBack(state=RuntimeView()))
    back = store.snapshot()
    assert back.connection is Connection.CONNECTED
    assert back.view.models == {}
    assert back.phases == {}
    store.deliver(DecodeSkipped(SkipReason.UNKNOWN_EVENT, count=2))
    store.deliver(DecodeSkipped(SkipReason.UNKNOWN_EVENT))
    store.deliver(SourceEnded())
    final = store.snapshot()
    assert final.skipped == {SkipReason.UNKNOWN_EVENT: 3}
    assert final.connection is Connection.ENDED


def test_snapshot_is_reused_until_something_arrives() -> None:
    store = _store(demo.loading())
    first = store.snapshot()
    assert store.snapshot() is first
    store.deliver(SourceEnded())
    assert store.snapshot() is not first


def test_a_source_thread_and_a_reader_never_see_a_torn_snapshot() -> None:
    events = demo.flood(4000)
    store = SnapshotStore(max_recent_events=500)
    done = threading.Event()

    def produce() -> None:
        for event in events:
            store.deliver(event)
        done.set()

    producer = threading.Thread(target=produce, name="test-producer")
    producer.start()
    versions = []
    while not done.is_set():
        snapshot = store.snapshot()
        assert len(snapshot.recent) <= 500
        assert snapshot.events_total >= len(snapshot.recent)
        versions.append(snapshot.version)
    producer.join()
    assert versions == sorted(versions)
    assert store.snapshot().events_total == len(events)


def test_a_stream_joined_mid_way_is_taken_to_come_from_a_running_runtime() -> None:
    """`skippyctl load --json` starts at model_load_requested: no runtime_initialized to see."""
    events = [e for e in demo.available() if e.id not in RUNTIME_START_IDS]
    assert events[0].id is EventId.NODE_UNAVAILABLE
    snapshot = _store(events).snapshot()
    assert snapshot.view.node is NodeState.ACCEPTING
    loading = _store([e for e in demo.loading() if e.id not in RUNTIME_START_IDS]).snapshot()
    assert loading.view.node is NodeState.STARTING  # loading, never "down"


def test_a_stream_from_the_start_waits_for_runtime_initialized() -> None:
    snapshot = _store(demo.available()[:1]).snapshot()
    assert snapshot.view.node is NodeState.STARTING


def test_a_download_is_followed_with_its_bytes_and_rate_until_it_ends() -> None:
    from skippyctl.events.envelope import LogicalId, Progress, Scope, make_event
    from skippyctl.events.reasons import ProgressUnit

    store = SnapshotStore()
    op = LogicalId("pull-1.download")
    scope = Scope(model_id=LogicalId("tiny-Q4_K_M"))

    def event(kind: EventId, wall_s: float, done: int | None = None) -> None:
        progress = None if done is None else Progress(done, 4_000_000, ProgressUnit.BYTES)
        store.deliver(
            make_event(
                kind,
                operation_id=op,
                parent_operation_id=LogicalId("pull-1"),
                scope=scope,
                progress=progress,
                wall_ns=int(wall_s * 1e9),
            )
        )

    event(EventId.MODEL_DOWNLOAD_STARTED, 100.0)
    event(EventId.MODEL_DOWNLOAD_PROGRESS, 102.0, 1_000_000)
    download = store.snapshot().downloads["pull-1.download"]
    assert download.model_id == "tiny-Q4_K_M"
    assert (download.bytes_done, download.bytes_total) == (1_000_000, 4_000_000)
    assert download.bytes_per_s == 500_000
    event(EventId.MODEL_DOWNLOAD_COMPLETED, 105.0)
    assert dict(store.snapshot().downloads) == {}

    # A resumed download starts at what its partial file had: shown, not counted in the rate.
    event(EventId.MODEL_DOWNLOAD_STARTED, 200.0, 3_000_000)
    resumed = store.snapshot().downloads["pull-1.download"]
    assert (resumed.bytes_done, resumed.bytes_total) == (3_000_000, 4_000_000)
    event(EventId.MODEL_DOWNLOAD_PROGRESS, 202.0, 3_500_000)
    assert store.snapshot().downloads["pull-1.download"].bytes_per_s == 250_000


def test_the_loadable_list_replaces_the_last_and_the_same_list_changes_nothing() -> None:
    from skippy_tui.sources import LoadableModels
    from skippyctl.output.state_reader import LoadableEntry

    store = _store(demo.available())
    assert store.snapshot().loadable == ()
    listed = (LoadableEntry("held", "preset", pinned=True), LoadableEntry("shelf", "models_dir"))
    store.deliver(LoadableModels(listed))
    first = store.snapshot()
    assert first.loadable == listed
    assert first.view.models[demo.TINY].state is ModelState.AVAILABLE  # the state is kept
    same = (LoadableEntry("held", "preset", pinned=True), LoadableEntry("shelf", "models_dir"))
    store.deliver(LoadableModels(same))
    assert store.snapshot() is first  # an equal list: nothing to redraw
    store.deliver(RuntimeDown(attempt=1))  # a runtime that went away keeps its last list
    assert store.snapshot().loadable == listed
    store.deliver(LoadableModels(listed[1:]))
    assert store.snapshot().loadable == listed[1:]
