"""The fleet file (skippyctl/config/fleet.py) and `skippyctl fleet add|rm|list`: entries are
checked, keys are named and never written, every refusal has its reason code."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from skippyctl.config.fleet import (
    LOCAL_NODE,
    Fleet,
    FleetEntry,
    FleetError,
    parse_fleet,
    read_fleet,
    render_fleet,
    write_fleet,
)
from tests.cli.helpers import run_cli


def reason(text: str) -> str:
    with pytest.raises(FleetError) as caught:
        parse_fleet(text)
    return caught.value.reason


def test_a_written_fleet_reads_back_as_it_was(tmp_path: Path) -> None:
    fleet = Fleet(
        (
            FleetEntry(
                "gpu1",
                "https://10.0.0.5:8421",
                key_file=Path("/k/gpu1.key"),
                cert=Path("/k/gpu1.pem"),
            ),
            FleetEntry("b-2", "http://127.0.0.1:9001", key_env="B_KEY"),
            FleetEntry("open", "http://[::1]:9002"),
        )
    )
    path = tmp_path / "conf" / "fleet.toml"
    write_fleet(fleet, path)
    assert read_fleet(path) == fleet
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_fleet(path).names() == (LOCAL_NODE, "gpu1", "b-2", "open")


def test_a_missing_file_is_an_empty_fleet_of_the_local_runtime(tmp_path: Path) -> None:
    fleet = read_fleet(tmp_path / "absent.toml")
    assert fleet.entries == ()
    assert fleet.names() == (LOCAL_NODE,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes = 3", "fleet_file_invalid"),
        ("[nodes.a]\nurl = ", "fleet_file_invalid"),
        ("[other]\nx = 1", "fleet_file_invalid"),
        ('[nodes.a]\nurl = "http://h:1"\nkey = "secret"', "fleet_key_inline"),
        ('[nodes.a]\nurl = "http://h:1"\ntoken = "secret"', "fleet_key_inline"),
        ('[nodes.a]\nurl = "ftp://h:1"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://user:pw@h:1"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h:1/?k=v"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h:99999"', "fleet_entry_invalid"),
        ('[nodes.A]\nurl = "http://h:1"', "fleet_entry_invalid"),
        ('[nodes.local]\nurl = "http://h:1"', "fleet_name_reserved"),
        ('[nodes.a]\nurl = "http://h:1"\nkey_file = "/k"\nkey_env = "K"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h:1"\nkey_env = "not a name"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h:1"\ncert = "/c.pem"', "fleet_entry_invalid"),
        ('[nodes.a]\nurl = "http://h:1"\nport = 3', "fleet_entry_invalid"),
        ("[nodes.a]\nurl = 3", "fleet_entry_invalid"),
        ("[nodes]\na = 1", "fleet_entry_invalid"),
    ],
)
def test_a_bad_file_or_entry_is_refused_with_its_reason(text: str, expected: str) -> None:
    assert reason(text) == expected


def test_a_key_is_read_from_its_file_or_variable_and_never_rendered(tmp_path: Path) -> None:
    key_file = tmp_path / "b.key"
    key_file.write_text("file-secret\n")
    by_file = FleetEntry("b", "http://h:1", key_file=key_file)
    by_env = FleetEntry("c", "http://h:2", key_env="C_KEY")
    assert by_file.read_key() == "file-secret"
    assert by_env.read_key({"C_KEY": " env-secret "}) == "env-secret"
    assert FleetEntry("d", "http://h:3").read_key() is None
    text = render_fleet(Fleet((by_file, by_env)))
    assert "secret" not in text
    with pytest.raises(FleetError) as unset:
        by_env.read_key({})
    assert unset.value.reason == "fleet_key_unavailable"
    key_file.unlink()
    with pytest.raises(FleetError) as missing:
        by_file.read_key()
    assert missing.value.reason == "fleet_key_unavailable"
    assert str(key_file) not in str(missing.value)


def test_strange_strings_survive_the_file(tmp_path: Path) -> None:
    odd = FleetEntry("odd", "http://h:1", key_file=Path('/k/a "quoted"\\path\tx'))
    path = tmp_path / "fleet.toml"
    write_fleet(Fleet((odd,)), path)
    assert read_fleet(path).entries == (odd,)


def test_fleet_add_list_rm_as_a_user(tmp_path: Path) -> None:
    env = {"SKIPPY_FLEET_FILE": str(tmp_path / "fleet.toml")}
    key = tmp_path / "b.key"
    key.write_text("k")
    added = run_cli(
        "fleet", "add", "b", "http://127.0.0.1:9001", "--key-file", str(key), "--json", env=env
    )
    assert added.code == 0, added.stderr
    assert added.records()[0] | {"schema_version": 1} == {
        "schema_version": 1,
        "record": "fleet_node",
        "node": "b",
        "url": "http://127.0.0.1:9001",
        "key_source": "file",
        "tls": False,
        "cert": False,
    }
    again = run_cli("fleet", "add", "b", "http://127.0.0.1:9009", "--json", env=env)
    assert again.code == 10
    assert again.records()[0]["reason_code"] == "fleet_node_exists"
    replaced = run_cli(
        "fleet", "add", "b", "http://127.0.0.1:9009", "--key-env", "B_KEY", "--replace", env=env
    )
    assert replaced.code == 0, replaced.stderr
    listed = run_cli("fleet", "list", "--json", env=env)
    assert [(r["node"], r["url"], r["key_source"]) for r in listed.records()] == [
        ("local", None, "discovery"),
        ("b", "http://127.0.0.1:9009", "env:B_KEY"),
    ]
    shown = run_cli("fleet", "list", env=env)
    assert "b" in shown.stdout and "env:B_KEY" in shown.stdout and shown.code == 0
    for name, code in (("local", "fleet_name_reserved"), ("zz", "fleet_node_unknown")):
        refused = run_cli("fleet", "rm", name, "--json", env=env)
        assert refused.code == 10
        assert refused.records()[0]["reason_code"] == code
    removed = run_cli("fleet", "rm", "b", "--json", env=env)
    assert removed.code == 0 and removed.records() == [
        {"schema_version": 1, "record": "fleet_node_removed", "node": "b"}
    ]
    assert [r["node"] for r in run_cli("fleet", "list", "--json", env=env).records()] == ["local"]


def test_a_broken_fleet_file_ends_a_command_with_exit_10(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[nodes.a]\nurl = "http://h:1"\napi_key = "s3cret"\n')
    result = run_cli("ps", "--fleet", "--json", env={"SKIPPY_FLEET_FILE": str(path)})
    assert result.code == 10
    (record,) = result.records()
    assert record["reason_code"] == "fleet_key_inline"
    assert "s3cret" not in result.stdout + result.stderr
    unknown = run_cli(
        "load",
        "x.gguf",
        "--node",
        "nope",
        "--json",
        env={"SKIPPY_FLEET_FILE": str(tmp_path / "none.toml")},
    )
    assert unknown.code == 10
    assert unknown.records()[-1]["reason_code"] == "fleet_node_unknown"


def test_a_pinned_certificate_must_be_one(tmp_path: Path) -> None:
    import trustme

    env = {"SKIPPY_FLEET_FILE": str(tmp_path / "fleet.toml")}
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "not-a-cert.pem").write_text("hello")
    for cert, code in (("ca.pem", 0), ("not-a-cert.pem", 10), ("absent.pem", 10)):
        result = run_cli(
            "fleet",
            "add",
            "n" + str(code) + cert[0],
            "https://127.0.0.1:9",
            "--cert",
            str(tmp_path / cert),
            "--json",
            env=env,
        )
        assert result.code == code, result.stderr
        if code:
            assert result.records()[0]["reason_code"] == "fleet_cert_unreadable"
            assert str(tmp_path) not in result.stdout
    listed = run_cli("fleet", "list", "--json", env=env).records()
    assert [(r["node"], r["cert"]) for r in listed] == [("local", False), ("n0c", True)]
