"""Fixtures of the acquisition tests: the hub client's settings for tests, the files of the
loopback hub's one repo (real fixture models), the running hub (tests/acquisition/fake_hub.py)
and an empty hub cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acquisition.fake_hub import FakeHub, FakeRepo, serve
from tests.acquisition.helpers import CHUNK_BYTES, FILE, REPO


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
