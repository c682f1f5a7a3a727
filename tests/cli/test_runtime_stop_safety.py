"""`runtime stop` (and every discovery read) never signals a process that is not the runtime.

The "stranger" in these tests is always a process this test started itself; pids that address
groups or every process (0, -1, negative) reach the real CLI only inside a private pid
namespace, after an in-process test has shown they never reach kill(2).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from skippyctl.cli.app import app
from skippyctl.client.discovery import Discovery
from skippyctl.client.process_identity import (
    Verdict,
    pid_alive,
    signal_runtime,
    verify_runtime,
)
from tests.cli.discovery_files import (
    SCRIPT,
    boot_id,
    discovery_fields,
    run_script,
    start_ticks_of,
    stranger,
    write_discovery_file,
)
from tests.cli.helpers import ndjson_objects


def _alive(process: subprocess.Popen[bytes]) -> bool:
    try:
        process.wait(timeout=0.3)
    except subprocess.TimeoutExpired:
        return True
    return False


def _exited(pid: int) -> bool:
    """Gone, or a zombie (the runtime is not our child; whoever adopted it may reap late)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return raw[raw.rfind(b")") + 1 :].split()[0] in (b"Z", b"X")


def test_the_discovery_file_records_the_runtime_process_identity(isolated_runtime: Path) -> None:
    started = run_script("runtime", "start", "--json")
    assert started.code == 0, started.stderr
    written = orjson.loads((isolated_runtime / "runtime.json").read_bytes())
    assert written["boot_id"] == boot_id()
    assert written["start_ticks"] == start_ticks_of(written["pid"])
    status = orjson.loads(started.stdout)
    assert "boot_id" not in status and "start_ticks" not in status and "token" not in status


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "human"])
@pytest.mark.parametrize("identity", ["legacy", "other_start_time", "other_boot"])
def test_stop_never_signals_a_process_that_reused_the_runtime_pid(
    isolated_runtime: Path, identity: str, json_output: bool
) -> None:
    with stranger() as process:
        fields: dict[str, Any] = {"pid": process.pid}
        if identity == "other_start_time":
            fields |= {"boot_id": boot_id(), "start_ticks": start_ticks_of(process.pid) - 1}
        elif identity == "other_boot":
            fields |= {
                "boot_id": "00000000-0000-0000-0000-000000000000",
                "start_ticks": start_ticks_of(process.pid),
            }
        path = write_discovery_file(isolated_runtime, discovery_fields(**fields))

        status = run_script("runtime", "status", "--json")
        assert status.code == 3
        (record,) = ndjson_objects(status.stdout)
        assert record["running"] is False and record["discovery"] == "stale"
        assert "another process" in record["detail"]
        assert path.exists(), "status only reports; it does not remove"

        stop = run_script("runtime", "stop", *(["--json"] if json_output else []))
        assert _alive(process), "runtime stop signalled a process that is not the runtime"
        assert stop.code == 3, stop.stderr
        assert "Traceback" not in stop.stderr
        assert "nothing was signalled" in stop.stderr
        assert not path.exists(), "the stale file stays behind"
        if json_output:
            (record,) = ndjson_objects(stop.stdout)
            assert record == {
                "schema_version": 1,
                "record": "runtime_stop",
                "stopped": False,
                "running": False,
                "discovery": "stale",
                "detail": record["detail"],
                "removed": True,
            }
            assert "another process" in record["detail"]
        else:
            assert stop.stdout == ""
            assert "another process" in stop.stderr
            assert "removed the stale discovery file" in stop.stderr


