"""`skippyctl tune`: real loads of each candidate in a real runtime, the best written as the
model's preset, and a runtime serving that presets file loads the model with it on demand."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson

from tests.cli.helpers import run_cli


def _settings_of(url: str, token: str, model: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": model, "prompt": "hi", "max_tokens": 2, "temperature": 0},
        )
        assert answer.status_code == 200, answer.text
        state = http.get("/api/runtime/state").json()
    entry = next(m for m in state["models"] if m["model_id"] == model)
    settings: dict[str, object] = entry.get("settings", {})
    return settings


def test_tune_measures_each_candidate_and_the_next_on_demand_load_uses_its_preset(
    fixture_dir: Path, tmp_path: Path, isolated_runtime: Path
) -> None:
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[models.tiny]\nmodel = "{fixture_dir / "tiny.gguf"}"\nlanes = 3\n')
    started = run_cli("runtime", "start", "--presets", str(presets), "--json")
    assert started.code == 0, started.stderr
    status = orjson.loads(started.stdout)
    token = orjson.loads((isolated_runtime / "runtime.json").read_bytes())["token"]
    result = run_cli(
        "tune",
        str(fixture_dir / "tiny.gguf"),
        "--threads",
        "1",
        "--lanes",
        "1,2",
        "--apply",
        str(presets),
        "--json",
    )
    assert result.code == 0, result.stderr
    records = result.records()
    candidates = [r for r in records if r["record"] == "tune_candidate"]
    assert [(c["threads"], c["lanes"]) for c in candidates] == [(1, 1), (1, 2)]
    assert all(c["decode_tokens_per_s"] > 0 and c["prefill_tokens_per_s"] > 0 for c in candidates)
    (final,) = [r for r in records if r["record"] == "tune_result"]
    fastest = max(candidates, key=lambda c: c["decode_tokens_per_s"])
    assert final["best"]["lanes"] == fastest["lanes"]  # the best it measured
    assert final["applied_to"] == "presets.toml"
    written = presets.read_text()
    assert f"lanes = {fastest['lanes']}" in written and "threads = 1" in written
    # The runtime reads the file again: its next on-demand load of "tiny" is the tuned one.
    time.sleep(0.05)
    settings = _settings_of(status["url"], token, "tiny")
    assert settings.get("lanes") == fastest["lanes"] and settings.get("threads") == 1


def test_tune_refuses_what_it_cannot_measure(tmp_path: Path) -> None:
    missing = run_cli("tune", str(tmp_path / "absent.gguf"), "--json")
    assert missing.code == 12, missing.stderr
    assert missing.records()[0]["record"] == "error"
    bad = run_cli("tune", str(tmp_path / "absent.gguf"), "--lanes", "0")
    assert bad.code == 2
