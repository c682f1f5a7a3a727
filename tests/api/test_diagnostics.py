"""Diagnostics from real conditions on a real runtime (subprocess host, real llama.cpp engine):
KV near full and a saturated admission queue raise structured warnings and clear them, and
`skippyctl diagnostics record` bundles them without the token or absolute paths; a host that
finds a discovery file left by a dead host reports that host's crash once."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from skippyctl.client.discovery import Discovery
from tests.api.conftest import BAN_TINY_END, Server, start_server, stop_server
from tests.cli.discovery_files import discovery_fields, write_discovery_file
from tests.cli.helpers import ndjson_objects, run_cli

CTX = 256
"""One lane of 256 cells (llama.cpp's smallest context): a 240-token generation crosses the
85 % KV mark (218 cells)."""


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("diagnostics"),
        "--max-queue",
        "1",
        # 5 ms per decode: a 100-token request holds its lane for ~0.5 s, so concurrent ones
        # queue (one) and are refused (the rest) for real.
        # The opt-in native debug log: llama.cpp's own lines (which name the model's absolute
        # path) reach the bundle redacted.
        env={"SKIPPY_TEST_DECODE_DELAY_MS": "5", "SKIPPY_CAPTURE_NATIVE_LOG": "1"},
    )
    try:
        # The successor model never ends a generation early (its end-of-generation tokens have
        # the lowest logits), so every request runs its full max_tokens.
        answer = running.load(
            fixture_dir / "tiny-successor.gguf", alias="tiny", lanes=1, ctx=CTX, max_queue=1
        )
        assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


def _complete(server: Server, tokens: int, n: int = 0) -> int:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http:
        body = {
            "model": "tiny",
            "prompt": f"w {n}",
            "max_tokens": tokens,
            "logit_bias": BAN_TINY_END,
        }
        return http.post("/v1/completions", json=body).status_code


def _warnings(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["kind"] in ("warning_raised", "warning_cleared")
        and code in (e.get("state", {}).get("current"), e.get("state", {}).get("previous"))
    ]


def _wait_for(server: Server, predicate: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = server.events()
        if predicate(events) or time.monotonic() > deadline:
            return events
        time.sleep(1.0)  # each look is a stream reconnect, which the runtime rate-limits


def test_kv_near_full_is_raised_then_cleared_with_its_figures(runtime: Server) -> None:
    assert _complete(runtime, 240) == 200
    events = _wait_for(runtime, lambda es: len(_warnings(es, "kv_near_full")) >= 2)
    pair = _warnings(events, "kv_near_full")
    assert [e["kind"] for e in pair[:2]] == ["warning_raised", "warning_cleared"], pair
    raised, cleared = pair[:2]
    assert raised["reason_code"] == "context_exhausted"
    assert raised["scope"] == {"model_id": "tiny"}
    assert raised["operation"]["root"] == cleared["operation"]["root"]  # a raise and its clear
    figures = {s["key"]: s["value"] for s in raised["numeric_summaries"]}
    assert figures["kv_cells_total"] == CTX and figures["kv_cells_used"] >= 0.85 * CTX
    assert raised["summary"].startswith("warning kv_near_full: KV ")
    logs = [e for e in events if e["kind"] == "native_log_summary"]
    assert logs and logs[0]["scope"] == {"model_id": "tiny"}  # llama.cpp's lines, counted
    assert {s["key"] for s in logs[0]["numeric_summaries"]} >= {"count", "log_messages_warn"}
    assert cleared["outcome"] == "success" and "duration_ms" in cleared
    with runtime.http() as http:
        state = http.get("/api/runtime/state").json()
    assert not [w for w in state["warnings"] if w["code"] == "kv_near_full"]


def test_a_full_queue_raises_queue_saturated_once_and_clears_when_it_drains(
    runtime: Server,
) -> None:
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda n: _complete(runtime, 100, n), range(6)))
    assert 429 in codes and 200 in codes, codes
    events = _wait_for(runtime, lambda es: len(_warnings(es, "queue_saturated")) >= 2)
    pair = _warnings(events, "queue_saturated")
    # Several 429s, one warning: an active condition raises nothing more.
    assert [e["kind"] for e in pair] == ["warning_raised", "warning_cleared"], pair
    raised = pair[0]
    assert raised["reason_code"] == "reservation_exhausted"
    assert raised["scope"] == {"model_id": "tiny"}
    figures = {s["key"]: s["value"] for s in raised["numeric_summaries"]}
    assert figures["queue_capacity"] == 1
    assert sum(e["kind"] == "request_rejected" for e in events) >= 1


def test_diagnostics_record_bundles_events_state_and_doctor_without_secrets(
    runtime: Server, tmp_path: Path
) -> None:
    out = tmp_path / "bundle" / "x.tar.gz"
    env = {"SKIPPY_RUNTIME_DIR": str(runtime.directory)}
    result = run_cli(
        "diagnostics", "record", "--seconds", "1", "--out", str(out), "--json", env=env
    )
    assert result.code == 0, result.stderr
    [record] = ndjson_objects(result.stdout)  # --json: only JSON records on stdout
    assert record["record"] == "diagnostics_bundle" and record["file"] == "x.tar.gz"
    assert out.stat().st_mode & 0o777 == 0o600
    with tarfile.open(out, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]  # regular files only
    assert set(members) == {
        "manifest.json",
        "events.ndjson",
        "stream.ndjson",
        "state.json",
        "doctor.ndjson",
        "native-log.txt",
    }
    assert "llama_model_loader" in members["native-log.txt"]
    assert "<path:tiny-successor.gguf>" in members["native-log.txt"]
    retained = ndjson_objects(members["events.ndjson"])
    assert "warning_raised" in [r["event"] for r in retained]
    state = orjson.loads(members["state.json"])
    assert state["record"] == "state" and state["runtime"] == "running"
    doctor = ndjson_objects(members["doctor.ndjson"])
    assert doctor[-1]["record"] == "doctor_summary"
    everything = "".join(members.values())
    assert runtime.discovery.token not in everything
    assert str(tmp_path) not in everything and str(runtime.directory) not in everything
    assert str(Path.home()) + "/" not in everything
    manifest = orjson.loads(members["manifest.json"])
    assert manifest["members"]["events.ndjson"] == len(retained)


def test_diagnostics_record_to_an_unwritable_place_exits_13_and_leaves_nothing(
    runtime: Server, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"SKIPPY_RUNTIME_DIR": str(runtime.directory)}
    out = blocker / "x.tar.gz"
    result = run_cli("diagnostics", "record", "--out", str(out), "--json", env=env)
    assert result.code == 13, result.stderr
    [record] = ndjson_objects(result.stdout)
    assert record["reason_code"] == "artifact_io_failure" and record["exit_code"] == 13
    assert str(tmp_path) not in record["message"]  # the path is for people: stderr only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_diagnostics_record_without_a_runtime_exits_3_with_a_json_error(tmp_path: Path) -> None:
    env = {"SKIPPY_RUNTIME_DIR": str(tmp_path / "none")}
    (tmp_path / "none").mkdir(mode=0o700)
    result = run_cli(
        "diagnostics", "record", "--out", str(tmp_path / "y.tar.gz"), "--json", env=env
    )
    assert result.code == 3
    [record] = ndjson_objects(result.stdout)
    assert record["record"] == "error" and record["exit_code"] == 3
    assert not (tmp_path / "y.tar.gz").exists()


def _started_over(server: Server, dead_pid: int) -> Server:
    """`start_server` returns on the first discovery file it sees, which is the stale one:
    wait for the new host's own."""
    path = server.directory / "runtime.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            data = {}
        if data.get("pid") not in (None, dead_pid):
            return Server(server.directory, Discovery(**data), server.process)
        time.sleep(0.05)
    stop_server(server)
    raise AssertionError("the new host never wrote its discovery file")


def test_a_host_reports_the_crash_of_the_host_that_left_its_discovery_file(
    tmp_path: Path,
) -> None:
    # A pid that is certainly dead: a child of ours that exited and was reaped.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    write_discovery_file(
        directory,
        discovery_fields(pid=child.pid, process_instance_id="dead-host-1", token="s3cret-t0ken"),
    )
    server = _started_over(start_server(directory), child.pid)
    try:
        events = server.events()
        crashed = [e for e in events if e["kind"] == "runtime_crashed"]
        assert len(crashed) == 1, crashed
        assert crashed[0]["reason_code"] == "process_crash"
        assert crashed[0]["producer"] == "reconciled"
        assert crashed[0]["operation"]["root"] == "dead-host-1"
        assert "s3cret-t0ken" not in orjson.dumps(events).decode()
        with server.http() as http:
            assert http.get("/api/runtime/state").json()["runtime"] == "running"
    finally:
        stop_server(server)
    # An orderly stop removes the file: the next host has no crash to report.
    assert not (directory / "runtime.json").exists()
    again = start_server(directory)
    try:
        assert "runtime_crashed" not in [e["kind"] for e in again.events()]
    finally:
        stop_server(again)


