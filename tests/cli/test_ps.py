"""`skippyctl ps` / `status`: the state document, as one JSON line or a table."""

from __future__ import annotations

import os
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
    # A runtime with nothing to load on demand: no loadable section.
    assert document["loadable_models"] == []
    assert "loadable" not in table.stdout


def test_ps_shows_a_split_models_topology_in_its_table_and_its_json(fixture_dir: Path) -> None:
    """A real split load over 2 local stages (daemon-backed), then `ps` and `ps --json`."""
    loaded = run_cli("load", str(fixture_dir / "tiny.gguf"), "--lanes", "1", "--local-stages", "2")
    assert loaded.code == 0, loaded.stderr
    (document,) = run_cli("ps", "--json").records()
    (model,) = document["models"]
    topology_id = model["topology_id"]
    (topology,) = [t for t in document["topologies"] if t["topology_id"] == topology_id]
    assert topology["state"] == "ready" and topology["model_id"] == "tiny"
    assert (topology["stages"], topology["layers"]) == (2, 2)
    stages = sorted(
        (s for s in document["stages"] if s["topology_id"] == topology_id),
        key=lambda s: s["stage_index"],
    )
    assert topology["stage_ids"] == [s["stage_id"] for s in stages]
    assert [(s["stage_index"], s["layer_start"], s["layer_count"]) for s in stages] == [
        (0, 0, 1),
        (1, 1, 1),
    ]
    for stage in stages:
        assert stage["state"] == "ready"
        assert stage["planned_bytes"] > 0 and stage["offered_bytes"] >= stage["planned_bytes"]
        assert stage["stage_id"].startswith("stage-")
    assert "127.0.0.1" not in str(document) and str(fixture_dir) not in str(document)

    table = run_cli("ps")
    assert table.code == 0, table.stderr
    out = table.stdout
    assert f"tiny ▸ {topology_id} ready · 2 stage(s) · 2 layers" in out
    for stage in stages:
        (line,) = [row for row in out.splitlines() if stage["stage_id"] in row]
        cells = line.split()
        assert cells[:3] == [
            f"#{stage['stage_index']}",
            stage["stage_id"],
            str(stage["layer_start"]),
        ]
        assert " / " in line and "ready" in line
        assert line.rstrip().endswith(" ms") and " ±" in line  # the engine's link figures
    assert "127.0.0.1" not in out.split("\n", 1)[1]  # the first line is the runtime's own URL


def test_a_loads_options_reach_the_engine_the_state_and_ps(fixture_dir: Path) -> None:
    """`--threads` (an option of the table, like any other): the engine decodes with it, as
    llama.cpp reports it, and the state document and `ps` state what the load asked for."""
    loaded = run_cli(
        "load", str(fixture_dir / "tiny.gguf"), "--threads", "1", "--lanes", "2", "--json"
    )
    assert loaded.code == 0, loaded.stderr
    records = {r["event"]: r for r in loaded.records()}
    assert records["model_load_requested"]["settings"] == {"lanes": 2, "threads": 1}
    assert records["serving_backend_initialization_completed"]["summaries"]["threads"] == 1
    (document,) = run_cli("ps", "--json").records()
    (model,) = document["models"]
    assert model["settings"] == {"lanes": 2, "threads": 1}
    table = run_cli("ps")
    assert "tiny options: lanes=2 threads=1" in table.stdout, table.stdout


def test_ps_lists_the_models_the_runtime_may_load_on_demand(
    tmp_path: Path, fixture_dir: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(fixture_dir / "tiny.gguf", models / "shelved.gguf")
    presets = tmp_path / "presets.toml"
    tiny = fixture_dir / "tiny.gguf"
    presets.write_text(
        f'[models.held]\nmodel = "{tiny}"\npinned = true\n\n'
        f'[models.brief]\nmodel = "{tiny}"\nttl = 90\n'
    )
    started = run_cli(
        "runtime", "start", "--models-dir", str(models), "--presets", str(presets), "--json"
    )
    assert started.code == 0, started.stderr
    (document,) = run_cli("ps", "--json").records()
    assert document["models"] == []
    assert document["loadable_models"] == [
        {"model_id": "held", "source": "preset", "pinned": True},
        {"model_id": "brief", "source": "preset", "pinned": False, "idle_ttl_s": 90},
        {"model_id": "shelved", "source": "models_dir", "pinned": False},
    ]
    table = run_cli("ps")
    assert table.code == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()]
    start = rows.index(["loadable", "source", "pinned", "idle", "ttl"])
    assert rows[start + 1 : start + 4] == [
        ["held", "preset", "yes", "never"],
        ["brief", "preset", "-", "1m30s"],
        ["shelved", "models_dir", "-", "never"],
    ]
    assert str(models) not in table.stdout and str(tiny) not in table.stdout
