"""`skippyctl ps` / `status`: the state document, as one JSON line or a table."""

from __future__ import annotations

from pathlib import Path

from tests.cli.helpers import run_cli

STATE_KEYS = {
    "schema_version",
    "record",
    "runtime",
    "native_mode",
    "node",
    "models",
    "topologies",
    "stages",
    "sessions",
    "requests",
    "devices",
    "event_system",
    "reducer",
}
MODEL_KEYS = {"model_id", "state", "lanes", "lanes_in_use", "queue_depth", "context_tokens"}


def test_ps_json_is_one_state_document_and_status_is_the_same(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf"), "--lanes", "2").code == 0
    result = run_cli("ps", "--json")
    assert result.code == 0, result.stderr
    records = result.records()
    assert len(records) == 1
    document = records[0]
    assert set(document) >= STATE_KEYS
    assert document["schema_version"] == 1 and document["record"] == "state"
    (model,) = document["models"]
    assert set(model) >= MODEL_KEYS
    assert model["model_id"] == "tiny" and model["state"] == "available" and model["lanes"] == 2
    alias = run_cli("status", "--json")
    assert alias.code == 0
    assert set(alias.records()[0]) == set(document)
    table = run_cli("ps")
    assert table.code == 0, table.stderr
    assert "tiny" in table.stdout and "available" in table.stdout
    assert "node" in table.stdout and "dropped" in table.stdout
