"""Downloads inside the runtime, against a real runtime and the loopback hub stand-in: a pull
asked over HTTP tells its events to the runtime's stream, a second one reuses the cache, a
cancelled one ends cancelled and the next pull resumes its partial file, and an hf:// preset is
pulled by the request that wants it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.acquisition.fake_hub import FakeHub, FakeRepo, serve
from tests.api.conftest import Server, assert_openai_error, start_server, stop_server, wait_for

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
SLOW = "tiny-slow-Q8_0.gguf"
WATCHED = "tiny-watched-F32.gguf"
TERMINALS = {
    "model_preparation_completed",
    "model_preparation_cache_reused",
    "model_preparation_failed",
    "model_preparation_cancelled",
}


@pytest.fixture(scope="module")
def hub(fixture_dir: Path) -> Iterator[FakeHub]:
    tiny = (fixture_dir / "tiny.gguf").read_bytes()
    other = (fixture_dir / "tiny-successor.gguf").read_bytes()  # another blob: not in the cache
    watched = (fixture_dir / "tiny-embedding.gguf").read_bytes()
    files = {FILE: tiny, SLOW: other, WATCHED: watched}
    with serve(FakeHub({REPO: FakeRepo(files)})) as running:
        running.stall_after[SLOW] = 64 * 1024
        yield running
        running.release.set()


@pytest.fixture(scope="module")
def hub_env(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_CACHE": str(tmp_path_factory.mktemp("hub-cache")),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_TOKEN": "hf_CANARYcanaryCANARYcanary0123456789",
    }


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, hub_env: dict[str, str]) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("pulls")
    presets = directory / "presets.toml"
    presets.write_text(f'[models.hubbed]\nmodel = "hf://{REPO}/{FILE}"\nlanes = 1\n')
    running = start_server(directory / "runtime", "--presets", str(presets), env=hub_env)
    try:
        yield running
    finally:
        stop_server(running)


def _pull(server: Server, ref: str) -> str:
    with server.http() as http:
        answer = http.post("/api/runtime/models/pull", json={"ref": ref})
    assert answer.status_code == 202, answer.text
    operation: str = answer.json()["operation_id"]
    return operation


def _events_of(server: Server, operation: str) -> list[dict[str, Any]]:
    return [
        e
        for e in server.events()
        if e.get("operation", {}).get("root") == operation
        or e.get("operation", {}).get("child", "").startswith(f"{operation}.")
    ]


def _ended(server: Server, operation: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = _events_of(server, operation)
        if any(e["kind"] in TERMINALS for e in events if e["operation"]["root"] == operation):
            return events
        time.sleep(0.1)
    raise AssertionError(f"{operation} never ended")


def test_a_pull_tells_its_events_to_the_runtimes_stream(runtime: Server) -> None:
    operation = _pull(runtime, f"hf://{REPO}/{FILE}")
    kinds = [e["kind"] for e in _ended(runtime, operation)]
    assert kinds[0] == "model_queued"
    assert "model_download_started" in kinds and "model_download_completed" in kinds
    assert kinds[-1] == "model_preparation_completed" or "model_preparation_completed" in kinds
    text = str(_events_of(runtime, operation))
    assert "hf_CANARY" not in text and "hub-cache" not in text  # no token, no path
    again = _pull(runtime, f"hf://{REPO}/{FILE}")
    assert again != operation
    assert "model_preparation_cache_reused" in [e["kind"] for e in _ended(runtime, again)]


def _partial_bytes(hub_env: dict[str, str]) -> int:
    return sum(p.stat().st_size for p in Path(hub_env["HF_HUB_CACHE"]).rglob("*.incomplete"))


def test_a_pull_is_cancelled_over_http_and_the_next_one_resumes(
    runtime: Server, hub: FakeHub, hub_env: dict[str, str]
) -> None:
    operation = _pull(runtime, f"hf://{REPO}/{SLOW}")
    assert hub.stalled.wait(30), "the download never started"
    deadline = time.monotonic() + 30  # cancel once the runtime wrote what the hub sent
    while _partial_bytes(hub_env) < 56 * 1024:
        assert time.monotonic() < deadline, "the runtime never wrote what the hub sent"
        time.sleep(0.01)
    with runtime.http() as http:
        cancel = http.post(f"/api/runtime/operations/{operation}/cancel")
    assert cancel.status_code == 202
    hub.release.set()  # the stalled body goes on; the pull stops at its next chunk
    kinds = [e["kind"] for e in _ended(runtime, operation)]
    assert "model_preparation_cancelled" in kinds, kinds
    assert "model_preparation_completed" not in kinds
    kept = _partial_bytes(hub_env)
    assert kept >= 56 * 1024

    hub.stall_after.pop(SLOW)
    again = _ended(runtime, _pull(runtime, f"hf://{REPO}/{SLOW}"))
    assert hub.body_gets(SLOW)[-1] == f"bytes={kept}-"  # only the rest was asked for
    assert "model_preparation_completed" in [e["kind"] for e in again]
    started = next(e for e in again if e["kind"] == "model_download_started")
    assert started["progress"]["current"] == kept, started


def test_an_hf_preset_is_pulled_by_the_request_that_wants_it(runtime: Server) -> None:
    with runtime.http(timeout=120) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": "hubbed", "prompt": "hi", "max_tokens": 4, "temperature": 0},
        )
    assert answer.status_code == 200, answer.text
    events = runtime.events()
    pulls = [e for e in events if e["kind"] == "model_queued"]
    assert pulls, "the preset's file was not prepared in the runtime"
    loads = [
        e
        for e in events
        if e["kind"] == "model_load_requested" and e["scope"].get("model_id") == "hubbed"
    ]
    assert len(loads) == 1


def test_api_models_pull_is_the_same_call(runtime: Server) -> None:
    with runtime.http() as http:
        answer = http.post("/api/models/pull", json={"ref": f"hf://{REPO}/{FILE}"})
    assert answer.status_code == 202, answer.text
    kinds = [e["kind"] for e in _ended(runtime, answer.json()["operation_id"])]
    assert kinds[0] == "model_queued"
    assert {"model_preparation_completed", "model_preparation_cache_reused"} & set(kinds)


def test_a_bad_pull_body_is_refused_naming_the_field(runtime: Server) -> None:
    with runtime.http() as http:
        for body, field in (
            ({}, "ref"),
            ({"ref": ""}, "ref"),
            ({"ref": "x", "revision": 5}, "revision"),
        ):
            error = assert_openai_error(http.post("/api/runtime/models/pull", json=body), 400)
            assert error["param"] == field, error


def test_skippyctl_pull_goes_through_a_running_runtime(
    runtime: Server, hub_env: dict[str, str]
) -> None:
    from tests.cli.helpers import run_cli

    env = {"SKIPPY_RUNTIME_DIR": str(runtime.directory), **hub_env}
    result = run_cli("pull", f"hf://{REPO}/{FILE}", "--json", env=env, timeout=60)
    assert result.code == 0, result.stderr
    records = result.records()
    assert records and all("seq" in r for r in records)  # the runtime's stream numbers them
    assert records[0]["event"] == "model_queued"
    assert records[-1]["event"] in {"model_preparation_completed", "model_preparation_cache_reused"}
    assert "runtime's cache" in result.stderr or "reused" in result.stderr
    # --embedded pulls in the CLI's own process (no seq: not the runtime's stream).
    here = run_cli("pull", f"hf://{REPO}/{FILE}", "--json", "--embedded", env=env, timeout=60)
    assert here.code == 0, here.stderr
    assert all("seq" not in r for r in here.records())


def test_a_pulled_file_is_loadable_by_its_name(runtime: Server) -> None:
    _ended(runtime, _pull(runtime, f"hf://{REPO}/{FILE}"))
    with runtime.http(timeout=120) as http:
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards["tiny-Q4_K_M"]["source"] == "hub_cache", cards
        answer = http.post(
            "/v1/completions",
            json={"model": "tiny-Q4_K_M", "prompt": "hi", "max_tokens": 4, "temperature": 0},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "tiny-Q4_K_M"


def test_a_pull_is_seen_by_events_follow_and_the_dashboard(
    runtime: Server, hub: FakeHub, hub_env: dict[str, str]
) -> None:
    """As an operator watches: `skippyctl events --follow --json` prints the download's records,
    and the dashboard's live source shows a download row while the bytes flow, gone once done."""
    import subprocess
    import sys

    from skippy_tui.live import LiveSource
    from skippy_tui.store import SnapshotStore
    from skippyctl.config.runtime_settings import RuntimeSettings

    hub.stalled.clear()
    hub.release.clear()
    hub.stall_after[WATCHED] = 64 * 1024
    log = Path(hub_env["HF_HUB_CACHE"]).parent / "follow.ndjson"
    env = dict(os.environ, SKIPPY_RUNTIME_DIR=str(runtime.directory))
    with log.open("wb") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "events", "--follow", "--json"],
            stdout=out,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    store = SnapshotStore()
    source = LiveSource(runtime.client(), RuntimeSettings(runtime_dir=runtime.directory))
    try:
        source.start(store.deliver)
        operation = _pull(runtime, f"hf://{REPO}/{WATCHED}")
        assert hub.stalled.wait(30), "the download never started"
        row = wait_for(lambda: store.snapshot().downloads.get(f"{operation}.download"))
        assert row.model_id == "tiny-watched-F32" and row.bytes_total == len(_watched_bytes(hub))
        hub.release.set()
        kinds = [e["kind"] for e in _ended(runtime, operation)]
        assert "model_preparation_completed" in kinds, kinds
        wait_for(lambda: f"{operation}.download" not in store.snapshot().downloads or None)

        def followed() -> list[dict[str, Any]] | None:
            records = [orjson.loads(line) for line in log.read_bytes().splitlines() if line]
            mine = [r for r in records if str(r.get("operation_id", "")).startswith(operation)]
            done = any(r["event"] == "model_preparation_completed" for r in mine)
            return mine if done else None

        mine = wait_for(followed)
        events = [r["event"] for r in mine]
        assert events[0] == "model_queued"
        assert events.index("model_download_started") < events.index("model_download_completed")
        assert all("seq" in r for r in mine)
    finally:
        hub.stall_after.pop(WATCHED, None)
        hub.release.set()  # no body stays held ...
        hub.stalled.clear()
        hub.release.clear()  # ... and the next test's stall holds again
        source.stop()
        source.client.close()
        follower.terminate()
        follower.wait(10)


def _watched_bytes(hub: FakeHub) -> bytes:
    return hub.repos[REPO].files[WATCHED]
