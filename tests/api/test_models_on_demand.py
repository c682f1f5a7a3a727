"""Models on demand, against a real runtime and real llama.cpp: a request naming a model the
runtime knows (a preset, a file of its models directory) but has not loaded waits for one shared
load; idle models unload after their TTL (reason ``idle``) and load again when asked; a load that
fails answers every waiting request with its reason; unknown names stay 404s."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import (
    Server,
    assert_openai_error,
    openai_client,
    start_server,
    stop_server,
    wait_for,
)

PROMPT = {"prompt": "hello", "max_tokens": 4, "temperature": 0}


def _presets(fixture_dir: Path, directory: Path) -> Path:
    presets = directory / "presets.toml"
    presets.write_text(
        f"""
[models.brief]
model = "{fixture_dir / "tiny.gguf"}"
lanes = 2
ttl = 1

[models.kept]
model = "{fixture_dir / "tiny.gguf"}"
ttl = 0
pinned = true

[models.broken]
model = "{fixture_dir / "bad-magic.gguf"}"

[models.flash]
model = "{fixture_dir / "tiny.gguf"}"
ttl = 0

[models.shelf]
model = "{fixture_dir / "tiny.gguf"}"
ttl = 30

[models.held]
model = "{fixture_dir / "tiny.gguf"}"
ttl = 30
pinned = true

[models.named]
model = "{fixture_dir / "tiny.gguf"}"
ttl = 45

