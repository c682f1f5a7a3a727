"""`skippyctl events`: replay what the runtime retained, resume from a cursor, filter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.helpers import ndjson_objects, run_cli

RECORD_KEYS = {"schema_version", "event", "category", "severity", "ts", "seq", "cursor", "summary"}


def test_replay_resume_and_filters(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    everything = run_cli("events", "--json")
    assert everything.code == 0, everything.stderr
    records = everything.records()
    assert records, everything.stderr
    for record in records:
        assert set(record) >= RECORD_KEYS, record
    assert "model_available" in everything.events()
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(seqs)
    last = records[-1]["cursor"]
    assert f"resume with --since {last}" in everything.stderr

    # resuming from the last cursor: nothing old comes back, new events do (a rate-limited
    # health report such as events_coalesced may already be new here: it is not "old")
    again = run_cli("events", "--since", last, "--json")
    assert again.code == 0, again.stderr
    assert all(r["seq"] > records[-1]["seq"] for r in again.records())
    assert "model_available" not in again.events()
    assert run_cli("unload", "tiny").code == 0
    resumed = run_cli("events", "--since", last, "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.records()
    assert all(r["seq"] > records[-1]["seq"] for r in resumed.records())
    assert "unload_completed" in resumed.events()

    only = run_cli("events", "--event", "model_available", "--event", "unload_completed", "--json")
    assert set(only.events()) == {"model_available", "unload_completed"}
    loading = run_cli("events", "--category", "model_loading", "--model", "tiny", "--json")
    assert loading.records()
    assert all(
        r["category"] == "model_loading" and r["model_id"] == "tiny" for r in loading.records()
    )
    recent = run_cli("events", "--since", "10m", "--json")
    assert len(recent.records()) >= len(records)
    human = run_cli("events", "--event", "model_available")
    assert human.code == 0 and "model_available" in human.stdout


def test_unknown_filters_are_usage_errors_listing_valid_values() -> None:
    bad_event = run_cli("events", "--event", "no_such_event")
    assert bad_event.code == 2
    assert "model_available" in bad_event.stderr
    bad_category = run_cli("events", "--category", "nope")
    assert bad_category.code == 2
    assert "model_loading" in bad_category.stderr
    assert run_cli("events", "--since", "yesterday").code == 2


def test_limit_prints_at_most_n_events_then_exits_0(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    everything = run_cli("events", "--json")
    assert len(everything.records()) > 2, everything.stderr
    two = run_cli("events", "--limit", "2", "--json")
    assert two.code == 0, two.stderr
    assert two.records() == everything.records()[:2]
    assert f"2 event(s); resume with --since {two.records()[-1]['cursor']}" in two.stderr
    # --follow stops at the N-th shown event (here from the replay: it never waits for more)
    followed = run_cli(
        "events", "--follow", "--event", "model_available", "--limit", "1", "--json", timeout=60
    )
    assert followed.code == 0, followed.stderr
    assert followed.events() == ["model_available"]
    human = run_cli("events", "-n", "1")
    assert human.code == 0 and len(human.stdout.splitlines()) == 1


def test_follow_with_limit_exits_after_the_nth_event(fixture_dir: Path) -> None:
    """Without --limit this follower would run until killed; with it, it ends after the
    unload's terminal (whether it saw it live or in the replay, if it attached late)."""
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    command = [sys.executable, "-m", "skippyctl", "events", "--follow", "--json"]
    follower = subprocess.Popen(
        [*command, "--event", "unload_completed", "--limit", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert run_cli("unload", "tiny").code == 0
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
        follower.wait()
    assert follower.returncode == 0, err
    assert [r["event"] for r in ndjson_objects(out)] == ["unload_completed"]


def test_limit_must_be_at_least_1() -> None:
    for value in ("0", "-3", "x"):
        result = run_cli("events", "--limit", value)
        assert result.code == 2, result.stderr
        assert "--limit" in result.stderr
    assert "--limit" in run_cli("events", "--help").stdout
