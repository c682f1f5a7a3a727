"""OTLP configuration on `runtime serve` and `runtime start`: a bad OTEL_* value is refused up
front (exit 10, invalid_configuration, naming the variable, never its value), and a background
runtime gets the configuration through its environment, never its command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from skippyctl.cli.exit_codes import ExitCode
from tests.cli.conftest import stop_runtime
from tests.cli.helpers import run_cli
from tests.telemetry.otlp_receiver import Receiver, log_bodies

BAD = [
    pytest.param(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://bob:hunter2-secret@collector/x"},
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        id="scheme",
    ),
    pytest.param(
        {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://bob:hunter2-secret@c:99999/v1/logs"},
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        id="port",
    ),
    pytest.param(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BLRP_SCHEDULE_DELAY": "soon"},
        "OTEL_BLRP_SCHEDULE_DELAY",
        id="knob",
    ),
]


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(variable, raising=False)
    yield directory
    stop_runtime(directory)


@pytest.mark.parametrize("command", ["serve", "start"])
@pytest.mark.parametrize(("env", "variable"), BAD)
def test_bad_otlp_configuration_is_invalid_configuration_and_never_echoed(
    isolated: Path, command: str, env: dict[str, str], variable: str
) -> None:
    result = run_cli("runtime", command, "--port", "0", env=env)
    assert result.code == ExitCode.INVALID_CONFIGURATION, result.stderr
    assert variable in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert not (isolated / "runtime.json").exists()


def test_start_json_says_why_as_one_error_record(isolated: Path) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://bob:hunter2-secret@collector/x"}
    result = run_cli("runtime", "start", "--port", "0", "--json", env=env)
    assert result.code == ExitCode.INVALID_CONFIGURATION
    record = orjson.loads(result.stdout)
    assert record["record"] == "error"
    assert record["command"] == "runtime start"
    assert record["exit_code"] == ExitCode.INVALID_CONFIGURATION
    assert record["reason_code"] == "invalid_configuration"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in record["message"]
    assert "hunter2" not in result.stdout


def test_start_hands_otlp_to_the_background_runtime_off_its_command_line(
    isolated: Path, receiver: Receiver
) -> None:
    port = receiver.server.server_address[1]
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://bob:hunter2-secret@127.0.0.1:{port}",
        "OTEL_BLRP_SCHEDULE_DELAY": "50",
    }
    started = run_cli("runtime", "start", "--port", "0", env=env)
    assert started.code == 0, started.stderr
    assert "hunter2" not in started.stderr + started.stdout
    receiver.wait_for(lambda r: "runtime_initialized" in log_bodies(r))
    pid = int(orjson.loads((isolated / "runtime.json").read_bytes())["pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"hunter2" not in cmdline and str(port).encode() not in cmdline
    stopped = run_cli("runtime", "stop")
    assert stopped.code == 0
    assert "runtime_stopped" in log_bodies(receiver)  # the orderly stop flushed the tail
    log = isolated / "runtime.log"
    assert not log.exists() or "hunter2" not in log.read_text(errors="replace")
