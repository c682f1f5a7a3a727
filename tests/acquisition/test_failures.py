"""A pull that fails or is cancelled (checksum mismatch, a full disk, a cancel mid-download,
Ctrl-C during resolution) ends every operation once and leaves nothing half-written that could
be taken as valid: a full disk keeps no partial file, a cancelled download keeps its bytes in
``*.incomplete`` and the next pull resumes them."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from skippyctl.acquisition.errors import PreparationCancelled, PreparationError
from skippyctl.events.catalog import EventId as _E
from skippyctl.events.reasons import Outcome, ReasonCode
from tests.acquisition.fake_hub import FakeHub
from tests.acquisition.helpers import (
    FILE,
    REPO,
    Recorder,
    acquisition,
    assert_one_terminal_each,
    failed,
    leftovers,
    pull,
)


def test_checksum_mismatch_fails_preparation_and_leaves_nothing_valid(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    hub.corrupt.add(FILE)

    recorder, error = failed(hub, cache, f"hf://{REPO}/{FILE}")

    assert error.reason is ReasonCode.ARTIFACT_IO_FAILURE
    assert "sha256" in error.message
    assert recorder.ids[-3:] == [
        _E.MODEL_DOWNLOAD_COMPLETED,
        _E.MODEL_PREPARATION_STARTED,
        _E.MODEL_PREPARATION_FAILED,
    ]
    assert recorder.events[-1].reason_code is ReasonCode.ARTIFACT_IO_FAILURE
    assert leftovers(cache) == ["CACHEDIR.TAG", "main"]  # no blob, no snapshot link
    # Nothing was taken as valid: the next pull downloads again (and now verifies).
    hub.corrupt.clear()
    again, prepared = pull(hub, cache, f"hf://{REPO}/{FILE}")
    assert _E.MODEL_DOWNLOAD_STARTED in again.ids
    assert prepared.path.read_bytes() == files[FILE]


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("needs a tmpfs mount (root with CAP_SYS_ADMIN) for a real full disk")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.filterwarnings("ignore:Not enough free disk space:UserWarning")
def test_a_full_disk_fails_the_download_and_leaves_nothing_half_written(
    hub: FakeHub, tmp_path: Path, files: dict[str, bytes]
) -> None:
    # A real ENOSPC: a 256 KiB tmpfs as the hub cache, for a 425 KiB file.
    with tiny_tmpfs(tmp_path / "full", "256k") as cache:
        assert shutil.disk_usage(cache).total < len(files[FILE])
        recorder, error = failed(hub, cache, f"hf://{REPO}/{FILE}")

        assert error.reason is ReasonCode.ARTIFACT_IO_FAILURE
        assert "no space" in error.message
        assert recorder.ids[-2:] == [_E.MODEL_DOWNLOAD_FAILED, _E.MODEL_PREPARATION_FAILED]
        assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.ARTIFACT_IO_FAILURE}
        assert leftovers(cache) == []  # the partial file was removed: the disk is free again
        assert_one_terminal_each(recorder)


def test_a_full_disk_without_a_tmpfs_is_mocked_as_enospc_mid_write(
    hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock of the fault above for machines that cannot mount a tmpfs: the partial file
    takes part of the body, then the disk is "full" (ENOSPC from the write)."""
    import errno

    from skippyctl.acquisition import resumable

    real_open = resumable.open_partial

    class Full:
        def __init__(self, sink: BinaryIO) -> None:
            self.sink = sink
            self.written = 0

        def write(self, data: bytes) -> int:
            if self.written + len(data) > 100_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.sink.write(data)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.sink.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sink, name)

    monkeypatch.setattr(
        resumable, "open_partial", lambda path: cast(BinaryIO, Full(real_open(path)))
    )
    recorder, error = failed(hub, cache, f"hf://{REPO}/{FILE}")

    assert error.reason is ReasonCode.ARTIFACT_IO_FAILURE
    assert "no space" in error.message
    assert recorder.ids[-2:] == [_E.MODEL_DOWNLOAD_FAILED, _E.MODEL_PREPARATION_FAILED]
    assert leftovers(cache) == []  # the partial file was removed: the disk is free again


def _partial_size(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*.incomplete"))


def _cancelled_mid_file(hub: FakeHub, cache: Path, stall_at: int) -> Recorder:
    """A pull of FILE cancelled while the hub holds its body after `stall_at` bytes."""
    hub.stall_after[FILE] = stall_at
    recorder = Recorder()
    acq = acquisition(hub, cache, recorder)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            acq.prepare(f"hf://{REPO}/{FILE}")
        except PreparationError as error:
            outcome.append(error)

    worker = threading.Thread(target=run, name="test-pull")
    worker.start()
    assert hub.stalled.wait(30)
    # The hub has sent `stall_at` bytes; cancel once the client wrote them (to its 8 KiB
    # write buffer's flush), so the partial file's length does not depend on a race.
    deadline = time.monotonic() + 30
    while _partial_size(cache) < stall_at - 8192:
        assert time.monotonic() < deadline, "the client never wrote what the hub sent"
        time.sleep(0.01)
    acq.cancel()
    hub.release.set()  # the next chunk meets the cancellation
    worker.join(30)
    assert not worker.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], PreparationCancelled)
    hub.stall_after.clear()
    hub.stalled.clear()
    hub.release.clear()
    return recorder