[models.typed]
model = "{fixture_dir / "tiny.gguf"}"
"""
    )
    return presets


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("on-demand")
    models = directory / "models"
    models.mkdir()
    # one per test: tests run in any order
    for name in ("dirmodel", "dirshort", "dirlong", "dirstate"):
        os.symlink(fixture_dir / "tiny.gguf", models / f"{name}.gguf")
    os.symlink(fixture_dir / "tiny-embedding.gguf", models / "dirembed.gguf")
    (models / "notes.txt").write_text("not a model")
    running = start_server(
        directory / "runtime",
        "--models-dir",
        str(models),
        "--presets",
        str(_presets(fixture_dir, directory)),
        # Loads that take a while (each native progress callback waits 20 ms), so the
        # requests of a test all arrive while their model still loads.
        env={"SKIPPY_TEST_PROGRESS_DELAY_US": "20000"},
    )
    try:
        yield running
    finally:
        stop_server(running)


def _complete(server: Server, model: str, **extra: Any) -> httpx.Response:
    with server.http(timeout=120) as http:
        return http.post("/v1/completions", json={"model": model, **PROMPT, **extra})


def _events_of(server: Server, model: str, kind: str) -> list[dict[str, Any]]:
    return [
        e
        for e in server.events()
        if e["kind"] == kind and e.get("scope", {}).get("model_id") == model
    ]


def test_concurrent_requests_for_an_unloaded_model_share_one_load(on_demand: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: _complete(on_demand, "dirmodel"), range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert all(a.json()["model"] == "dirmodel" for a in answers)
    assert len(_events_of(on_demand, "dirmodel", "model_load_requested")) == 1
    # Each request's wait for the load is in its receipt's queue wait (the slowed load takes
    # far longer than 100 ms).
    receipt = on_demand.receipt(answers[0].headers["X-Request-Id"])
    assert receipt["queue_ms"] > 100, receipt


def test_a_model_unloads_after_its_ttl_and_loads_again(on_demand: Server) -> None:
    assert _complete(on_demand, "brief").status_code == 200
    started = wait_for(lambda: _events_of(on_demand, "brief", "model_idle_timer_started"))
    ttl = {s["key"]: s["value"] for s in started[-1]["numeric_summaries"]}["idle_ttl_ms"]
    assert ttl == 1000
    completed = wait_for(lambda: _events_of(on_demand, "brief", "unload_completed"))
    assert completed[0]["reason_code"] == "idle"
    requested = _events_of(on_demand, "brief", "unload_requested")
    assert [e["reason_code"] for e in requested] == ["idle"]
    # The next request loads it again.
    assert _complete(on_demand, "brief").status_code == 200
    assert len(_events_of(on_demand, "brief", "model_load_requested")) == 2


def test_keep_alive_zero_unloads_after_the_request(on_demand: Server) -> None:
    answer = _complete(on_demand, "dirshort", keep_alive="0s")
    assert answer.status_code == 200, answer.text
    completed = wait_for(lambda: _events_of(on_demand, "dirshort", "unload_completed"))
    assert completed[-1]["reason_code"] == "idle"


def test_a_model_with_ttl_zero_serves_every_request_that_waited_for_it(on_demand: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _complete(on_demand, "flash"), range(4)))
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    completed = wait_for(lambda: _events_of(on_demand, "flash", "unload_completed"))
    assert completed[0]["reason_code"] == "idle"


def test_a_pinned_model_never_unloads_on_its_own(on_demand: Server) -> None:
    assert _complete(on_demand, "kept").status_code == 200
    time.sleep(1.0)  # its ttl is 0: unpinned, it would be gone by now
    assert _events_of(on_demand, "kept", "model_idle_timer_started") == []
    assert _events_of(on_demand, "kept", "unload_requested") == []
    with on_demand.http() as http:
        cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert cards["kept"]["state"] == "loaded" and cards["kept"]["pinned"] is True


def test_v1_models_lists_loadable_and_loaded_models(on_demand: Server) -> None:
    with on_demand.http() as http:
        cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert {"brief", "kept", "broken", "dirmodel", "dirembed"} <= set(cards)
    assert "notes" not in cards
    assert cards["broken"]["state"] == "loadable" and cards["broken"]["source"] == "preset"
    assert cards["dirembed"]["source"] == "models_dir"
    # The official client reads the list.
    listed = {model.id for model in openai_client(on_demand).models.list()}
    assert "dirembed" in listed


def test_the_state_document_lists_a_loadable_model_until_it_loads(on_demand: Server) -> None:
    """``loadable_models``: the catalog's models neither loaded nor loading, by id and source
    (never a path); a model leaves it when it loads and comes back when it unloads."""

    def state() -> dict[str, Any]:
        with on_demand.http() as http:
            document: dict[str, Any] = http.get("/api/runtime/state").json()
        return document

    def loadable(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {entry["model_id"]: entry for entry in document["loadable_models"]}

    before = state()
    listed = loadable(before)
    assert listed["dirstate"] == {"model_id": "dirstate", "source": "models_dir", "pinned": False}
    assert listed["shelf"] == {
        "model_id": "shelf",
        "source": "preset",
        "pinned": False,
        "idle_ttl_s": 30,
    }
    assert listed["held"] == {"model_id": "held", "source": "preset", "pinned": True}
    assert "notes" not in listed
    assert "dirstate" not in {m["model_id"] for m in before["models"]}
    # The presets come first, in the order the runtime looks a name up.
    sources = [entry["source"] for entry in before["loadable_models"]]
    assert sources == sorted(sources, key=lambda source: source != "preset")
    text = str(before["loadable_models"])
    assert "/" not in text and ".gguf" not in text  # ids and sources, never a path
    with on_demand.http() as http:
        cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    for model_id in ("dirstate", "shelf", "held"):  # one rule for both listings
        card = cards[model_id]
        assert card["state"] == "loadable"
        assert listed[model_id] == {
            "model_id": model_id,
            **{key: card[key] for key in ("source", "pinned", "idle_ttl_s") if key in card},
        }

    assert _complete(on_demand, "dirstate").status_code == 200
    loaded = state()
    (model,) = [m for m in loaded["models"] if m["model_id"] == "dirstate"]
    assert model["state"] == "available"
    assert "dirstate" not in loadable(loaded)
    assert "shelf" in loadable(loaded)

    with on_demand.http() as http:
        answer = http.post("/api/runtime/models/dirstate/unload", json={})
    assert answer.status_code in (200, 202), answer.text
    wait_for(lambda: _events_of(on_demand, "dirstate", "unload_completed"))
    again = wait_for(lambda: loadable(state()).get("dirstate"))
    assert again == {"model_id": "dirstate", "source": "models_dir", "pinned": False}


def test_an_idle_model_shows_when_it_unloads(on_demand: Server) -> None:
    # The runtime's default TTL is "never"; this request's keep_alive says a minute.
    answer = _complete(on_demand, "dirlong", keep_alive="1m")
    assert answer.status_code == 200
    with on_demand.http() as http:
        card = wait_for(lambda: _expiring_card(http, "dirlong"))
        state = http.get("/api/runtime/state").json()
    assert card["state"] == "loaded" and card["idle_ttl_s"] == 60
    assert card["idle_expires_at"].endswith("Z")
    model = next(m for m in state["models"] if m["model_id"] == "dirlong")
    assert model["idle_ttl_ms"] == 60_000 and model["idle_expires_at"] == card["idle_expires_at"]


def _expiring_card(http: httpx.Client, model: str) -> dict[str, Any] | None:
    """The model's card once it shows an expiry (the state applies events within ms)."""
    card: dict[str, Any] = next(
        c for c in http.get("/v1/models").json()["data"] if c["id"] == model
    )
    return card if "idle_expires_at" in card else None


