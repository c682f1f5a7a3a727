"""`skippyctl unload`: follows the unload to unload_completed; not loaded → 12."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import run_cli


def test_unload_follows_to_completed_then_reports_not_loaded(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    result = run_cli("unload", "tiny", "--json", "--drain-timeout", "5")
    assert result.code == 0, result.stderr
    events = result.events()
    assert events[0] == "unload_requested"
    assert events[-1] == "unload_completed"
    for record in result.records():
        assert {"schema_version", "event", "seq", "cursor", "ts", "summary"} <= set(record)
    assert "unloaded" in result.stderr

    again = run_cli("unload", "tiny", "--json")
    assert again.code == 12, again.stderr
    (record,) = again.records()
    assert set(record) == {
        "schema_version",
        "record",
        "command",
        "exit_code",
        "message",
        "reason_code",
    }
    assert record["record"] == "error" and record["exit_code"] == 12
    assert record["reason_code"] == "missing_artifact"
    human = run_cli("unload", "tiny")
    assert human.code == 12 and human.stdout == "" and "not loaded" in human.stderr
    spaced = run_cli("unload", "no such model", "--json")  # a path that must be encoded
    assert spaced.code == 12 and spaced.records()[0]["reason_code"] == "missing_artifact"
