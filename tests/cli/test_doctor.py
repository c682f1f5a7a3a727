"""`skippyctl doctor`: findings with a fix each; never starts a runtime."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import run_cli

FINDING_KEYS = {"schema_version", "record", "check", "status", "detail", "fix"}


def test_doctor_without_and_with_a_runtime(isolated_runtime: Path) -> None:
    result = run_cli("doctor", "--json")
    assert result.code == 3, result.stderr  # no errors, but no runtime (and none started)
    records = result.records()
    findings = [r for r in records if r["record"] == "finding"]
    assert all(set(r) == FINDING_KEYS for r in findings)
    assert all(r["status"] in ("ok", "warning", "error") for r in findings)
    checks = {r["check"] for r in findings}
    assert {"native_library", "llama_cpp", "devices", "discovery", "runtime"} <= checks
    assert records[-1]["record"] == "doctor_summary" and records[-1]["exit_code"] == 3
    assert not (isolated_runtime / "runtime.json").exists()

    assert run_cli("runtime", "start").code == 0
    running = run_cli("doctor", "--json")
    assert running.code == 0, running.stdout
    runtime = next(r for r in running.records() if r.get("check") == "runtime")
    assert runtime["status"] == "ok"
    human = run_cli("doctor")
    assert human.code == 0 and "native_library" in human.stdout
