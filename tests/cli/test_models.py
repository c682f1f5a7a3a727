"""`skippyctl models list | rm | prune` on a real hub cache filled by `pull` from the loopback
hub stand-in, with a real runtime for what is loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.acquisition.fake_hub import FakeHub, FakeRepo, serve
from tests.cli.helpers import run_cli

REPO = "acme/tiny-GGUF"
FILES = ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "other-F16.gguf")


@pytest.fixture
def hub(fixture_dir: Path) -> Iterator[FakeHub]:
    bodies = [
        (fixture_dir / name).read_bytes()
        for name in ("tiny.gguf", "tiny-successor.gguf", "tiny-embedding.gguf")
    ]
    with serve(FakeHub({REPO: FakeRepo(dict(zip(FILES, bodies, strict=True)))})) as running:
        yield running


@pytest.fixture
def hub_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    env = {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for name in FILES:
        pulled = run_cli("pull", f"hf://{REPO}/{name}", "--embedded", env=env, timeout=60)
        assert pulled.code == 0, pulled.stderr
    return env


def _listed(env: dict[str, str], *args: str) -> dict[str, dict[str, object]]:
    result = run_cli("models", "list", "--json", *args, env=env)
    assert result.code == 0, result.stderr
    return {str(r["ref"]): r for r in result.records()}


def test_list_rm_and_prune_the_cache(hub_env: dict[str, str], tmp_path: Path) -> None:
    listed = _listed(hub_env)
    assert set(listed) == {f"hf://{REPO}/{name}" for name in FILES}
    first = listed[f"hf://{REPO}/tiny-Q4_K_M.gguf"]
    assert first["model_id"] == "tiny-Q4_K_M" and first["loaded"] is False
    assert isinstance(first["size_bytes"], int) and first["size_bytes"] > 0
    assert str(tmp_path) not in str(listed)  # no path is printed
    # rm of one file; then it is gone and its blob with it.
    removed = run_cli("models", "rm", f"hf://{REPO}/tiny-Q8_0.gguf", "--json", env=hub_env)
    assert removed.code == 0, removed.stderr
    assert [r["record"] for r in removed.records()] == ["cached_model_removed"]
    assert f"hf://{REPO}/tiny-Q8_0.gguf" not in _listed(hub_env)
    missing = run_cli("models", "rm", f"hf://{REPO}/tiny-Q8_0.gguf", "--json", env=hub_env)
    assert missing.code == 12
    # prune keeps what a preset names; --dry-run removes nothing.
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[models.kept]\nmodel = "hf://{REPO}/tiny-Q4_K_M.gguf"\n')
    dry = run_cli("models", "prune", "--presets", str(presets), "--dry-run", "--json", env=hub_env)
    assert dry.code == 0, dry.stderr
    assert [r["ref"] for r in dry.records()] == [f"hf://{REPO}/other-F16.gguf"]
    assert len(_listed(hub_env)) == 2
    pruned = run_cli("models", "prune", "--presets", str(presets), "--json", env=hub_env)
    assert [r["record"] for r in pruned.records()] == ["cached_model_pruned"]
    kept = _listed(hub_env, "--presets", str(presets))
    assert list(kept) == [f"hf://{REPO}/tiny-Q4_K_M.gguf"]
    assert kept[f"hf://{REPO}/tiny-Q4_K_M.gguf"]["presets"] == ["kept"]
    bad = run_cli("models", "prune", "--older-than", "soon", env=hub_env)
    assert bad.code == 10


def test_a_loaded_model_is_shown_and_kept(
    hub_env: dict[str, str], tmp_path: Path, isolated_runtime: Path
) -> None:
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[models.hubbed]\nmodel = "hf://{REPO}/tiny-Q4_K_M.gguf"\n')
    started = run_cli("runtime", "start", "--presets", str(presets), "--json", env=hub_env)
    assert started.code == 0, started.stderr
    url = orjson.loads(started.stdout)["url"]
    token = orjson.loads((isolated_runtime / "runtime.json").read_bytes())["token"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": "hubbed", "prompt": "hi", "max_tokens": 2},
            timeout=60,
        )
    assert answer.status_code == 200, answer.text
    listed = _listed(hub_env, "--presets", str(presets))
    assert listed[f"hf://{REPO}/tiny-Q4_K_M.gguf"]["loaded"] is True
    refused = run_cli(
        "models", "rm", f"hf://{REPO}/tiny-Q4_K_M.gguf", "--presets", str(presets), env=hub_env
    )
    assert refused.code == 10, refused.stderr
    assert "loaded" in refused.stderr
    pruned = run_cli("models", "prune", "--presets", str(presets), "--json", env=hub_env)
    assert f"hf://{REPO}/tiny-Q4_K_M.gguf" not in [r["ref"] for r in pruned.records()]


def _interrupted_pull(hub: FakeHub, env: dict[str, str], name: str) -> Path:
    """A pull of `name` stopped by Ctrl-C mid-file: its partial download stays in the cache."""
    hub.stall_after[name] = 64 * 1024
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippyctl", "pull", f"hf://{REPO}/{name}", "--embedded"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, **env),
    )
    try:
        assert hub.stalled.wait(30)
        cache = Path(env["HF_HUB_CACHE"])
        deadline = time.monotonic() + 30
        while not [p for p in cache.rglob("*.incomplete") if p.stat().st_size >= 56 * 1024]:
            assert time.monotonic() < deadline, "the pull never wrote what the hub sent"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    hub.stall_after.pop(name)
    hub.stalled.clear()
    (partial,) = Path(env["HF_HUB_CACHE"]).rglob("*.incomplete")
    return partial


def test_partial_downloads_are_listed_pruned_and_removed(
    hub: FakeHub, hub_env: dict[str, str], tmp_path: Path
) -> None:
    from filelock import FileLock

    run_cli("models", "rm", f"hf://{REPO}/other-F16.gguf", env=hub_env)
    partial = _interrupted_pull(hub, hub_env, "other-F16.gguf")

    listed = run_cli("models", "list", "--json", env=hub_env)
    records = [r for r in listed.records() if r["record"] == "partial_download"]
    assert [(r["repo"], r["size_bytes"]) for r in records] == [(REPO, partial.stat().st_size)]
    assert str(tmp_path) not in listed.stdout  # no path is printed
    human = run_cli("models", "list", env=hub_env)
    assert f"hf://{REPO}  " in human.stderr and "partial download" in human.stderr
    assert "2 file(s) and 1 partial download(s)" in human.stderr

    # Not one a pull is writing now: that pull holds the blob's lock (the hub library's).
    etag = partial.name.split(".", 1)[0]
    lock_path = Path(hub_env["HF_HUB_CACHE"]) / ".locks" / partial.parent.parent.name
    with FileLock(str(lock_path / f"{etag}.lock")):
        busy = run_cli("models", "prune", "--json", env=hub_env)
        assert busy.code == 0, busy.stderr
        assert "partial_download_pruned" not in [r["record"] for r in busy.records()]
        assert partial.exists()
    young = run_cli("models", "prune", "--older-than", "1d", "--json", env=hub_env)
    assert [r["record"] for r in young.records()] == []  # written just now: kept
    assert partial.exists()
    removed = run_cli("models", "rm", REPO, "--json", env=hub_env)
    assert removed.code == 0, removed.stderr
    assert "partial_download_removed" in [r["record"] for r in removed.records()]
    assert not partial.exists()
