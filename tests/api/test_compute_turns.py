"""The runtime's engines take turns at computing (engine/compute_turns.py): every llama_decode
of every engine runs while it holds the runtime's turn file, so a decode waits while another
holds it — shown here by holding the turn from the test, against a real runtime."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import Server, start_server, stop_server

TURNS_FILE = "compute-turns.lock"  # skippyctl/daemon/serve.py


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("turns"))
    try:
        for alias in ("first", "second"):
            answer = running.load(fixture_dir / "tiny.gguf", alias=alias, lanes=1)
            assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


def _complete(server: Server, model: str) -> int:
    with server.http(timeout=60) as http:
        response = http.post(
            "/v1/completions",
            json={"model": model, "prompt": "hello", "max_tokens": 8, "temperature": 0},
        )
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["completion_tokens"])


def test_no_engine_decodes_while_another_holds_the_turn(two_models: Server) -> None:
    turns = two_models.directory / TURNS_FILE
    assert turns.exists()
    fd = os.open(turns, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what an engine holds for one llama_decode
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(_complete, two_models, m) for m in ("first", "second")]
            done, _ = concurrent.futures.wait(pending, timeout=1.5)
            assert done == set(), "a model decoded while the turn was held elsewhere"
            fcntl.flock(fd, fcntl.LOCK_UN)
            assert [future.result(timeout=60) > 0 for future in pending] == [True, True]
    finally:
        os.close(fd)


def test_both_models_serve_at_once_taking_turns(two_models: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda m: _complete(two_models, m), ["first", "second"] * 4))
    assert all(count > 0 for count in counts)
