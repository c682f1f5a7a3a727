"""`--telemetry-endpoint` / SKIPPY_TELEMETRY_ENDPOINT on `runtime serve` and `runtime start`:
validated up front (exit 10, invalid_configuration, the URL never echoed), documented in
--help, and passed to a background runtime without putting it on a command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from skippyctl.cli.exit_codes import ExitCode
from tests.cli.conftest import stop_runtime
from tests.cli.helpers import run_cli
from tests.telemetry.conftest import Collector, has_event


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    monkeypatch.delenv("SKIPPY_TELEMETRY_ENDPOINT", raising=False)
    yield directory
    stop_runtime(directory)


@pytest.mark.parametrize("command", ["serve", "start"])
@pytest.mark.parametrize(
    "url", ["ftp://bob:hunter2-secret@collector/x", "http://", "collector:4318/?k=hunter2-secret"]
)
def test_bad_endpoint_is_invalid_configuration_and_never_echoed(
    isolated: Path, command: str, url: str
) -> None:
    result = run_cli("runtime", command, "--port", "0", "--telemetry-endpoint", url)
    assert result.code == ExitCode.INVALID_CONFIGURATION, result.stderr
    assert "invalid_configuration" in result.stderr
    assert "--telemetry-endpoint" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert not (isolated / "runtime.json").exists()


def test_start_json_says_why_as_one_error_record(isolated: Path) -> None:
    url = "ftp://bob:hunter2-secret@collector/x"
    result = run_cli("runtime", "start", "--port", "0", "--telemetry-endpoint", url, "--json")
    assert result.code == ExitCode.INVALID_CONFIGURATION
    record = orjson.loads(result.stdout)
    assert record["record"] == "error"
    assert record["command"] == "runtime start"
    assert record["exit_code"] == ExitCode.INVALID_CONFIGURATION
    assert record["reason_code"] == "invalid_configuration"
    assert "hunter2" not in result.stdout


def test_bad_endpoint_from_the_environment_is_refused_too(isolated: Path) -> None:
    env = {"SKIPPY_TELEMETRY_ENDPOINT": "gopher://hunter2-secret@x"}
    result = run_cli("runtime", "serve", "--port", "0", env=env)
    assert result.code == ExitCode.INVALID_CONFIGURATION
    assert "hunter2" not in result.stderr
    knob = {"SKIPPY_TELEMETRY_EXPORT_TIMEOUT_MILLIS": "soon"}
    result = run_cli(
        "runtime", "serve", "--port", "0", "--telemetry-endpoint", "http://127.0.0.1:9/", env=knob
    )
    assert result.code == ExitCode.INVALID_CONFIGURATION
    assert "SKIPPY_TELEMETRY_EXPORT_TIMEOUT_MILLIS" in result.stderr


@pytest.mark.parametrize("command", ["serve", "start"])
def test_help_explains_the_option_without_showing_its_value(command: str) -> None:
    env = {"SKIPPY_TELEMETRY_ENDPOINT": "http://bob:hunter2-secret@127.0.0.1:9/", "COLUMNS": "200"}
    result = run_cli("runtime", command, "--help", env=env)
    assert result.code == 0
    text = " ".join(result.stdout.split())
    assert "--telemetry-endpoint" in text and "SKIPPY_TELEMETRY_ENDPOINT" in text
    assert "x-ndjson" in text and "never" in text.lower()
    assert "hunter2" not in result.stdout


def test_start_passes_the_endpoint_to_the_background_runtime_off_its_command_line(
    isolated: Path, collector: Collector
) -> None:
    port = collector.server.server_address[1]
    url = f"http://bob:hunter2-secret@127.0.0.1:{port}/ingest"
    started = run_cli("runtime", "start", "--port", "0", "--telemetry-endpoint", url)
    assert started.code == 0, started.stderr
    assert "hunter2" not in started.stderr + started.stdout
    collector.wait_for(has_event("runtime_initialized"))
    pid = int(orjson.loads((isolated / "runtime.json").read_bytes())["pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"hunter2" not in cmdline and str(port).encode() not in cmdline
    stopped = run_cli("runtime", "stop")
    assert stopped.code == 0
    assert "runtime_stopped" in [r["event"] for r in collector.records()]
    log = isolated / "runtime.log"
    assert not log.exists() or "hunter2" not in log.read_text(errors="replace")
