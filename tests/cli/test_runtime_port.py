"""`runtime start` (and `serve`) honour SKIPPY_PORT; --port beats it; an invalid one is
invalid_configuration (exit 10), never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from tests.cli.discovery_files import run_script
from tests.cli.helpers import ndjson_objects


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_start_listens_on_skippy_port(isolated_runtime: Path) -> None:
    port = _free_port()
    started = run_script("runtime", "start", "--json", env={"SKIPPY_PORT": str(port)})
    assert started.code == 0, started.stderr
    assert urlsplit(orjson.loads(started.stdout)["url"]).port == port
    written = orjson.loads((isolated_runtime / "runtime.json").read_bytes())
    assert urlsplit(written["url"]).port == port


def test_the_port_flag_beats_skippy_port(isolated_runtime: Path) -> None:
    from_env, from_flag = _free_port(), _free_port()
    started = run_script(
        "runtime", "start", "--port", str(from_flag), "--json", env={"SKIPPY_PORT": str(from_env)}
    )
    assert started.code == 0, started.stderr
    assert urlsplit(orjson.loads(started.stdout)["url"]).port == from_flag


@pytest.mark.parametrize("value", ["abc", "70000", "-1", "8750x", "1e3"])
@pytest.mark.parametrize(
    "command", [("runtime", "start"), ("runtime", "serve"), ("ps",)], ids=" ".join
)
def test_an_invalid_skippy_port_is_invalid_configuration(
    isolated_runtime: Path, command: tuple[str, ...], value: str
) -> None:
    env = {"SKIPPY_PORT": value}
    human = run_script(*command, env=env)
    assert human.code == 10, human.stderr
    assert "Traceback" not in human.stderr
    assert f"SKIPPY_PORT={value!r} is not a port number" in human.stderr
    assert human.stdout == ""
    assert not (isolated_runtime / "runtime.json").exists()
    if command == ("runtime", "serve"):
        return  # serve has no --json
    result = run_script(*command, "--json", env=env)
    assert result.code == 10
    (record,) = ndjson_objects(result.stdout)
    assert record["record"] == "error" and record["exit_code"] == 10
    assert record["reason_code"] == "invalid_configuration"


@pytest.mark.parametrize("command", [("runtime", "start"), ("runtime", "serve")], ids=" ".join)
def test_an_out_of_range_port_flag_is_invalid_configuration(command: tuple[str, ...]) -> None:
    result = run_script(*command, "--port", "65536")
    assert result.code == 10, result.stderr
    assert "--port 65536 is not a port number" in result.stderr
    assert "Traceback" not in result.stderr
