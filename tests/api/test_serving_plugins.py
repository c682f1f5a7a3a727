"""Serving plugins in a real runtime: the C example plugin (built here with the C compiler)
proposes for `--spec plugin` loads of the successor model; the text is what decoding without
speculation gives, the receipt counts the accepted proposals, the plugin saw a complete commit
stream; a plugin that crashes or sleeps past every deadline costs nothing but its own
proposals."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Server, start_server, stop_server
from tests.plugins.conftest import EXAMPLES, FAULT_MODES, HERE, _cc

PROMPT = "the quick brown fox jumps over the lazy dog"
TOKENS = 160


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("built-plugins")
    built = {"ngram": _cc(EXAMPLES / "c" / "ngram_plugin.c", out / "ngram_plugin.so")}
    for name in ("crashy", "sleepy"):
        built[name] = _cc(
            HERE / "fault_plugin.c", out / f"{name}.so", f"-DFAULT_MODE={FAULT_MODES[name]}"
        )
    return built


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("record") / "stream.txt"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, record: Path) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("plugins-serve"), env={"SKIPPY_PLUGIN_RECORD": str(record)}
    )
    try:
        yield running
    finally:
        stop_server(running)


def _complete(server: Server, model: str) -> dict[str, Any]:
    with server.http(timeout=120) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0},
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        receipt = http.get(f"/api/runtime/requests/{answer.headers['x-request-id']}/receipt")
        assert receipt.status_code == 200, receipt.text
        body["receipt"] = receipt.json()
    return body


def _text(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["text"])


def _plugin_events(server: Server, model: str) -> list[dict[str, Any]]:
    return [
        e
        for e in server.events()
        if e["kind"].startswith("serving_plugin_") and e["scope"].get("model_id") == model
    ]


def test_plugin_proposals_speed_nothing_up_wrongly_and_see_the_whole_stream(
    server: Server, fixture_dir: Path, plugins: dict[str, Path], record: Path
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    assert server.load(model, alias="plain", lanes=1)["state"] == "available"
    loaded = server.load(
        model, alias="proposed", lanes=1, spec="plugin", plugins=[str(plugins["ngram"])]
    )
    assert loaded["state"] == "available"
    plain, proposed = _complete(server, "plain"), _complete(server, "proposed")
    assert _text(proposed) == _text(plain)  # byte-identical with speculation on and off
    figures = proposed["receipt"]["speculative"]
    assert figures["mode"] == "plugin"
    # The text repeats its cycle after the first pass: the plugin's lookups are accepted.
    assert figures["accepted"] >= TOKENS // 4 and figures["windows"] > 0, figures
    assert figures["accepted"] + figures["rejected"] == figures["proposed"]
    assert plain["receipt"]["speculative"]["proposed"] == 0

    loaded_events = [e for e in _plugin_events(server, "proposed")]
    assert [e["kind"] for e in loaded_events] == ["serving_plugin_loaded"], loaded_events
    assert loaded_events[0]["scope"]["plugin_id"] == "ngram_plugin.so"
    summary = [
        e
        for e in server.events()
        if e["kind"] == "speculation_summarized" and e["scope"].get("model_id") == "proposed"
    ]
    assert len(summary) == 1
    values = {s["key"]: s["value"] for s in summary[0]["numeric_summaries"]}
    assert values["spec_accepted_tokens"] == figures["accepted"]

    # The plugin's own record: one request, its runs contiguous from 0 to the last token.
    lines = [line.split() for line in record.read_text().splitlines()]
    requests = {line[1] for line in lines if line[0] == "begin"}
    assert len(requests) == 1
    expected = 0
    for line in lines:
        if line[0] in ("commit", "pending", "suffix"):
            start, count = int(line[2]), int(line[3])
            assert start == expected, line[:4]
            expected += count
    generated = int(next(line[2] for line in lines if line[0] == "finish"))
    assert expected == generated == proposed["usage"]["completion_tokens"]


def test_a_crashing_plugin_is_restarted_then_disabled_and_generation_carries_on(
    server: Server, fixture_dir: Path, plugins: dict[str, Path]
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    if "plain" not in (m["model_id"] for m in _models(server)):
        assert server.load(model, alias="plain", lanes=1)["state"] == "available"
    loaded = server.load(
        model, alias="crashy", lanes=1, spec="plugin", plugins=[str(plugins["crashy"])]
    )
    assert loaded["state"] == "available"
    plain = _text(_complete(server, "plain"))
    kinds: list[str] = []
    for _ in range(8):  # each request's first proposal query crashes the plugin's process
        assert _text(_complete(server, "crashy")) == plain
        kinds = [e["kind"] for e in _plugin_events(server, "crashy")]
        if "serving_plugin_disabled" in kinds:
            break
    assert kinds[0] == "serving_plugin_loaded"
    assert "serving_plugin_failed" in kinds and "serving_plugin_restarted" in kinds
    assert kinds[-1] == "serving_plugin_disabled", kinds
    failed = next(
        e for e in _plugin_events(server, "crashy") if e["kind"] == "serving_plugin_failed"
    )
    assert failed["reason_code"] == "process_crash"
    # The engine itself never died: the same engine serves on.
    assert _text(_complete(server, "crashy")) == plain
    assert not [e for e in server.events() if e["kind"] == "engine_process_exited"]


def test_a_plugin_that_misses_every_deadline_costs_only_its_proposals(
    server: Server, fixture_dir: Path, plugins: dict[str, Path]
) -> None:
    model = fixture_dir / "tiny-successor.gguf"
    loaded = server.load(
        model,
        alias="sleepy",
        lanes=1,
        spec="plugin",
        spec_deadline_ms=2,
        plugins=[str(plugins["sleepy"])],
    )
    assert loaded["state"] == "available"
    body = _complete(server, "sleepy")
    assert body["usage"]["completion_tokens"] == TOKENS
    figures = body["receipt"]["speculative"]
    assert figures["late"] > 0 and figures["accepted"] == 0, figures


def _models(server: Server) -> list[dict[str, Any]]:
    with server.http() as http:
        models: list[dict[str, Any]] = http.get("/api/runtime/state").json()["models"]
    return models


def test_no_sidecar_outlives_the_runtime(
    tmp_path: Path, fixture_dir: Path, plugins: dict[str, Path]
) -> None:
    running = start_server(tmp_path / "lifetime")
    try:
        loaded = running.load(
            fixture_dir / "tiny-successor.gguf", alias="p", plugins=[str(plugins["ngram"])]
        )
        assert loaded["state"] == "available"
        sidecars = [pid for pid in _sidecars() if running.process.pid in _ancestors(pid)]
        assert sidecars, "the plugin's sidecar process is running"
    finally:
        stop_server(running)
    alive = [pid for pid in sidecars if _alive(pid)]
    assert alive == []


def _sidecars() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"skippyctl.plugins.sidecar" in cmdline:
            found.append(int(entry.name))
    return found


def _ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status
