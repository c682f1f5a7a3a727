"""The one run the log-coverage tests share (package docstring): a real runtime with llama.cpp's
raw log captured loads ``LOADS`` (one lane of ``CONTEXT_TOKENS`` each), generates a few tokens
on each, and every model's log lines and events become a :class:`Run`; ``results`` is each
fact's evidence over those runs. Package-scoped: the runtime starts once for every test
module here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest

from tests.api.conftest import Server, start_server, stop_server
from tests.api.log_coverage.evidence import Evidence, Run, evidence_of
from tests.api.log_coverage.facts import FACTS

CONTEXT_TOKENS: Final = 256
LOADS: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "tiny": ("tiny.gguf", {}),
    "split": ("tiny-split-00001-of-00003.gguf", {}),
    "gpu": ("tiny.gguf", {"gpu_layers": 99}),
}
"""Model id → (fixture file, extra load fields)."""


@pytest.fixture(scope="package")
def runs(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> dict[str, Run]:
    server = start_server(
        tmp_path_factory.mktemp("log-coverage"), env={"SKIPPY_CAPTURE_NATIVE_LOG": "1"}
    )
    try:
        return _collect(server, fixture_dir)
    finally:
        stop_server(server)


def _collect(server: Server, fixture_dir: Path) -> dict[str, Run]:
    for model_id, (name, extra) in LOADS.items():
        answer = server.load(
            fixture_dir / name, alias=model_id, lanes=1, ctx=CONTEXT_TOKENS, **extra
        )
        assert answer["state"] == "available", answer
    with server.http() as http:
        for model_id in LOADS:
            body = {"model": model_id, "prompt": "a b", "max_tokens": 4, "temperature": 0}
            assert http.post("/v1/completions", json=body).status_code == 200
        log = http.get("/api/runtime/diagnostics/native-log", params={"limit": 4096}).json()
    events = server.events()
    lines = {engine["model_id"]: engine for engine in log["engines"]}
    assert set(lines) == set(LOADS), lines.keys()
    runs = {}
    for model_id in LOADS:
        engine = lines[model_id]
        # The whole log from the first line: a ring that dropped the start would hide facts.
        assert engine["cut"] == 0 and engine["lines"][0].startswith("llama_model_loader:")
        mine = tuple(e for e in events if e["scope"].get("model_id") == model_id)
        runs[model_id] = Run(model_id, tuple(engine["lines"]), mine)
    return runs


@pytest.fixture(scope="package")
def results(runs: dict[str, Run]) -> dict[str, Evidence]:
    return {fact.key: evidence_of(fact, runs) for fact in FACTS}