def test_a_failed_load_answers_every_waiting_request(on_demand: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: _complete(on_demand, "broken"), range(2)))
    for answer in answers:
        error = assert_openai_error(answer, 503)
        assert error["reason_code"] == "model_format_or_load_failure", error
        assert error["code"] == "model_unavailable"


def test_unknown_models_stay_not_found(on_demand: Server) -> None:
    for name in ("nobody", "notes", "../models/dirmodel", "x" * 300):
        error = assert_openai_error(_complete(on_demand, name), 404)
        assert error["code"] == "model_not_found"


def test_an_embedding_model_loads_on_demand_for_embeddings(on_demand: Server) -> None:
    with on_demand.http(timeout=120) as http:
        answer = http.post("/v1/embeddings", json={"model": "dirembed", "input": "hello"})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["embedding"]) > 0


def test_a_bad_keep_alive_is_refused_naming_it(on_demand: Server) -> None:
    for bad in ("soon", True, "5x", 10**9):
        error = assert_openai_error(_complete(on_demand, "dirmodel", keep_alive=bad), 400)
        assert error["param"] == "keep_alive", error


def test_too_many_waiting_requests_are_told_to_retry(tmp_path: Path, fixture_dir: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(fixture_dir / "tiny.gguf", models / "slow.gguf")
    running = start_server(
        tmp_path / "runtime",
        "--models-dir",
        str(models),
        "--max-queue",
        "1",
        env={"SKIPPY_TEST_PROGRESS_DELAY_US": "100000"},  # a load of seconds
    )
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: _complete(running, "slow"), range(3)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 503, 503], [a.text for a in answers]
        refused = next(a for a in answers if a.status_code == 503)
        assert refused.headers["Retry-After"] == "5"
        assert assert_openai_error(refused, 503)["reason_code"] == "reservation_exhausted"
    finally:
        stop_server(running)


def _serving(server: Server) -> set[str]:
    with server.http() as http:
        return {c["id"] for c in http.get("/v1/models").json()["data"] if c["state"] == "loaded"}


