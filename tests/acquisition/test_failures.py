"""A pull that fails or is cancelled (checksum mismatch, a full disk, a cancel mid-download,
Ctrl-C during resolution) ends every operation once and leaves nothing half-written in the
cache."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
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
        assert leftovers(cache) == ["CACHEDIR.TAG", "main"]
        assert_one_terminal_each(recorder)


def test_a_full_disk_without_a_tmpfs_is_mocked_as_enospc_mid_write(
    hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock of the fault above for machines that cannot mount a tmpfs: the hub's body
    writer writes part of the file, then the disk is "full" (ENOSPC from the write)."""
    import errno

    from huggingface_hub import file_download

    real_http_get = file_download.http_get

    def http_get(url: str, temp_file: Any, **kwargs: Any) -> None:
        class Full:
            def __init__(self) -> None:
                self.written = 0

            def write(self, data: bytes) -> int:
                if self.written + len(data) > 100_000:
                    raise OSError(errno.ENOSPC, "No space left on device")
                self.written += len(data)
                return int(temp_file.write(data))

            def __getattr__(self, name: str) -> Any:
                return getattr(temp_file, name)

        real_http_get(url, cast(BinaryIO, Full()), **kwargs)

    monkeypatch.setattr(file_download, "http_get", http_get)
    recorder, error = failed(hub, cache, f"hf://{REPO}/{FILE}")

    assert error.reason is ReasonCode.ARTIFACT_IO_FAILURE
    assert "no space" in error.message
    assert recorder.ids[-2:] == [_E.MODEL_DOWNLOAD_FAILED, _E.MODEL_PREPARATION_FAILED]
    assert leftovers(cache) == ["CACHEDIR.TAG", "main"]  # the partial file was removed


def test_cancel_mid_download_ends_cancelled_and_leaves_nothing(hub: FakeHub, cache: Path) -> None:
    hub.stall_after[FILE] = 64 * 1024
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
    acq.cancel()
    hub.release.set()  # the next chunk meets the cancellation
    worker.join(30)

    assert not worker.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], PreparationCancelled)
    assert recorder.ids[-2:] == [_E.MODEL_DOWNLOAD_CANCELLED, _E.MODEL_PREPARATION_CANCELLED]
    assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.CANCELLATION}
    assert_one_terminal_each(recorder)
    assert leftovers(cache) == ["CACHEDIR.TAG", "main"]  # no blob, no *.incomplete


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
