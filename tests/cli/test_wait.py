"""`skippyctl wait`: state first, then events; --fail-on ends it at once with the reason's code."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import run_cli

WAIT_KEYS = {
    "schema_version",
    "record",
    "outcome",
    "condition",
    "source",
    "exit_code",
    "elapsed_ms",
}


def test_fail_on_returns_the_reasons_code_not_the_timeout() -> None:
    assert run_cli("load", "/nope.gguf", "--no-wait").code == 0
    result = run_cli(
        "wait",
        "--for",
        "model_available=nope",
        "--fail-on",
        "model_load_failed=nope",
        "--timeout",
        "60",
        "--json",
    )
    assert result.code == 12, result.stderr  # missing_artifact, not 124
    (record,) = result.records()
    assert set(record) >= WAIT_KEYS
    assert record["outcome"] == "failed" and record["condition"] == "model_load_failed=nope"
    assert record["reason_code"] == "missing_artifact"


def test_for_matches_current_state_and_timeout_is_124(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    result = run_cli("wait", "--for", "model_available=tiny", "--for", "node_accepting", "--json")
    assert result.code == 0, result.stderr
    (record,) = result.records()
    assert set(record) >= WAIT_KEYS
    assert record["outcome"] == "matched" and record["source"] == "state"
    # event conditions only match new events: nothing happens within the timeout
    late = run_cli("wait", "--for", "event=model_available@tiny", "--timeout", "0.5", "--json")
    assert late.code == 124, late.stderr
    assert late.records()[0]["outcome"] == "timeout"
    # not loaded counts as unavailable
    gone = run_cli("wait", "--for", "model_unavailable=other", "--timeout", "5")
    assert gone.code == 0, gone.stderr


def test_model_waits_for_it_to_serve_or_fails_with_its_loads_reason(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    served = run_cli("wait", "--model", "tiny", "--json")
    assert served.code == 0, served.stderr
    assert served.records()[0]["condition"] == "model_available=tiny"
    assert run_cli("load", "/absent.gguf", "--no-wait").code == 0
    failed = run_cli("wait", "--model", "absent", "--timeout", "60", "--json")
    assert failed.code == 12, failed.stderr  # missing_artifact
    assert failed.records()[0]["condition"] == "model_load_failed=absent"


def test_bad_conditions_are_usage_errors() -> None:
    for args in (
        ["--for", "bogus"],
        ["--for", "event=not_an_event"],
        ["--for", "model_available"],
        [],
    ):
        result = run_cli("wait", *args)
        assert result.code == 2, (args, result.stderr)
        assert result.stdout == ""