def test_cancel_mid_download_ends_cancelled_and_keeps_only_a_partial_file(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    recorder = _cancelled_mid_file(hub, cache, 64 * 1024)

    assert recorder.ids[-2:] == [_E.MODEL_DOWNLOAD_CANCELLED, _E.MODEL_PREPARATION_CANCELLED]
    assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.CANCELLATION}
    assert_one_terminal_each(recorder)
    sha = hashlib.sha256(files[FILE]).hexdigest()
    assert leftovers(cache) == [f"{sha}.incomplete"]  # no blob, no snapshot link
    partial = next(cache.rglob(f"{sha}.incomplete"))
    assert 56 * 1024 <= partial.stat().st_size < len(files[FILE])
    assert partial.read_bytes() == files[FILE][: partial.stat().st_size]


def test_a_cancelled_pull_resumes_from_its_partial_file(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    _cancelled_mid_file(hub, cache, 200 * 1024)
    sha = hashlib.sha256(files[FILE]).hexdigest()
    kept = next(cache.rglob(f"{sha}.incomplete")).stat().st_size
    assert 192 * 1024 <= kept < len(files[FILE])

    recorder, prepared = pull(hub, cache, f"hf://{REPO}/{FILE}")

    # The second pull asked the hub only for the bytes the first one did not keep.
    assert hub.body_gets(FILE)[-1] == f"bytes={kept}-"
    assert prepared.path.read_bytes() == files[FILE]
    assert prepared.verified == ("sha256",)  # the whole file, resumed part included, hashed
    assert prepared.downloaded_bytes == len(files[FILE])
    started = recorder.of(_E.MODEL_DOWNLOAD_STARTED)[0]
    assert started.progress is not None and started.progress.current == kept
    currents = [e.progress.current for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS) if e.progress]
    assert currents == sorted(currents) and currents[-1] == len(files[FILE])
    assert recorder.ids[-1] is _E.MODEL_PREPARATION_COMPLETED
    assert sorted(leftovers(cache)) == sorted(["CACHEDIR.TAG", "main", sha, FILE])


def test_a_partial_file_longer_than_the_file_is_not_resumed(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    """A partial that cannot be this file's (longer than it) is dropped, not trusted."""
    from huggingface_hub.file_download import repo_folder_name

    sha = hashlib.sha256(files[FILE]).hexdigest()
    blobs = cache / repo_folder_name(repo_id=REPO, repo_type="model") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").write_bytes(b"x" * (len(files[FILE]) + 10))

    _, prepared = pull(hub, cache, f"hf://{REPO}/{FILE}")

    assert hub.body_gets(FILE) == [None]  # from the start
    assert prepared.path.read_bytes() == files[FILE]


def test_ctrl_c_during_resolution_ends_both_operations(
    hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", interrupted)
    recorder = Recorder()
    with pytest.raises(PreparationCancelled):
        acquisition(hub, cache, recorder).prepare(f"hf://{REPO}/{FILE}")
    assert recorder.ids[-2:] == [_E.MODEL_RESOLUTION_FAILED, _E.MODEL_PREPARATION_CANCELLED]
    assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.CANCELLATION}
    assert recorder.events[-2].outcome is Outcome.CANCELLED
    assert_one_terminal_each(recorder)


@pytest.mark.parametrize(
    ("filename", "etag", "commit"),
    [
        ("../../../escape.gguf", "a" * 64, "b" * 40),
        ("/abs/escape.gguf", "a" * 64, "b" * 40),
        ("sub/..\\escape.gguf", "a" * 64, "b" * 40),
        ("ok.gguf", "../../escape", "b" * 40),
        ("ok.gguf", "a" * 64, "../escape"),
        ("ok.gguf", "", "b" * 40),
    ],
)
def test_a_hub_answer_that_would_lead_out_of_the_cache_is_refused(
    cache: Path, tmp_path: Path, filename: str, etag: str, commit: str
) -> None:
    """File names (from a hub's listing), ETags and commits (from its headers) become cache
    paths: one that is not a plain name under the cache is refused before anything is written."""
    from skippyctl.acquisition.hub import HubSettings, RemotePart
    from skippyctl.acquisition.resumable import fetch_into_cache
    from skippyctl.acquisition.transfer import MeterFactory, Transfer
    from skippyctl.events.envelope import LogicalId

    recorder = Recorder()
    acq = acquisition(FakeHub({}), cache, recorder)
    transfer = Transfer(acq, LogicalId("pull-1.download"), LogicalId("pull-1"), LogicalId("m"), 1)
    part = RemotePart(filename, 1, etag, commit)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(PreparationError) as refused:
        fetch_into_cache(
            HubSettings(cache_dir=str(cache)),
            REPO,
            part,
            MeterFactory(transfer),
            threading.Event(),
            force=False,
        )
    assert refused.value.reason is ReasonCode.ARTIFACT_IO_FAILURE
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
