"""`skippyctl runtime start|status|stop` and the discovery file."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import orjson

from tests.cli.helpers import run_cli


def test_start_status_stop_round_trip(isolated_runtime: Path) -> None:
    stopped = run_cli("runtime", "status", "--json")
    assert stopped.code == 3
    assert orjson.loads(stopped.stdout) == {
        "schema_version": 1,
        "record": "runtime_status",
        "state": "stopped",
        "running": False,
    }
    started = run_cli("runtime", "start", "--port", "0", "--json")
    assert started.code == 0, started.stderr
    status = orjson.loads(started.stdout)
    assert status["running"] is True
    assert status["url"].startswith("http://127.0.0.1:")
    assert {"pid", "version", "state", "process_instance_id"} <= set(status)
    discovery = isolated_runtime / "runtime.json"
    assert stat.S_IMODE(discovery.stat().st_mode) == 0o600
    again = run_cli("runtime", "start", "--port", "0")
    assert again.code == 0
    assert "already running" in again.stderr
    stop = run_cli("runtime", "stop", "--json")
    assert stop.code == 0
    assert orjson.loads(stop.stdout)["stopped"] is True
    assert not discovery.exists()
    assert run_cli("runtime", "status").code == 3


def test_stale_discovery_file_is_replaced(isolated_runtime: Path) -> None:
    isolated_runtime.mkdir(parents=True)
    dead_pid = 2**22 - 3  # above the default pid_max: never a live process
    (isolated_runtime / "runtime.json").write_bytes(
        orjson.dumps(
            {
                "pid": dead_pid,
                "url": "http://127.0.0.1:1",
                "token": "t",
                "version": "0",
                "process_instance_id": "x",
                "started_at": "then",
            }
        )
    )
    status = orjson.loads(run_cli("runtime", "status", "--json").stdout)
    assert status["running"] is False
    assert status["discovery"] == "stale"
    started = run_cli("runtime", "start", "--port", "0", "--json")
    assert started.code == 0, started.stderr
    fresh = orjson.loads((isolated_runtime / "runtime.json").read_bytes())
    assert fresh["pid"] != dead_pid
    os.kill(fresh["pid"], 0)  # alive


def test_serve_refuses_a_non_loopback_address_without_allow_remote() -> None:
    result = run_cli("runtime", "serve", "--host", "0.0.0.0", "--port", "0")
    assert result.code == 10
    assert "allow-remote" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_stops_the_runtime_in_order(isolated_runtime: Path) -> None:
    started = run_cli("runtime", "start", "--port", "0", "--json")
    assert started.code == 0, started.stderr
    pid = orjson.loads(started.stdout)["pid"]
    discovery = isolated_runtime / "runtime.json"
    assert discovery.exists()
    os.kill(pid, signal.SIGTERM)
    # The serve process is not our child (start detaches it): watch its discovery file, which
    # only the orderly shutdown path removes.
    deadline = time.monotonic() + 30
    while discovery.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not discovery.exists(), "SIGTERM killed the runtime without its orderly shutdown"
    assert run_cli("runtime", "status").code == 3


def test_the_runtime_is_reached_directly_whatever_proxy_the_environment_names() -> None:
    """A proxy from the environment is for the world, not for the runtime on this machine:
    httpx used to send the CLI's loopback requests to it (here a closed port), so no command
    reached the runtime and each tried to start another one."""
    closed = "http://127.0.0.1:9"
    proxy = {name: closed for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")}
    started = run_cli("ps", "--json", env=proxy)  # starts the runtime, then asks it
    assert started.code == 0, started.stderr
    assert orjson.loads(started.stdout)["record"] == "state"
    streamed = run_cli("events", "--limit", "1", "--json", env=proxy)
    assert streamed.code == 0, streamed.stderr
    assert len(streamed.records()) == 1
    status = run_cli("runtime", "status", "--json", env=proxy)
    assert status.code == 0 and orjson.loads(status.stdout)["running"] is True


def test_a_foreign_skippyctl_in_the_working_directory_supplies_no_code(
    tmp_path: Path, fixture_dir: Path
) -> None:
    """Started from a directory that holds another `skippyctl/` package (a checkout, a
    download), the runtime and its engine still run this install's code, native library
    included."""
    import shutil
    import subprocess
    import sys

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "skippyctl").mkdir(parents=True)
    (elsewhere / "skippyctl" / "__init__.py").write_text('raise SystemExit("foreign code")\n')
    command = shutil.which("skippyctl", path=str(Path(sys.executable).parent))
    assert command is not None, "the venv's console script"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [command, *args],
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    loaded = run("load", str(fixture_dir / "tiny.gguf"), "--json")
    assert loaded.returncode == 0, loaded.stderr
    state = orjson.loads(run("ps", "--json").stdout)
    assert state["native_mode"] == "native"
    assert [(m["model_id"], m["state"]) for m in state["models"]] == [("tiny", "available")]