class KillRecorder:
    """Stands in for kill(2) and pidfd signalling in-process. A mock on purpose: a real
    kill(-1, SIGTERM) as root signals every process on the machine, so the proof that these
    pids never reach kill must not depend on kill itself."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def kill(self, *args: object) -> None:
        self.calls.append(("kill", args))
        raise ProcessLookupError

    def pidfd_open(self, *args: object) -> int:
        self.calls.append(("pidfd_open", args))
        raise ProcessLookupError

    def pidfd_send_signal(self, *args: object) -> None:
        self.calls.append(("pidfd_send_signal", args))
        raise ProcessLookupError


DANGEROUS_PIDS = [-1, 0, -7, True, 2**22 + 1, 2**63 - 1]


@pytest.mark.parametrize("pid", DANGEROUS_PIDS, ids=repr)
def test_impossible_pids_are_refused_before_any_kill(
    isolated_runtime: Path, monkeypatch: pytest.MonkeyPatch, pid: int
) -> None:
    recorder = KillRecorder()
    monkeypatch.setattr(os, "kill", recorder.kill)
    monkeypatch.setattr(os, "pidfd_open", recorder.pidfd_open, raising=False)
    monkeypatch.setattr(signal, "pidfd_send_signal", recorder.pidfd_send_signal, raising=False)

    named = Discovery(pid, "http://127.0.0.1:9", "t", "0", "x", "t")
    assert pid_alive(pid) is False
    assert verify_runtime(named) is Verdict.GONE
    assert signal_runtime(named, signal.SIGTERM) is False
    assert signal_runtime(named, signal.SIGKILL) is False
    path = write_discovery_file(isolated_runtime, discovery_fields(pid=pid))
    runner = CliRunner()
    status = runner.invoke(app, ["runtime", "status", "--json"])
    assert status.exit_code == 3, status.output
    stop = runner.invoke(app, ["runtime", "stop", "--json"])
    assert stop.exit_code == 3, stop.output
    assert recorder.calls == []
    assert not path.exists()


def _pid_namespace_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.parametrize("pid", DANGEROUS_PIDS, ids=repr)
def test_the_real_cli_refuses_impossible_pids(isolated_runtime: Path, pid: int) -> None:
    """The installed CLI, run in a private pid namespace and session: even if a pid slipped
    through to kill(2), nothing outside the namespace could be signalled."""
    if not _pid_namespace_available():
        pytest.skip("no private pid namespace here (unshare --pid): not running -1/0 for real")
    path = write_discovery_file(isolated_runtime, discovery_fields(pid=pid))
    command = ["unshare", "--pid", "--fork", "--mount-proc", str(SCRIPT)]
    status = subprocess.run(
        [*command, "runtime", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert status.returncode == 3, status.stderr
    (record,) = ndjson_objects(status.stdout)
    assert record["record"] == "runtime_status" and record["running"] is False
    assert record["discovery"] == "corrupt", record
    assert "Traceback" not in status.stderr
    stop = subprocess.run(
        [*command, "runtime", "stop", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert stop.returncode == 3, stop.stderr
    (record,) = ndjson_objects(stop.stdout)
    assert record["discovery"] == "corrupt" and record["removed"] is True
    assert "nothing was signalled" in stop.stderr
    assert not path.exists()


@pytest.mark.parametrize("identity", ["recorded", "legacy"])
def test_stop_falls_back_to_sigterm_only_for_a_verified_runtime(
    isolated_runtime: Path, identity: str
) -> None:
    """The API refuses the shutdown (the file's token is wrong); the pid is verified as the
    runtime (by its recorded start time, or for a file without identity by its command line),
    so SIGTERM is sent and the runtime stops in order."""
    started = run_script("runtime", "start", "--json")
    assert started.code == 0, started.stderr
    path = isolated_runtime / "runtime.json"
    fields = orjson.loads(path.read_bytes())
    fields["token"] = "not-the-token"
    if identity == "legacy":
        del fields["boot_id"], fields["start_ticks"]
    write_discovery_file(isolated_runtime, fields)
    stop = run_script("runtime", "stop", "--json")
    assert stop.code == 0, stop.stderr
    (record,) = ndjson_objects(stop.stdout)
    assert record["stopped"] is True and record["via"] == "sigterm", record
    assert record["killed"] is False
    assert _exited(fields["pid"])
    assert not path.exists()
