"""Tampered discovery files and unusual runtime directories end in a clear message and exit 3,
never a traceback; `--json` stdout stays JSON only; the runtime directory is chosen without
platformdirs' XDG warning and must be private when derived."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.cli.conftest import stop_runtime
from tests.cli.discovery_files import (
    SCRIPT,
    discovery_fields,
    run_script,
    stranger,
    write_discovery_file,
)
from tests.cli.helpers import CliResult, ndjson_objects

BAD_FILES: dict[str, bytes | dict[str, Any]] = {
    "not_json": b"{not json",
    "json_array": b"[1, 2]",
    "pid_string": discovery_fields(pid="123"),
    "pid_float": discovery_fields(pid=1.5),
    "pid_huge": discovery_fields(pid=2**40),
    "pid_missing": discovery_fields(drop=("pid",)),
    "url_number": discovery_fields(url=8750),
    "url_garbage": discovery_fields(url="not a url"),
    "url_scheme": discovery_fields(url="ftp://127.0.0.1:21"),
    "url_port": discovery_fields(url="http://127.0.0.1:99999"),
    "token_missing": discovery_fields(drop=("token",)),
    "token_number": discovery_fields(token=5),
    "token_newline": discovery_fields(token="a\nb"),
    "version_list": discovery_fields(version=[1]),
}


def _no_traceback(result: CliResult) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout


def _one_record(result: CliResult) -> dict[str, Any]:
    (record,) = ndjson_objects(result.stdout)
    return record


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_tampered_discovery_file_means_not_running_with_a_reason(
    isolated_runtime: Path, name: str
) -> None:
    path = write_discovery_file(isolated_runtime, BAD_FILES[name])
    status = run_script("runtime", "status", "--json")
    assert status.code == 3
    _no_traceback(status)
    record = _one_record(status)
    assert record["record"] == "runtime_status"
    assert record["running"] is False and record["state"] == "stopped"
    assert record["discovery"] == "corrupt", record
    assert record["detail"].startswith("the discovery file")
    assert str(isolated_runtime) not in status.stdout, "no absolute path in a JSON record"

    human = run_script("runtime", "status")
    assert human.code == 3 and human.stdout == ""
    _no_traceback(human)
    assert "runtime: stopped (corrupt discovery file: the discovery file" in human.stderr

    stop = run_script("runtime", "stop", "--json")
    assert stop.code == 3
    _no_traceback(stop)
    record = _one_record(stop)
    assert record["discovery"] == "corrupt" and record["removed"] is True
    assert not path.exists()


@pytest.mark.parametrize("name", ["pid_string", "url_garbage", "stranger"])
def test_ps_replaces_a_stale_or_corrupt_discovery_file(isolated_runtime: Path, name: str) -> None:
    with stranger() as process:
        content = discovery_fields(pid=process.pid) if name == "stranger" else BAD_FILES[name]
        path = write_discovery_file(isolated_runtime, content)
        result = run_script("ps", "--json")
        assert result.code == 0, result.stderr
        _no_traceback(result)
        assert _one_record(result)["record"] == "state"
        fresh = orjson.loads(path.read_bytes())
        assert fresh["pid"] != process.pid and fresh["boot_id"] and fresh["start_ticks"]
        assert process.poll() is None


COMMANDS = [
    ("runtime", "status"),
    ("runtime", "stop"),
    ("runtime", "start"),
    ("ps",),
    ("events",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_runtime_dir_that_is_a_regular_file_exits_3_with_a_message(
    isolated_runtime: Path, command: tuple[str, ...]
) -> None:
    isolated_runtime.parent.mkdir(parents=True, exist_ok=True)
    isolated_runtime.write_text("not a directory\n")
    result = run_script(*command, "--json")
    assert result.code == 3, result.stderr
    _no_traceback(result)
    record = _one_record(result)
    assert "not a directory" in (record.get("detail") or record.get("message") or ""), record
    assert str(isolated_runtime) not in result.stdout
    if command != ("runtime", "status"):  # status --json says it all in its record
        assert "not a directory" in result.stderr
    human = run_script(*command)
    assert human.code == 3 and "not a directory" in human.stderr
    _no_traceback(human)
    assert human.stdout == ""


def _unprivileged(args: list[str]) -> list[str]:
    """`args` run so that mode bits apply (root ignores them): drop the DAC capabilities."""
    if os.geteuid() != 0:
        return args
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a directory read-only")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", *args]


def _run_unprivileged(*args: str) -> CliResult:
    proc = subprocess.run(
        _unprivileged([str(SCRIPT), *args]),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@contextmanager
def _read_only(directory: Path) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o500)
    try:
        yield directory
    finally:
        directory.chmod(0o700)


def test_a_read_only_runtime_dir_cannot_start_a_runtime(isolated_runtime: Path) -> None:
    with _read_only(isolated_runtime):
        status = _run_unprivileged("runtime", "status", "--json")
        assert status.code == 3
        assert _one_record(status) == {
            "schema_version": 1,
            "record": "runtime_status",
            "state": "stopped",
            "running": False,
        }
        for command in (("ps",), ("runtime", "start")):
            result = _run_unprivileged(*command, "--json")
            assert result.code == 3, result.stderr
            _no_traceback(result)
            record = _one_record(result)
            assert record["record"] == "error" and record["exit_code"] == 3
            assert "not writable" in record["message"], record
            assert "not writable" in result.stderr
        assert list(isolated_runtime.iterdir()) == []


def test_a_stale_file_in_a_read_only_runtime_dir_is_explained(isolated_runtime: Path) -> None:
    path = write_discovery_file(isolated_runtime, discovery_fields())
    with _read_only(isolated_runtime):
        status = _run_unprivileged("runtime", "status", "--json")
        assert status.code == 3
        assert _one_record(status)["discovery"] == "stale"
        ps = _run_unprivileged("ps", "--json")
        assert ps.code == 3, ps.stderr
        _no_traceback(ps)
        record = _one_record(ps)
        assert "cannot be replaced" in record["message"], record
        assert "not running" in record["message"]
        stop = _run_unprivileged("runtime", "stop")
        assert stop.code == 3
        _no_traceback(stop)
        assert "could not remove the discovery file" in stop.stderr
    assert path.exists()


# -- the runtime directory without SKIPPY_RUNTIME_DIR ---------------------------------------------


@pytest.fixture
def derived_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No SKIPPY_RUNTIME_DIR, no XDG_RUNTIME_DIR, a private TMPDIR: returns that TMPDIR."""
    monkeypatch.delenv("SKIPPY_RUNTIME_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    return temp


def _run_user_is_private() -> bool:
    info = Path(f"/run/user/{os.geteuid()}")
    try:
        found = info.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid()


def test_no_xdg_warning_and_a_private_fallback_dir(derived_dir_env: Path) -> None:
    status = run_script("runtime", "status", "--json")
    assert status.code == 3
    assert "XDG_RUNTIME_DIR" not in status.stderr and "Warning" not in status.stderr
    assert status.stderr == ""
    if _run_user_is_private():
        pytest.skip("/run/user/<uid> exists here: the temporary fallback is not used")
    directory = derived_dir_env / f"runtime-{os.geteuid()}" / "skippyctl"
    try:
        started = run_script("runtime", "start", "--json")
        assert started.code == 0, started.stderr
        assert "XDG_RUNTIME_DIR" not in started.stderr and "Warning" not in started.stderr
        assert (directory / "runtime.json").exists()
        for level in (directory, directory.parent):
            info = level.lstat()
            assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        stopped = run_script("runtime", "stop")
        assert stopped.code == 0, stopped.stderr
        assert "XDG_RUNTIME_DIR" not in stopped.stderr
    finally:
        stop_runtime(directory)


def _unsafe(kind: str, directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    if kind == "group_readable":
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    elif kind == "symlink":
        target = directory.parent / "elsewhere"
        target.mkdir(mode=0o700)
        directory.symlink_to(target)
    elif kind == "regular_file":
        directory.write_text("")
    elif kind == "other_owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        directory.mkdir(mode=0o700)
        os.chown(directory, 54321, 54321)


UNSAFE = {
    "group_readable": "is mode 0755, not private",
    "symlink": "is a symbolic link",
    "regular_file": "is not a directory",
    "other_owner": "is owned by uid 54321",
}


@pytest.mark.parametrize("kind", UNSAFE)
def test_an_unsafe_derived_runtime_dir_is_refused(
    derived_dir_env: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    xdg = derived_dir_env.parent / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    _unsafe(kind, xdg / "skippyctl")
    status = run_script("runtime", "status", "--json")
    assert status.code == 3
    record = _one_record(status)
    assert record["running"] is False and record["discovery"] == "unusable_directory"
    assert UNSAFE[kind] in record["detail"]
    assert str(xdg) not in status.stdout
    ps = run_script("ps", "--json")
    assert ps.code == 3, ps.stderr
    _no_traceback(ps)
    assert UNSAFE[kind] in _one_record(ps)["message"]
    assert str(xdg / "skippyctl") in ps.stderr
    human = run_script("runtime", "status")
    assert human.code == 3 and UNSAFE[kind] in human.stderr
    assert not (xdg / "elsewhere" / "runtime.json").exists()
    assert not list(xdg.glob("**/runtime.json"))


def test_an_unsafe_temporary_fallback_parent_is_refused(derived_dir_env: Path) -> None:
    if _run_user_is_private():
        pytest.skip("/run/user/<uid> exists here: the temporary fallback is not used")
    parent = derived_dir_env / f"runtime-{os.geteuid()}"
    parent.mkdir(mode=0o777)
    parent.chmod(0o777)  # as another user could have pre-created it
    result = run_script("ps", "--json")
    assert result.code == 3, result.stderr
    _no_traceback(result)
    assert "its parent is mode 0777, not private" in _one_record(result)["message"]
    assert list(parent.iterdir()) == []


def test_a_symlinked_discovery_file_is_untrusted_and_replaced(
    isolated_runtime: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(orjson.dumps(discovery_fields()))
    isolated_runtime.mkdir(parents=True)
    (isolated_runtime / "runtime.json").symlink_to(target)
    status = run_script("runtime", "status", "--json")
    assert status.code == 3
    record = _one_record(status)
    assert record["discovery"] == "untrusted" and "symbolic link" in record["detail"]
    ps = run_script("ps", "--json")
    assert ps.code == 0, ps.stderr
    assert not (isolated_runtime / "runtime.json").is_symlink()
    assert orjson.loads(target.read_bytes()) == discovery_fields(), "the link's target is untouched"