def test_max_models_unloads_the_least_recently_used_idle_model(
    tmp_path: Path, fixture_dir: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("one", "two", "three"):
        os.symlink(fixture_dir / "tiny.gguf", models / f"{name}.gguf")
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[models.kept]\nmodel = "{fixture_dir / "tiny.gguf"}"\npinned = true\n')
    running = start_server(
        tmp_path / "runtime",
        "--models-dir",
        str(models),
        "--presets",
        str(presets),
        "--max-models",
        "2",
        # 20 ms a decode: the long request below is still running when the next one comes.
        env={"SKIPPY_TEST_DECODE_DELAY_MS": "20"},
    )
    try:
        for name in ("one", "two"):
            assert _complete(running, name).status_code == 200
        assert _complete(running, "one").status_code == 200  # "two" is now the least recent
        assert _complete(running, "three").status_code == 200
        assert _serving(running) == {"one", "three"}
        evicted = _events_of(running, "two", "unload_completed")
        assert [e["reason_code"] for e in evicted] == ["max_models"]
        # A pinned model is never the one that makes room: "one" and then "three" go.
        assert _complete(running, "kept").status_code == 200
        assert _complete(running, "two").status_code == 200
        assert _serving(running) == {"kept", "two"}
        # With the pinned model and a model serving a request, nothing can make room: the
        # load fails before it starts, and the request says why.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            busy = pool.submit(_complete, running, "two", max_tokens=200)
            wait_for(lambda: _in_flight(running, "two"))
            refused = _complete(running, "one")
            assert busy.result().status_code == 200
        error = assert_openai_error(refused, 503)
        assert error["reason_code"] == "max_models", error
        failed = _events_of(running, "one", "model_load_failed")
        assert failed[-1]["reason_code"] == "max_models"
    finally:
        stop_server(running)


def _in_flight(server: Server, model: str) -> bool:
    with server.http() as http:
        state = http.get("/api/runtime/state").json()
    return any(m["model_id"] == model and m.get("lanes_in_use", 0) > 0 for m in state["models"])


def test_the_memory_budget_makes_room_or_refuses_before_weights_move(
    tmp_path: Path, fixture_dir: Path
) -> None:
    from skippyctl.config.load_options import LoadOptions
    from skippyctl.runtime.memory_estimate import estimate_load

    tiny = fixture_dir / "tiny.gguf"
    one_model = estimate_load(LoadOptions(str(tiny), lanes=1, ctx=512)).total_bytes
    models = tmp_path / "models"
    models.mkdir()
    presets = tmp_path / "presets.toml"
    presets.write_text(
        "".join(
            f'[models.{name}]\nmodel = "{tiny}"\nlanes = 1\nctx = {ctx}\n\n'
            for name, ctx in (("small1", 512), ("small2", 512), ("huge", 65536))
        )
    )
    running = start_server(
        tmp_path / "runtime",
        "--presets",
        str(presets),
        "--memory-budget",
        str(int(one_model * 1.5)),  # room for one small model, not two
    )
    try:
        initialized = [e for e in running.events() if e["kind"] == "runtime_initialized"]
        limit = {s["key"]: s["value"] for s in initialized[0]["numeric_summaries"]}
        assert limit["memory_limit_bytes"] == int(one_model * 1.5)
        assert _complete(running, "small1").status_code == 200
        assert _complete(running, "small2").status_code == 200
        assert _serving(running) == {"small2"}
        evicted = _events_of(running, "small1", "unload_completed")
        assert [e["reason_code"] for e in evicted] == ["memory_budget"]
        # A load that cannot fit even alone fails before any engine starts.
        error = assert_openai_error(_complete(running, "huge"), 503)
        assert error["reason_code"] == "insufficient_memory", error
        assert _events_of(running, "huge", "model_load_failed")[-1]["reason_code"] == (
            "insufficient_memory"
        )
        assert _events_of(running, "huge", "engine_process_started") == []
        assert _serving(running) == {"small2"}  # nothing was unloaded for it
    finally:
        stop_server(running)


def test_an_estimate_says_what_a_load_would_take_without_loading(
    on_demand: Server, fixture_dir: Path
) -> None:
    from tests.api.conftest import REAL_MODEL

    with on_demand.http() as http:
        answer = http.post(
            "/api/runtime/models/estimate",
            json={"model": str(REAL_MODEL), "lanes": 2, "ctx": 8192, "alias": "sized"},
        )
        missing = http.post("/api/runtime/models/estimate", json={"model": "/no/such.gguf"})
        models = http.get("/api/runtime/state").json()["models"]
    assert answer.status_code == 200, answer.text
    found = answer.json()
    # llama.cpp allocates exactly this KV cache for this load (model_memory_allocation_summary)
    assert found["kv_bytes"] == 188_743_680 and found["kv_bytes_per_lane"] == 94_371_840
    assert found["weights_bytes"] == REAL_MODEL.stat().st_size
    assert found["total_bytes"] == (
        found["weights_bytes"] + found["kv_bytes"] + found["compute_bytes"]
    )
    assert (found["model_id"], found["lanes"], found["context_tokens"]) == ("sized", 2, 8192)
    assert all(m["model_id"] != "sized" for m in models)  # nothing was loaded
    error = assert_openai_error(missing, 404)
    assert error["reason_code"] == "missing_artifact"


def test_a_load_naming_a_preset_loads_it_with_the_requests_options_on_top(
    on_demand: Server,
) -> None:
    loaded = on_demand.load(Path("named"), lanes=2)  # the preset's id, not a file
    assert (loaded["model_id"], loaded["state"]) == ("named", "available")
    with on_demand.http() as http:
        models = {m["model_id"]: m for m in http.get("/api/runtime/state").json()["models"]}
    settings = models["named"]["settings"]
    assert (settings["lanes"], settings["ttl"]) == (2, 45)  # the request's, then the preset's
    # And as an operator types it.
    from tests.cli.helpers import run_cli

    typed = run_cli("load", "typed", "--json", env={"SKIPPY_RUNTIME_DIR": str(on_demand.directory)})
    assert typed.code == 0, typed.stderr
    assert typed.records()[-1]["event"] == "model_available"
    assert typed.records()[-1]["model_id"] == "typed"
