"""Shared helpers of the acquisition tests: the repo and file names the loopback hub serves
(tests/acquisition/conftest.py), a recorder of acquisition events, a pull that succeeds or
fails, the files left in a hub cache, and a hub endpoint that nothing answers."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.acquisition.acquire import Acquisition, Prepared
from skippyctl.acquisition.errors import PreparationError
from skippyctl.acquisition.hub import HubSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from tests.acquisition.fake_hub import FakeHub

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
CHUNK_BYTES = 4096


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    @property
    def ids(self) -> list[EventId]:
        return [e.id for e in self.events]

    def of(self, event_id: EventId) -> list[Event]:
        return [e for e in self.events if e.id is event_id]


def acquisition(hub: FakeHub, cache: Path, recorder: Recorder, **settings: Any) -> Acquisition:
    return Acquisition(
        recorder, HubSettings(endpoint=hub.endpoint, cache_dir=str(cache), **settings)
    )


def pull(hub: FakeHub, cache: Path, ref: str, **settings: Any) -> tuple[Recorder, Prepared]:
    recorder = Recorder()
    return recorder, acquisition(hub, cache, recorder, **settings).prepare(ref)


def failed(hub: FakeHub, cache: Path, ref: str) -> tuple[Recorder, PreparationError]:
    recorder = Recorder()
    with pytest.raises(PreparationError) as caught:
        acquisition(hub, cache, recorder).prepare(ref)
    return recorder, caught.value


def leftovers(cache: Path) -> list[str]:
    """Every file or link in the cache (blobs, partials, snapshot links; lock files aside)."""
    return sorted(
        p.name
        for p in cache.rglob("*")
        if (p.is_file() or p.is_symlink()) and ".locks" not in p.parts
    )


def assert_one_terminal_each(recorder: Recorder) -> None:
    ops: dict[str, int] = {}
    for event in recorder.events:
        if event.delivery.value == "terminal":
            ops[str(event.operation_id)] = ops.get(str(event.operation_id), 0) + 1
    started = {str(e.operation_id) for e in recorder.events}
    assert ops == dict.fromkeys(started, 1), ops


@contextlib.contextmanager
def unreachable_endpoint() -> Iterator[str]:
    """A hub endpoint that cannot be reached: a loopback port bound, never listening."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{closed.getsockname()[1]}"
