"""The live source over a real runtime: every frame decodes through the wire codec, nothing is
skipped, and the client-side reducer reaches the runtime's state."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skippy_tui.live import LiveSource, changes_loadable
from skippy_tui.sources import DecodeSkipped, LoadableModels, SourceItem
from skippy_tui.store import SnapshotStore
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, make_event
from skippyctl.output.codec import event_from_object
from skippyctl.output.state_reader import LoadableEntry
from skippyctl.reducer.state import ModelState
from tests.api.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("runtime"))
    try:
        assert running.load(fixture_dir / "tiny.gguf")["state"] == "available"
        yield running
    finally:
        stop_server(running)


class Sink:
    """Collects what the source delivers and feeds the dashboard's store, on the source thread."""

    def __init__(self) -> None:
        self.store = SnapshotStore()
        self.items: list[SourceItem] = []
        self.available = threading.Event()

    def __call__(self, item: SourceItem) -> None:
        self.items.append(item)
        self.store.deliver(item)
        if isinstance(item, Event) and item.id is EventId.MODEL_AVAILABLE:
            self.available.set()


def test_the_live_source_replays_the_runtime_through_the_codec_without_skips(
    server: Server,
) -> None:
    sink = Sink()
    source = LiveSource(server.client(), RuntimeSettings(runtime_dir=server.directory))
    source.start(sink)
    try:
        assert sink.available.wait(30), "model_available never arrived"
    finally:
        source.stop()
        source.client.close()
    events = [item for item in sink.items if isinstance(item, Event)]
    assert [item for item in sink.items if isinstance(item, DecodeSkipped)] == []
    # What the source delivered is what the runtime retained, event for event.
    replayed = [event_from_object(data) for data in server.events()]
    assert events == replayed[: len(events)]
    assert all(event.mono_ns == event.wall_ns for event in events)
    assert source.cursor is not None
    assert source.cursor.startswith(f"rt1:{server.discovery.process_instance_id}:")
    model = sink.store.snapshot().view.models[LogicalId("tiny")]
    assert model.state is ModelState.AVAILABLE


class LoadableSink:
    """Feeds the dashboard's store and wakes a waiter each time a loadable list arrives."""

    def __init__(self) -> None:
        self.store = SnapshotStore()
        self.arrived = threading.Condition()

    def __call__(self, item: SourceItem) -> None:
        self.store.deliver(item)
        if isinstance(item, LoadableModels):
            with self.arrived:
                self.arrived.notify_all()

    def wait_for(self, check: Callable[[tuple[LoadableEntry, ...]], bool]) -> None:
        with self.arrived:
            found = self.arrived.wait_for(lambda: check(self.store.snapshot().loadable), 60)
        assert found, self.store.snapshot().loadable


def test_the_live_source_follows_what_the_runtime_may_load_as_models_load_and_unload(
    tmp_path: Path, fixture_dir: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(fixture_dir / "tiny.gguf", models / "shelved.gguf")
    server = start_server(tmp_path / "runtime", "--models-dir", str(models))
    sink = LoadableSink()
    source = LiveSource(server.client(), RuntimeSettings(runtime_dir=server.directory))
    try:
        source.start(sink)
        sink.wait_for(lambda listed: listed == (LoadableEntry("shelved", "models_dir"),))
        assert server.load(models / "shelved.gguf")["state"] == "available"
        # The load's events make the source read the list again: the model is no longer in it.
        sink.wait_for(lambda listed: listed == ())
        model = sink.store.snapshot().view.models[LogicalId("shelved")]
        assert model.state is ModelState.AVAILABLE
        with server.http() as http:
            answer = http.post("/api/runtime/models/shelved/unload", json={})
        assert answer.status_code in (200, 202), answer.text
        sink.wait_for(lambda listed: [entry.model_id for entry in listed] == ["shelved"])
        assert source.loadable_reads >= 3
    finally:
        source.stop()
        source.client.close()
        stop_server(server)


@pytest.mark.parametrize(
    ("event_id", "changes"),
    [
        (EventId.MODEL_AVAILABLE, True),
        (EventId.MODEL_LOAD_FAILED, True),
        (EventId.UNLOAD_COMPLETED, True),
        (EventId.MODEL_DOWNLOAD_COMPLETED, True),
        (EventId.MODEL_LOAD_PROGRESS, False),
        (EventId.REQUEST_COMPLETED, False),
    ],
)
def test_the_loadable_list_is_read_again_after_a_models_lifecycle_ends(
    event_id: EventId, changes: bool
) -> None:
    assert changes_loadable(make_event(event_id)) is changes
