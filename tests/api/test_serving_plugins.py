"""Serving plugins in a real runtime: the C example plugin (built here with the C compiler) and
the Python one (a real entry point on the runtime's PYTHONPATH) propose for `--spec plugin`
loads of the successor model; the text is what decoding without speculation gives, the receipt
counts the accepted proposals, the plugin saw a complete commit stream, also with two lanes
serving concurrent sessions; a plugin that crashes or sleeps past every deadline costs nothing
but its own proposals."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.load_options import MAX_PROPOSAL_DEADLINE_MS
from tests.api.conftest import Server, start_server, stop_server
from tests.plugins.conftest import (
    EXAMPLES,
    FAULT_MODES,
    HERE,
    _cc,
    plugin_path,
    read_streams,
    write_entry_points,
)

PROMPT = "the quick brown fox jumps over the lazy dog"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOKENS = 160


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("built-plugins")
    built = {"ngram": _cc(EXAMPLES / "c" / "ngram_plugin.c", out / "ngram_plugin.so")}
    for name in ("crashy", "sleepy", "garbage"):
        built[name] = _cc(
            HERE / "fault_plugin.c", out / f"{name}.so", f"-DFAULT_MODE={FAULT_MODES[name]}"
        )
    return built


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("record") / "stream.txt"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, record: Path) -> Iterator[Server]:
    # The engines' sidecars inherit the runtime's environment: the test entry points (the
    # Python example among them) are found through PYTHONPATH as for an installed package.
    entry_points = write_entry_points(tmp_path_factory.mktemp("site"))
    running = start_server(
        tmp_path_factory.mktemp("plugins-serve"),
        env={
            "SKIPPY_PLUGIN_RECORD": str(record),
            "PYTHONPATH": plugin_path(entry_points),
            # Concurrent requests overlap for sure when a step takes a few ms.
            "SKIPPY_TEST_DECODE_DELAY_MS": "3",
        },
    )
    try:
        yield running
    finally:
        stop_server(running)


def _complete(server: Server, model: str, prompt: str = PROMPT) -> dict[str, Any]:
    with server.http(timeout=120) as http:
        answer = http.post(
            "/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0},
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        receipt = http.get(f"/api/runtime/requests/{answer.headers['x-request-id']}/receipt")
        assert receipt.status_code == 200, receipt.text
        body["receipt"] = receipt.json()
    return body


def _serving(server: Server, alias: str, lanes: int = 1, **options: Any) -> None:
    """The successor model loaded as ``alias`` (once per module: a later test reuses it)."""
    if alias in (m["model_id"] for m in _models(server)):
        return
    model = FIXTURES / "tiny-successor.gguf"
    options.setdefault("spec", "off")  # "plain": one token a step, to compare with
    assert server.load(model, alias=alias, lanes=lanes, **options)["state"] == "available"


def _plugged(server: Server, alias: str, plugin: str, lanes: int = 1, **options: Any) -> None:
    """The successor model as ``alias`` with ``--spec plugin`` and ``plugin``, waiting for the
    proposals up to the longest deadline unless told otherwise: on a loaded machine a sidecar
    can miss the default 8 ms, and these tests count proposals, not latency."""
    options.setdefault("spec_deadline_ms", MAX_PROPOSAL_DEADLINE_MS)
    _serving(server, alias, lanes, spec="plugin", plugins=[plugin], **options)


def _text(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["text"])


def _plugin_events(server: Server, model: str, observed: bool = False) -> list[dict[str, Any]]:
    """The model's ``serving_plugin_*`` events; the counters (``serving_plugin_observed``, sent
    as they change) only when ``observed``."""
    return [
        e
        for e in server.events()
        if e["kind"].startswith("serving_plugin_")
        and e["scope"].get("model_id") == model
        and observed == (e["kind"] == "serving_plugin_observed")
    ]


def test_plugin_proposals_speed_nothing_up_wrongly_and_see_the_whole_stream(
    server: Server, fixture_dir: Path, plugins: dict[str, Path], record: Path
) -> None:
    record.write_text("")  # the plugins append (O_APPEND): this test's streams only
    _serving(server, "plain")
    _plugged(server, "proposed", str(plugins["ngram"]))
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

    # The plugin's own record: one request, its runs contiguous from 0 to the last token
    # (read_streams checks each run starts where the last ended).
    (stream,) = read_streams(record).values()
    assert stream.finished and not stream.aborted
    completion = proposed["usage"]["completion_tokens"]
    assert len(stream.tokens) == stream.generated == completion


def test_run_ahead_windows_from_the_c_plugin_keep_the_text(
    server: Server, fixture_dir: Path, plugins: dict[str, Path]
) -> None:
    _serving(server, "plain")
    _plugged(server, "ahead", str(plugins["ngram"]), spec_runahead_tokens=32)
    ahead, plain = _complete(server, "ahead"), _complete(server, "plain")
    assert _text(ahead) == _text(plain)
    figures = ahead["receipt"]["speculative"]
    assert figures["accepted"] >= TOKENS // 4, figures
    # The successor text is one cycle: a lookup past the window is right, nothing is stale.
    assert (figures["rejected"], figures["discarded"]) == (0, 0), figures
    with server.http() as http:
        refused = http.post(
            "/api/runtime/models/load",
            json={
                "model": str(fixture_dir / "tiny-successor.gguf"),
                "alias": "too-far",
                "spec_runahead_tokens": 999,
            },
        )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "spec_runahead_tokens"


def test_the_built_in_ngram_plugin_runs_by_its_entry_point_and_in_the_engine(
    server: Server,
) -> None:
    """``--plugin ngram`` (the project's entry point, in a sidecar) and ``--spec ngram`` (the
    same plugin class in the engine process, here with run-ahead) speculate on the successor
    model without changing its text."""
    _serving(server, "plain")
    _plugged(server, "builtin", "ngram")
    _serving(server, "inproc", spec="ngram", spec_runahead_tokens=32)
    plain = _text(_complete(server, "plain"))
    for model, mode in (("builtin", "plugin"), ("inproc", "ngram")):
        body = _complete(server, model)
        assert _text(body) == plain, model
        figures = body["receipt"]["speculative"]
        assert figures["mode"] == mode
        assert figures["accepted"] >= TOKENS // 4, (model, figures)
        assert (figures["rejected"], figures["discarded"]) == (0, 0), (model, figures)
    loaded = _plugin_events(server, "builtin")
    assert [(e["kind"], e["scope"]["plugin_id"]) for e in loaded] == [
        ("serving_plugin_loaded", "ngram")
    ]
    # Part of the load: it carries the load's operation (so `load --json` shows it).
    (requested,) = [
        e
        for e in server.events()
        if e["kind"] == "model_load_requested" and e["scope"].get("model_id") == "builtin"
    ]
    assert loaded[0]["operation"]["root"] == requested["operation"]["root"]
    # In the engine process: no sidecar, so no plugin events.
    assert _plugin_events(server, "inproc") == []


def test_the_python_example_sees_complete_streams_from_two_lanes_at_once(
    server: Server, fixture_dir: Path, record: Path
) -> None:
    record.write_text("")
    _plugged(server, "py", "ngram-py", lanes=2)
    kinds = [e["kind"] for e in _plugin_events(server, "py")]
    assert kinds == ["serving_plugin_loaded"], kinds
    _serving(server, "plain2", lanes=2)
    prompts = (PROMPT, "a b c d e f g h")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        proposed = list(pool.map(lambda p: _complete(server, "py", p), prompts))
    plain = [_complete(server, "plain2", p) for p in prompts]
    assert [_text(b) for b in proposed] == [_text(b) for b in plain]
    assert all(b["receipt"]["speculative"]["accepted"] > 0 for b in proposed)
    # The two requests shared decode steps (both lanes in one batch, proposals and all).
    assert any(b["receipt"]["max_batch"] == 2 for b in proposed), [
        b["receipt"]["max_batch"] for b in proposed
    ]
    streams = read_streams(record)
    assert len(streams) == 2
    assert sorted(len(s.tokens) for s in streams.values()) == sorted(
        b["usage"]["completion_tokens"] for b in proposed
    )
    assert all(s.finished and len(s.tokens) == s.generated for s in streams.values())


def test_a_crashing_plugin_is_restarted_then_disabled_and_generation_carries_on(
    server: Server, fixture_dir: Path, plugins: dict[str, Path]
) -> None:
    _serving(server, "plain")
    _plugged(server, "crashy", str(plugins["crashy"]))
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
    _plugged(server, "sleepy", str(plugins["sleepy"]), spec_deadline_ms=2)
    body = _complete(server, "sleepy")
    assert body["usage"]["completion_tokens"] == TOKENS
    figures = body["receipt"]["speculative"]
    assert figures["late"] > 0 and figures["accepted"] == 0, figures
    # Late is a discard, not a failure (the plugin contract): never failed, never disabled.
    body = _complete(server, "sleepy")
    assert body["receipt"]["speculative"]["late"] > 0
    kinds = [e["kind"] for e in _plugin_events(server, "sleepy")]
    assert kinds == ["serving_plugin_loaded"], kinds
    # Its counters leave the engine (serving_plugin_observed, at most every 2 s): the state
    # document's model lists the plugin, serving, with its late discards; /metrics too.
    plugin = _plugin_entry(server, "sleepy", lambda p: p.get("late", 0) >= 2)
    assert plugin["plugin_id"] == "sleepy.so" and plugin["state"] == "serving", plugin
    assert plugin["late"] >= 2 and plugin["failures"] == 0, plugin
    assert plugin["discarded"]["deadline_exceeded"] == plugin["late"]
    assert plugin["delivered"] > 0
    with server.http() as http:
        metrics = http.get("/metrics").text
    assert (
        'skippy_plugin_discarded_proposals_total{model="sleepy",plugin="sleepy.so",'
        'reason="deadline_exceeded"}'
    ) in metrics


def _plugin_entry(server: Server, model: str, ready: Callable[[dict[str, Any]], bool]) -> Any:
    """The model's first plugin in the state document once ``ready`` says its counters (sent
    by the engine at most every 2 s) arrived; the last one seen after a minute."""
    plugin: dict[str, Any] = {}
    until = time.monotonic() + 60
    while time.monotonic() < until:
        (entry,) = [m for m in _models(server) if m["model_id"] == model]
        plugin = (entry.get("plugins") or [{}])[0]
        if ready(plugin):
            break
        time.sleep(0.2)
    return plugin


def test_a_plugin_answering_garbage_is_discarded_by_reason_and_stays_enabled(
    server: Server, plugins: dict[str, Path]
) -> None:
    """Invalid proposals (ids outside the vocabulary, negative, over capacity) through the real
    engine: never verified, so the text is the plain one; counted as discards by reason, not as
    failures: the plugin is never failed, never disabled, and keeps being asked."""
    _serving(server, "plain")
    _plugged(server, "garbage", str(plugins["garbage"]))
    plain = _text(_complete(server, "plain"))
    for _ in range(2):
        body = _complete(server, "garbage")
        assert _text(body) == plain
        assert body["receipt"]["speculative"]["accepted"] == 0
    kinds = [e["kind"] for e in _plugin_events(server, "garbage")]
    assert kinds == ["serving_plugin_loaded"], kinds

    def counted(p: dict[str, Any]) -> bool:
        discarded = p.get("discarded", {})
        return bool(
            discarded.get("invalid_token_id", 0) >= 2
            and discarded.get("invalid_token_count", 0) >= 1
        )

    plugin = _plugin_entry(server, "garbage", counted)
    assert counted(plugin), plugin
    assert plugin["state"] == "serving" and plugin["failures"] == 0, plugin


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
