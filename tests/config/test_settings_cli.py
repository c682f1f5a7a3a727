"""The settings as the CLI reads them: once at its start, refused (exit 10, invalid_configuration)
by the commands that use them, listed by `runtime serve --help`, and the `runtime serve` options
that fall back to one (`--api-key`: SKIPPY_API_KEY) still doing so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from skippyctl.config.runtime_settings import settings_table
from tests.cli.conftest import stop_runtime
from tests.cli.helpers import ndjson_objects, run_cli


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "runtime"
    monkeypatch.setenv("SKIPPY_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("SKIPPY_PORT", "0")
    yield directory
    stop_runtime(directory)


def test_runtime_serve_help_lists_every_setting() -> None:
    result = run_cli("runtime", "serve", "--help", env={"COLUMNS": "200"})
    assert result.code == 0, result.stderr
    missing = [s.variable for _, s in settings_table() if s.variable not in result.stdout]
    assert missing == []


@pytest.mark.parametrize(
    "command", [("runtime", "serve"), ("runtime", "start"), ("ps",)], ids=" ".join
)
def test_an_invalid_runtime_setting_refuses_the_commands_that_use_the_settings(
    runtime_dir: Path, command: tuple[str, ...]
) -> None:
    env = {"SKIPPY_ENGINE_UNRESPONSIVE_S": "soon"}
    result = run_cli(*command, env=env)
    assert result.code == 10, result.stderr
    assert "SKIPPY_ENGINE_UNRESPONSIVE_S='soon' is not a number above 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (runtime_dir / "runtime.json").exists()
    if command != ("runtime", "serve"):  # serve has no --json
        (record,) = ndjson_objects(run_cli(*command, "--json", env=env).stdout)
        assert record["reason_code"] == "invalid_configuration" and record["exit_code"] == 10


def test_a_command_that_uses_no_settings_is_not_refused_for_them(runtime_dir: Path) -> None:
    result = run_cli("events", "catalog", "--json", env={"SKIPPY_SERVING_EVENTS": "maybe"})
    assert result.code == 0, result.stderr
    assert result.records()


def test_the_api_key_comes_from_its_flag_else_from_its_setting(runtime_dir: Path) -> None:
    started = run_cli("runtime", "start", "--json", env={"SKIPPY_API_KEY": "from-the-env"})
    assert started.code == 0, started.stderr
    assert orjson.loads((runtime_dir / "runtime.json").read_bytes())["token"] == "from-the-env"
    stop_runtime(runtime_dir)
    flagged = run_cli(
        "runtime", "start", "--api-key", "from-the-flag", env={"SKIPPY_API_KEY": "from-the-env"}
    )
    assert flagged.code == 0, flagged.stderr
    assert orjson.loads((runtime_dir / "runtime.json").read_bytes())["token"] == "from-the-flag"
