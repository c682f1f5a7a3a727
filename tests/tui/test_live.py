"""The live source over a real runtime: every frame decodes through the wire codec, nothing is
skipped, and the client-side reducer reaches the runtime's state."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippy_tui.live import LiveSource
from skippy_tui.sources import DecodeSkipped, SourceItem
from skippy_tui.store import SnapshotStore
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.output.codec import event_from_object
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
