"""Model acquisition against a loopback Hugging Face Hub stand-in (tests/acquisition/fake_hub.py):
the real huggingface_hub client, its real cache in a tmp dir, no network."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from skippyctl.acquisition.acquire import Acquisition, Prepared
from skippyctl.acquisition.errors import PreparationCancelled, PreparationError
from skippyctl.acquisition.hub import HubSettings
from skippyctl.acquisition.references import RefError, RefKind, parse_ref
from skippyctl.acquisition.transfer import MeterFactory, ProgressThrottle, Transfer
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from skippyctl.output.codec import dumps_line, event_record
from tests.acquisition.fake_hub import FakeHub, FakeRepo, serve

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
CHUNK_BYTES = 4096
_E = EventId


@pytest.fixture(autouse=True)
def _hub_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks (many progress callbacks from a small file) and online mode, whatever the
    environment says; the hub library read its environment at import."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK_BYTES)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture
def files(fixture_dir: Path) -> dict[str, bytes]:
    repo = {
        FILE: (fixture_dir / "tiny.gguf").read_bytes(),
        "tiny-Q8_0.gguf": (fixture_dir / "duplicate-token.gguf").read_bytes(),
        "mmproj-tiny-Q8_0.gguf": b"GGUF" + bytes(64),
        "README.md": b"# tiny\n",
    }
    for n in (1, 2, 3):
        part = (fixture_dir / f"tiny-split-0000{n}-of-00003.gguf").read_bytes()
        repo[f"split/tiny-split-Q2_K-0000{n}-of-00003.gguf"] = part
    return repo


@pytest.fixture
def hub(files: dict[str, bytes]) -> Iterator[FakeHub]:
    with serve(FakeHub({REPO: FakeRepo(files)})) as running:
        yield running


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "hub-cache"
    path.mkdir()
    return path


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


# -- references -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "kind", "repo", "filename", "quant"),
    [
        ("hf://acme/tiny-GGUF/tiny-Q4_K_M.gguf", RefKind.HF_FILE, REPO, FILE, None),
        ("hf://acme/r/sub/dir/x.GGUF", RefKind.HF_FILE, "acme/r", "sub/dir/x.GGUF", None),
        ("acme/tiny-GGUF:Q4_K_M", RefKind.HF_QUANT, REPO, None, "Q4_K_M"),
        ("fixtures-that-do-not-exist/x.gguf", RefKind.LOCAL, None, None, None),
        ("/abs/model.gguf", RefKind.LOCAL, None, None, None),
    ],
)
def test_reference_forms_parse(
    text: str, kind: RefKind, repo: str | None, filename: str | None, quant: str | None
) -> None:
    ref = parse_ref(text)
    assert (ref.kind, ref.repo_id, ref.filename, ref.quant) == (kind, repo, filename, quant)


@pytest.mark.parametrize(
    "text", ["hf://acme", "hf://acme/r/notes.txt", "hf://acme/r/../x.gguf", "a\x00b"]
)
def test_malformed_references_are_refused(text: str) -> None:
    with pytest.raises(RefError):
        parse_ref(text)


def test_an_existing_local_path_wins_over_the_quant_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "x:Q4").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert parse_ref("acme/x:Q4").kind is RefKind.LOCAL


# -- a pull -----------------------------------------------------------------------------------
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
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
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
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
        recorder = Recorder()
        settings = HubSettings(endpoint=dead, cache_dir=str(cache))
        prepared = Acquisition(recorder, settings).prepare(f"{REPO}:q4_k_m")
        with pytest.raises(PreparationError) as never_pulled:
            Acquisition(Recorder(), settings).prepare(f"{REPO}:Q8_0")
    assert prepared.path == first.path
    assert recorder.ids[-1] is _E.MODEL_PREPARATION_CACHE_REUSED
    assert never_pulled.value.reason is ReasonCode.MISSING_ARTIFACT  # only Q4_K_M is cached


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


# -- failures ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref", [f"hf://{REPO}/absent.gguf", "hf://acme/absent-repo/x.gguf", f"{REPO}:Q3_K_S"]
)
def test_a_missing_file_or_repo_fails_resolution_as_missing_artifact(
    hub: FakeHub, cache: Path, ref: str
) -> None:
    recorder, error = failed(hub, cache, ref)

    assert error.reason is ReasonCode.MISSING_ARTIFACT
    assert recorder.ids == [
        _E.MODEL_QUEUED,
        _E.MODEL_RESOLUTION_STARTED,
        _E.MODEL_RESOLUTION_FAILED,
        _E.MODEL_PREPARATION_FAILED,
    ]
    assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.MISSING_ARTIFACT}
    assert_one_terminal_each(recorder)
    assert leftovers(cache) == []


def test_quant_reference_picks_the_one_matching_file(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    recorder, prepared = pull(hub, cache, f"{REPO}:q8_0")  # case-insensitive; not the mmproj
    assert prepared.path.name == "tiny-Q8_0.gguf"
    assert prepared.path.read_bytes() == files["tiny-Q8_0.gguf"]
    assert recorder.events[0].scope.model_id is None  # not known before the listing
    assert str(recorder.events[-1].scope.model_id) == "tiny-Q8_0"


def test_quant_reference_matching_several_files_lists_them(hub: FakeHub, cache: Path) -> None:
    recorder, error = failed(hub, cache, f"{REPO}:Q")
    assert error.reason is ReasonCode.INVALID_CONFIGURATION
    assert "tiny-Q4_K_M.gguf" in error.message
    assert "tiny-Q8_0.gguf" in error.message
    assert "split/tiny-split-Q2_K-00001-of-00003.gguf" in error.message
    assert "mmproj" not in error.message
    assert recorder.ids[-2:] == [_E.MODEL_RESOLUTION_FAILED, _E.MODEL_PREPARATION_FAILED]


def test_quant_reference_with_no_match_lists_the_repo_files(hub: FakeHub, cache: Path) -> None:
    _, error = failed(hub, cache, f"{REPO}:IQ1_S")
    assert error.reason is ReasonCode.MISSING_ARTIFACT
    assert "tiny-Q4_K_M.gguf" in error.message


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


def test_no_token_path_or_url_in_any_record(hub: FakeHub, cache: Path) -> None:
    token = "hf_CANARYcanaryCANARYcanary0123456789"
    recorder, _ = pull(hub, cache, f"hf://{REPO}/{FILE}", token=token)
    _, error = failed(hub, cache, "hf://acme/absent-repo/x.gguf")

    wire = b"".join(dumps_line(event_record(e)) for e in recorder.events)
    for secret in (token, str(cache), "127.0.0.1", "localhost", "/cdn/", REPO):
        assert secret.encode() not in wire
        assert secret not in error.message
    # The token went to the hub's resolve endpoint, never to the CDN host it redirected to.
    assert any(auth for m, p, _, auth in hub.requests if "/resolve/" in p)
    assert not any(auth for m, p, _, auth in hub.requests if p.startswith("/cdn/"))


def test_acquisition_is_core_and_imports_the_hub_library_only_when_used() -> None:
    code = (
        "import sys, skippyctl.acquisition.acquire, skippyctl.cli.app;"
        "print(sorted(m for m in ('textual', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = (
        "import sys, skippyctl.acquisition.acquire;"
        "print(sorted(m for m in ('rich', 'typer', 'textual', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_xet_download_counts_the_file_bytes_once() -> None:
    """Real hub repos download through Xet (no loopback stand-in for it): its reporter is fed
    reports as hf_xet sends them, with our meter as its bar class — the file's bytes are
    counted once (not once per bar), network bytes are not, and no display call fails."""
    import logging
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    from skippyctl.events.envelope import LogicalId

    ticks = itertools.count()
    recorder = Recorder()
    acq = Acquisition(recorder, clock=lambda: next(ticks) * 1.0)
    transfer = Transfer(
        acq, LogicalId("pull-1.download"), LogicalId("pull-1"), LogicalId("m"), 1000
    )
    with XetDownloadProgressReporter(
        reconstruction_desc="m.gguf: reconstructing file",
        total=1000,
        log_level=logging.WARNING,
        tqdm_class=cast(type, MeterFactory(transfer)),  # any callable, as in acquire.py
    ) as progress:
        for done, sent in ((100, 80), (400, 300), (1000, 700)):
            report = SimpleNamespace(
                total_bytes_completed=done,
                total_transfer_bytes_completed=sent,
                total_bytes_completion_rate=1e6,
                total_transfer_bytes_completion_rate=1e6,
                total_bytes=1000,
            )
            progress.update_progress(report, {})
    transfer.finish()

    assert transfer.current == 1000
    currents = [e.progress.current for e in recorder.of(_E.MODEL_DOWNLOAD_PROGRESS) if e.progress]
    assert currents == [100, 400, 1000]
    assert recorder.ids[0] is _E.MODEL_DOWNLOAD_STARTED


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
