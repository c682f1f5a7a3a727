"""A pull against the loopback hub (tests/acquisition/fake_hub.py): the real huggingface_hub
client, its real cache in a tmp dir, no network — each step told in order, the cache reused and
refreshed, a split set whole, a local path checked without the hub."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from skippyctl.acquisition.acquire import Acquisition
from skippyctl.acquisition.errors import PreparationError
from skippyctl.acquisition.hub import HubSettings
from skippyctl.events.catalog import EventId as _E
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from tests.acquisition.fake_hub import FakeHub, FakeRepo
from tests.acquisition.helpers import (
    CHUNK_BYTES,
    FILE,
    REPO,
    Recorder,
    assert_one_terminal_each,
    leftovers,
    pull,
    unreachable_endpoint,
)


def test_pull_downloads_verifies_and_tells_each_step_in_order(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    recorder, prepared = pull(hub, cache, f"hf://{REPO}/{FILE}")

    ids = recorder.ids
    progress = ids.count(_E.MODEL_DOWNLOAD_PROGRESS)
    assert ids == [
        _E.MODEL_QUEUED,
        _E.MODEL_RESOLUTION_STARTED,
        _E.MODEL_RESOLUTION_COMPLETED,
        _E.MODEL_DOWNLOAD_STARTED,
        *[_E.MODEL_DOWNLOAD_PROGRESS] * progress,
        _E.MODEL_DOWNLOAD_COMPLETED,
        _E.MODEL_PREPARATION_STARTED,
        _E.MODEL_PREPARATION_COMPLETED,
    ]
    size = len(files[FILE])
    chunks = -(-size // CHUNK_BYTES)
    assert 1 <= progress < chunks  # coalesced, never one per chunk
    values = [e.progress for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS)]
    assert all(p is not None and p.unit is ProgressUnit.BYTES and p.total == size for p in values)
    currents = [p.current for p in values if p is not None]
    assert currents == sorted(set(currents))
    assert currents[-1] == size
    # One root operation, two children pointing at it; every operation ends exactly once.
    root = recorder.events[0].operation_id
    assert str(root).startswith("pull-")
    for event in recorder.events:
        if event.id.value.startswith("model_resolution"):
            assert event.parent_operation_id == root
            assert event.operation_id == f"{root}.resolve"
        elif event.id.value.startswith("model_download"):
            assert event.parent_operation_id == root
            assert event.operation_id == f"{root}.download"
        else:
            assert event.operation_id == root
    assert_one_terminal_each(recorder)
    assert recorder.events[-1].outcome is Outcome.SUCCESS
    assert {str(e.scope.model_id) for e in recorder.events} == {"tiny-Q4_K_M"}
    # The file is the served one, verified by its sha256, under the hub cache's snapshot.
    assert prepared.path.read_bytes() == files[FILE]
    assert prepared.verified == ("sha256",)
    assert not prepared.reused
    assert prepared.downloaded_bytes == size
    assert Path(os.path.realpath(prepared.path)).name == hashlib.sha256(files[FILE]).hexdigest()
    assert not [n for n in leftovers(cache) if n.endswith(".incomplete")]


def test_second_pull_reuses_the_cache_without_downloading(hub: FakeHub, cache: Path) -> None:
    _, first = pull(hub, cache, f"hf://{REPO}/{FILE}")
    before = len(hub.requests)
    recorder, second = pull(hub, cache, f"hf://{REPO}/{FILE}")

    assert recorder.ids == [
        _E.MODEL_QUEUED,
        _E.MODEL_RESOLUTION_STARTED,
        _E.MODEL_RESOLUTION_COMPLETED,
        _E.MODEL_PREPARATION_STARTED,
        _E.MODEL_PREPARATION_CACHE_REUSED,
    ]
    assert second.reused
    assert second.path == first.path
    assert hub.body_gets(FILE) == [None]  # one body download, from the first pull
    # The second pull asked the hub only which commit and file are current (one HEAD).
    assert [(m, p) for m, p, _, _ in hub.requests[before:]] == [
        ("HEAD", f"/{REPO}/resolve/main/{FILE}")
    ]


def test_a_branch_that_moved_on_is_downloaded_again_not_served_stale(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    _, first = pull(hub, cache, f"hf://{REPO}/{FILE}")
    # The same name and size at a new commit, other bytes (so no size check could tell).
    newer = files[FILE][:-1] + bytes([files[FILE][-1] ^ 1])
    hub.repos[REPO] = FakeRepo({**files, FILE: newer}, commit="f" * 40)

    recorder, second = pull(hub, cache, f"hf://{REPO}/{FILE}")

    assert _E.MODEL_DOWNLOAD_STARTED in recorder.ids
    assert not second.reused
    assert second.path.read_bytes() == newer
    assert second.path.parent.name == "f" * 40
    assert first.path.read_bytes() == files[FILE]  # the older commit's snapshot is untouched


def test_cached_file_is_reused_when_the_hub_cannot_be_reached(hub: FakeHub, cache: Path) -> None:
    pull(hub, cache, f"hf://{REPO}/{FILE}")
    with unreachable_endpoint() as dead:
        recorder = Recorder()
        prepared = Acquisition(recorder, HubSettings(endpoint=dead, cache_dir=str(cache))).prepare(
            f"hf://{REPO}/{FILE}"
        )
    assert prepared.reused
    assert recorder.ids[-1] is _E.MODEL_PREPARATION_CACHE_REUSED


def test_quant_reference_resolves_from_the_cache_when_the_hub_cannot_be_reached(
    hub: FakeHub, cache: Path
) -> None:
    _, first = pull(hub, cache, f"{REPO}:Q4_K_M")
    with unreachable_endpoint() as dead:
        recorder = Recorder()
        settings = HubSettings(endpoint=dead, cache_dir=str(cache))
        prepared = Acquisition(recorder, settings).prepare(f"{REPO}:q4_k_m")
        with pytest.raises(PreparationError) as never_pulled:
            Acquisition(Recorder(), settings).prepare(f"{REPO}:Q8_0")
    assert prepared.path == first.path
    assert recorder.ids[-1] is _E.MODEL_PREPARATION_CACHE_REUSED
    assert never_pulled.value.reason is ReasonCode.MISSING_ARTIFACT  # only Q4_K_M is cached


def test_a_split_set_comes_whole(hub: FakeHub, cache: Path, files: dict[str, bytes]) -> None:
    recorder, prepared = pull(hub, cache, f"{REPO}:Q2_K")
    parts = sorted(p.name for p in prepared.path.parent.iterdir())
    assert parts == [f"tiny-split-Q2_K-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    assert prepared.verified == ("sha256",) * 3
    total = sum(len(v) for k, v in files.items() if k.startswith("split/"))
    resolved = recorder.of(_E.MODEL_RESOLUTION_COMPLETED)[0]
    assert resolved.summary_value(resolved.summaries[0].key) == total
    assert [s.value for s in resolved.summaries] == [total, 3]
    last = [e for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS) if e.progress][-1]
    assert last.progress is not None
    assert (last.progress.current, last.progress.total) == (total, total)


def test_local_path_is_checked_without_the_hub(fixture_dir: Path, cache: Path) -> None:
    recorder = Recorder()
    acq = Acquisition(recorder, HubSettings(endpoint="http://127.0.0.1:9", cache_dir=str(cache)))
    prepared = acq.prepare(str(fixture_dir / "tiny.gguf"))
    assert prepared.path == fixture_dir / "tiny.gguf"
    assert recorder.ids[-2:] == [_E.MODEL_PREPARATION_STARTED, _E.MODEL_PREPARATION_COMPLETED]
    with pytest.raises(PreparationError) as bad:
        acq.prepare(str(fixture_dir / "bad-magic.gguf"))
    assert bad.value.reason is ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE
    with pytest.raises(PreparationError) as missing:
        acq.prepare(str(fixture_dir / "missing-part-00001-of-00003.gguf"))
    assert missing.value.reason is ReasonCode.MISSING_ARTIFACT
