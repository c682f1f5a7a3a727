"""Download progress: throttled to steps of at least 1 % and an interval, monotonic across a
resumed download, and read as bytes by people."""

from __future__ import annotations

import itertools
from pathlib import Path

from skippyctl.acquisition.acquire import Acquisition
from skippyctl.acquisition.hub import HubSettings
from skippyctl.acquisition.transfer import ProgressThrottle
from skippyctl.events.catalog import EventId as _E
from tests.acquisition.fake_hub import FakeHub
from tests.acquisition.helpers import CHUNK_BYTES, FILE, REPO, Recorder, failed, pull


def test_progress_throttle_needs_both_the_interval_and_the_step() -> None:
    ticks = itertools.count()
    throttle = ProgressThrottle(total=10_000, clock=lambda: next(ticks) * 0.1)
    told = [v for v in range(0, 10_001, 10) if throttle.offer(v)]
    assert throttle.final(10_000) or told[-1] == 10_000
    assert told[0] == 0
    steps = list(itertools.pairwise(told))
    assert all(b - a >= 100 for a, b in steps)  # ≥ 1 % of the total
    assert all(b - a >= 30 for a, b in steps)  # ≥ 0.25 s at 0.1 s per 10 bytes → ≥ 3 offers
    assert not throttle.offer(5)  # never backwards
    assert not throttle.final(10_000)  # the last value is told once


def test_download_progress_steps_are_at_least_one_percent(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    ticks = itertools.count()
    recorder = Recorder()
    clocked = Acquisition(
        recorder,
        HubSettings(endpoint=hub.endpoint, cache_dir=str(cache)),
        clock=lambda: next(ticks) * 1.0,  # every callback is long after the last: steps decide
    )
    clocked.prepare(f"hf://{REPO}/{FILE}")
    size = len(files[FILE])
    currents = [0] + [
        e.progress.current for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS) if e.progress
    ]
    steps = [b - a for a, b in itertools.pairwise(currents)]
    assert all(step >= size // 100 for step in steps[:-1])
    assert currents[-1] == size
    assert len(steps) < -(-size // CHUNK_BYTES)


def test_dropped_connection_resumes_with_a_range_request(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    hub.drop_after[FILE] = 100_000

    recorder, prepared = pull(hub, cache, f"hf://{REPO}/{FILE}")

    first, resumed = hub.body_gets(FILE)
    assert first is None
    # The client resumes from the last whole chunk it wrote (httpx hands out full chunks).
    assert resumed is not None
    offset = int(resumed.removeprefix("bytes=").removesuffix("-"))
    assert 100_000 - CHUNK_BYTES < offset <= 100_000
    assert prepared.path.read_bytes() == files[FILE]
    assert prepared.verified == ("sha256",)
    currents = [e.progress.current for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS) if e.progress]
    assert currents == sorted(currents)
    assert currents[-1] == len(files[FILE])
    assert recorder.ids[-1] is _E.MODEL_PREPARATION_COMPLETED


def test_download_events_read_as_bytes_for_people(hub: FakeHub, cache: Path) -> None:
    from skippyctl.output.summary import render_summary

    recorder, _ = pull(hub, cache, f"hf://{REPO}/{FILE}")
    texts = {e.id: render_summary(e) for e in recorder.events}
    assert texts[_E.MODEL_DOWNLOAD_STARTED] == "download started (425.5 KiB)"
    assert texts[_E.MODEL_DOWNLOAD_PROGRESS] == "downloading 100.0% (425.5 KiB of 425.5 KiB)"
    assert texts[_E.MODEL_DOWNLOAD_COMPLETED].startswith("downloaded 425.5 KiB in ")
    recorder, _ = failed(hub, cache, f"hf://{REPO}/absent.gguf")
    assert render_summary(recorder.events[-1]) == (
        "Preparing a model package failed (missing_artifact)"
    )
