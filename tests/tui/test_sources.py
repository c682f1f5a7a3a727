"""Event sources: ordering, pacing, replay decoding and bounded stop."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from skippy_tui import demo
from skippy_tui.sources import (
    DecodeSkipped,
    PushSource,
    ReplaySource,
    ScriptedSource,
    SourceEnded,
    SourceItem,
)
from skippyctl.events.envelope import Event
from skippyctl.output.codec import SkipReason, event_record


class Collect:
    def __init__(self) -> None:
        self.items: list[SourceItem] = []
        self.threads: set[str] = set()

    def __call__(self, item: SourceItem) -> None:
        self.threads.add(threading.current_thread().name)
        self.items.append(item)

    @property
    def events(self) -> list[Event]:
        return [item for item in self.items if isinstance(item, Event)]


def _ndjson(path: Path, events: list[Event], extra: Sequence[bytes] = ()) -> Path:
    lines = [orjson.dumps(event_record(e, seq=i)) for i, e in enumerate(events)]
    path.write_bytes(b"\n".join([*lines[:3], *extra, *lines[3:]]) + b"\n")
    return path


def test_scripted_source_delivers_in_order_on_its_own_thread() -> None:
    events = demo.available()
    sink = Collect()
    source = ScriptedSource(demo.script(events), announce_end=True)
    source.start(sink)
    assert source.done.wait(5)
    assert sink.events == events
    assert isinstance(sink.items[-1], SourceEnded)
    assert sink.threads == {"skippy-tui-scripted"}


def test_stop_is_bounded_and_idempotent() -> None:
    sink = Collect()
    source = ScriptedSource([(60.0, demo.loading()[0])])
    source.start(sink)
    started = time.monotonic()
    source.stop(timeout_s=2)
    source.stop(timeout_s=2)
    assert time.monotonic() - started < 2
    assert source.done.wait(2)
    assert sink.items == []


def test_replay_skips_and_counts_what_it_cannot_decode(tmp_path: Path) -> None:
    events = demo.available()
    path = _ndjson(
        tmp_path / "load.ndjson",
        events,
        [
            b"garbage",
            b'{"schema_version":1,"event":"model_teleported","ts":"2026-01-15T09:00:00Z"}',
            b"",
        ],
    )
    sink = Collect()
    source = ReplaySource(path, speed=math.inf)
    source.start(sink)
    assert source.done.wait(5)
    assert [event_record(e) for e in sink.events] == [
        event_record(e) for e in events
    ]  # decoded events equal the originals on the wire
    skips = [item.reason for item in sink.items if isinstance(item, DecodeSkipped)]
    assert skips == [SkipReason.MALFORMED_LINE, SkipReason.UNKNOWN_EVENT]
    assert isinstance(sink.items[-1], SourceEnded)
    assert (source.delivered, source.skipped) == (len(events), 2)
    assert source.description == "replay load.ndjson ×inf"


def test_replay_paces_by_record_time_divided_by_speed(tmp_path: Path) -> None:
    events = demo.loading()  # about 0.7 s of recorded time
    span_s = (events[-1].wall_ns - events[0].wall_ns) / 1e9
    path = _ndjson(tmp_path / "load.ndjson", events)
    sink = Collect()
    source = ReplaySource(path, speed=4.0)
    started = time.monotonic()
    source.start(sink)
    assert source.done.wait(10)
    elapsed = time.monotonic() - started
    assert elapsed >= span_s / 4 * 0.9
    assert elapsed < span_s  # faster than real time


def test_push_source_delivers_on_the_callers_thread_only_while_started() -> None:
    sink = Collect()
    source = PushSource()
    event = demo.loading()[0]
    source.push(event)
    source.start(sink)
    source.push(event)
    source.stop()
    source.push(event)
    assert sink.items == [event]
    assert source.discarded == 2


def test_replay_of_a_file_that_cannot_be_read_just_ends(tmp_path: Path) -> None:
    sink = Collect()
    source = ReplaySource(tmp_path / "missing.ndjson")
    source.start(sink)
    assert source.done.wait(5)
    assert sink.items == [SourceEnded()]
