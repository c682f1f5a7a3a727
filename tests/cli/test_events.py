"""`skippyctl events`: replay what the runtime retained, resume from a cursor, filter."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import run_cli

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
