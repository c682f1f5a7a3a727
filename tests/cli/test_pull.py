"""`skippyctl pull` as a user runs it: a subprocess against the loopback hub stand-in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.acquisition.fake_hub import FakeHub, FakeRepo, serve
from tests.cli.helpers import CliResult, ndjson_objects, run_cli

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
RECORD_KEYS = {"schema_version", "event", "category", "severity", "ts", "producer", "summary"}


@pytest.fixture
def hub(fixture_dir: Path) -> Iterator[FakeHub]:
    files = {FILE: (fixture_dir / "tiny.gguf").read_bytes(), "README.md": b"# tiny\n"}
    for n in (1, 2, 3):
        part = (fixture_dir / f"tiny-split-0000{n}-of-00003.gguf").read_bytes()
        files[f"tiny-split-Q2_K-0000{n}-of-00003.gguf"] = part
    with serve(FakeHub({REPO: FakeRepo(files)})) as running:
        yield running


@pytest.fixture
def hub_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_TOKEN": "hf_CANARYcanaryCANARYcanary0123456789",
    }


def pull(env: dict[str, str], *args: str) -> CliResult:
    """A pull in the CLI's own process (`--embedded`): no runtime is started."""
    return run_cli("pull", *args, "--embedded", env=env, timeout=60)


def test_pull_without_a_runtime_starts_one_and_pulls_in_it(hub_env: dict[str, str]) -> None:
    result = run_cli("pull", f"hf://{REPO}/{FILE}", "--json", env=hub_env, timeout=120)

    assert result.code == 0, result.stderr
    records = result.records()
    assert records and all("seq" in r for r in records)  # the runtime's stream numbers them
    assert records[-1]["event"] == "model_preparation_completed"
    assert "ready in the runtime's cache" in result.stderr
    ps = run_cli("ps", "--json", env=hub_env)
    assert ps.code == 0, ps.stderr  # the runtime the pull started still runs


def test_pull_json_prints_one_record_per_event_and_exits_0(hub_env: dict[str, str]) -> None:
    result = pull(hub_env, f"hf://{REPO}/{FILE}", "--json")

    assert result.code == 0, result.stderr
    records = result.records()  # every stdout line is one JSON object
    events = [r["event"] for r in records]
    assert events[:4] == [
        "model_queued",
        "model_resolution_started",
        "model_resolution_completed",
        "model_download_started",
    ]
    assert events[-3:] == [
        "model_download_completed",
        "model_preparation_started",
        "model_preparation_completed",
    ]
    assert all(r.keys() >= RECORD_KEYS for r in records)
    assert all(r["category"] == "model_preparation" for r in records)
    assert all("seq" not in r for r in records)  # not from a runtime's stream
    last_progress = [r for r in records if r["event"] == "model_download_progress"][-1]
    assert last_progress["progress"] == {"current": 435744, "total": 435744, "unit": "bytes"}
    assert records[-1]["outcome"] == "success"
    assert hub_env["HF_TOKEN"] not in result.stdout + result.stderr
    assert hub_env["HF_HUB_CACHE"] not in result.stdout
    assert "✓ tiny-Q4_K_M: downloaded and verified" in result.stderr

    again = pull(hub_env, f"{REPO}:q4_k_m", "--json")
    assert again.code == 0, again.stderr
    assert again.events()[-2:] == ["model_preparation_started", "model_preparation_cache_reused"]
    assert "model_download_started" not in again.events()


def test_pull_of_a_missing_file_exits_missing_artifact(hub_env: dict[str, str]) -> None:
    result = pull(hub_env, f"hf://{REPO}/absent.gguf", "--json")

    assert result.code == 12
    assert result.events()[-2:] == ["model_resolution_failed", "model_preparation_failed"]
    assert result.records()[-1]["reason_code"] == "missing_artifact"
    assert "file not found" in result.stderr


def test_pull_human_mode_keeps_stdout_empty(hub_env: dict[str, str]) -> None:
    result = pull(hub_env, f"hf://{REPO}/{FILE}")
    assert result.code == 0, result.stderr
    assert result.stdout == ""
    assert "✓ tiny-Q4_K_M" in result.stderr


def test_ctrl_c_cancels_the_download_with_exit_130(hub: FakeHub, hub_env: dict[str, str]) -> None:
    hub.stall_after[FILE] = 64 * 1024  # the body stops there until the server is stopped
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippyctl", "pull", f"hf://{REPO}/{FILE}", "--json", "--embedded"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, **hub_env),
    )
    try:
        assert proc.stdout is not None
        started = []
        for line in proc.stdout:
            started.append(orjson.loads(line)["event"])
            if started[-1] == "model_download_started":
                break
        assert hub.stalled.wait(30)
        # Interrupt once the CLI wrote what the hub sent (up to its 8 KiB write buffer).
        cache = Path(hub_env["HF_HUB_CACHE"])
        deadline = time.monotonic() + 30
        while sum(p.stat().st_size for p in cache.rglob("*.incomplete")) < 56 * 1024:
            assert time.monotonic() < deadline, "the CLI never wrote what the hub sent"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        rest, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = started + [r["event"] for r in ndjson_objects(rest)]
    assert proc.returncode == 130, stderr
    assert events[-2:] == ["model_download_cancelled", "model_preparation_cancelled"]
    assert ndjson_objects(rest)[-1]["reason_code"] == "cancellation"
    partials = [p for p in cache.rglob("blobs/*")]
    assert [p.suffix for p in partials] == [".incomplete"]  # no blob: only the bytes so far
    kept = partials[0].stat().st_size
    assert kept >= 56 * 1024

    hub.stall_after.clear()
    hub.release.set()
    resumed = pull(hub_env, f"hf://{REPO}/{FILE}", "--json")
    assert resumed.code == 0, resumed.stderr
    assert hub.body_gets(FILE)[-1] == f"bytes={kept}-"  # asked only for the rest
    assert resumed.records()[-1]["event"] == "model_preparation_completed"


def test_load_of_a_hub_reference_pulls_first_then_loads_the_file(
    hub_env: dict[str, str],
) -> None:
    result = run_cli("load", f"{REPO}:Q4_K_M", "--embedded", "--json", env=hub_env, timeout=120)

    assert result.code == 0, result.stderr
    records = result.records()
    events = [r["event"] for r in records]
    pulled = events.index("model_preparation_completed")
    assert events[0] == "model_queued"
    assert events.index("model_load_requested") > pulled
    assert events[-1] == "model_available"
    # Loaded under the file's name, not the hash its cache blob is named by.
    assert {r.get("model_id") for r in records if r["event"] == "model_available"} == {
        "tiny-Q4_K_M"
    }
    assert hub_env["HF_HUB_CACHE"] not in result.stdout


def test_load_of_a_hub_split_set_is_refused_clearly_after_the_pull(
    hub_env: dict[str, str],
) -> None:
    result = run_cli("load", f"{REPO}:Q2_K", "--embedded", "--json", env=hub_env, timeout=60)

    assert result.code == 11  # unsupported_capability: the host resolves cache links to blobs
    assert result.events()[-1] == "model_preparation_completed"
    assert "model_load_requested" not in result.events()
    assert "split set from the Hugging Face cache is not supported yet" in result.stderr
