"""`POST /api/runtime/models/load` with stages: validation (400 naming the field) and a split
load over two local stages through the daemon, unloaded again (its stage workers reaped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Server, assert_openai_error, start_server, stop_server


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("stages"))
    try:
        yield running
    finally:
        stop_server(running)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stages": ["localhost:50052"]}, "stages"),
        ({"stages": ["127.0.0.1:0"]}, "stages"),
        ({"stages": ["127.0.0.1:5", "127.0.0.1:5"]}, "stages"),
        ({"stages": [f"127.0.0.1:{p}" for p in range(1, 18)]}, "stages"),
        ({"stages": "127.0.0.1:5"}, "stages"),
        ({"local_stages": 17}, "local_stages"),
        ({"local_stages": -1}, "local_stages"),
        ({"local_stages": 2, "local_stage_mem_mib": 0}, "local_stage_mem_mib"),
    ],
)
def test_bad_stage_fields_are_a_400_naming_the_field(
    runtime: Server, fixture_dir: Path, extra: dict[str, Any], param: str
) -> None:
    with runtime.http() as http:
        response = http.post(
            "/api/runtime/models/load", json={"model": str(fixture_dir / "tiny.gguf"), **extra}
        )
    error = assert_openai_error(response, 400)
    assert error["param"] == param, error
    assert error["reason_code"] == "invalid_configuration"


def test_a_split_load_over_local_stages_serves_and_its_unload_stops_them(
    runtime: Server, fixture_dir: Path
) -> None:
    answer = runtime.load(fixture_dir / "tiny.gguf", lanes=1, local_stages=2, alias="split")
    assert answer["state"] == "available", answer
    with runtime.http() as http:
        completion = http.post(
            "/v1/completions",
            json={"model": "split", "prompt": "hi", "max_tokens": 4, "temperature": 0},
        )
        assert completion.status_code == 200, completion.text
        assert http.post("/api/runtime/models/split/unload", json={}).status_code == 202
    events = runtime.events()
    names = [e["kind"] for e in events if e["category"] == "stage_topology"]
    for expected in ("stage_starting", "topology_assembling", "stage_loading", "topology_ready"):
        assert expected in names, names
    ready = next(e for e in events if e["kind"] == "topology_ready")
    assert ready["scope"]["model_id"] == "split"
    assert ready["scope"]["topology_id"].startswith("topology-")
    loading = [e for e in events if e["kind"] == "stage_loading"]
    counts = [{s["key"]: s["value"] for s in e["numeric_summaries"]} for e in loading]
    assert [c["layer_count"] for c in counts] == [1, 1]
    for event in events:
        assert "127.0.0.1" not in str(event)