def test_a_host_killed_with_sigkill_is_reported_by_the_host_the_next_command_starts(
    tmp_path: Path,
) -> None:
    """The real sequence: a host dies (SIGKILL, so its file stays), a command (`ps`) finds the
    file stale and removes it (keeping a note), starts a new host, and that host reports the
    dead one's crash once."""
    directory = tmp_path / "rt"
    first = start_server(directory)
    dead_instance = first.discovery.process_instance_id
    first.process.kill()  # our own child: SIGKILL, no cleanup
    first.process.wait()
    assert (directory / "runtime.json").exists()
    env = {"SKIPPY_RUNTIME_DIR": str(directory), "SKIPPY_PORT": "0"}
    result = run_cli("ps", "--json", env=env)
    assert result.code == 0, result.stderr
    try:
        data = orjson.loads((directory / "runtime.json").read_bytes())
        assert data["process_instance_id"] != dead_instance
        second = Server(directory, Discovery(**data), first.process)
        crashed = [e for e in second.events() if e["kind"] == "runtime_crashed"]
        assert [(e["reason_code"], e["operation"]["root"]) for e in crashed] == [
            ("process_crash", dead_instance)
        ]
        assert not (directory / "runtime.crashed.json").exists()  # reported once: consumed
    finally:
        from tests.cli.conftest import stop_runtime

        stop_runtime(directory)
