"""A real runtime server (subprocess, loopback, private runtime dir) shared by a test module."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from skippyctl.client.discovery import Discovery
from skippyctl.client.http import ApiError, Frame, RuntimeClient
from tests.cli.conftest import stop_runtime

ERROR_FIELDS = frozenset({"message", "type", "param", "code", "reason_code"})
BAN_TINY_END: dict[str, float] = {"2": -100, "1023": -100}
"""A `logit_bias` that bans tiny.gguf's two end-of-generation tokens (EOS and EOT): a sampled
reply then runs to its `max_tokens`, where a test needs it to last."""


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """What `check` returns once it is truthy; an AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The response is `status` with the one error shape every error of the API has; returns
    its `error` object."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    return error


RECONNECT_WAIT_S = 2.0
"""The Retry-After of the event stream's 429 (skippyctl/api/app.py)."""


@dataclass
class Server:
    directory: Path
    discovery: Discovery
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return self.discovery.url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.discovery.token}"}

    def client(self) -> RuntimeClient:
        return RuntimeClient(self.discovery)

    def http(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def receipt(self, request_id: str) -> dict[str, Any]:
        """A request's receipt (``GET /api/runtime/requests/{id}/receipt``)."""
        with self.http() as http:
            response = http.get(f"/api/runtime/requests/{request_id}/receipt")
        assert response.status_code == 200, response.text
        receipt: dict[str, Any] = response.json()
        return receipt

    def load(self, path: Path, **options: Any) -> dict[str, Any]:
        """Load and wait until the model serves (or its load failed)."""
        with self.http() as http:
            answer = http.post(
                "/api/runtime/models/load", json={"model": str(path), **options}
            ).json()
            model_id = answer["model_id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                models = http.get("/health").json()["models"]
                if models.get(model_id) in ("available", "failed", "cancelled"):
                    return dict(answer, state=models[model_id])
                time.sleep(0.05)
        raise AssertionError(f"{model_id} never settled")

    def frames_since_start(self, stop: Any, timeout_s: float = 30.0) -> list[Frame]:
        """Replay the stream from its first retained frame until `stop(frame)` is true. A
        429 (the runtime limits how often one peer reconnects to the stream; a test that polls
        does) is waited out as its Retry-After says, within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            client = self.client()
            seen: list[Frame] = []
            try:
                for frame in client.frames(f"rt1:{self.discovery.process_instance_id}:0"):
                    seen.append(frame)
                    if stop(frame) or time.monotonic() > deadline:
                        break
                return seen
            except ApiError as error:
                if error.status != 429 or time.monotonic() + RECONNECT_WAIT_S > deadline:
                    raise
            finally:
                client.close()
            time.sleep(RECONNECT_WAIT_S)

    def events(self) -> list[dict[str, Any]]:
        """Every retained event object up to now: replay from the start, stop at the live edge
        (the sequence the opening `runtime_state` frame announced)."""
        edge: list[int] = []

        def at_edge(frame: Frame) -> bool:
            if frame.name == "runtime_state":
                edge.append(int(frame.data["sequence"]))
                return edge[0] == 0
            if frame.name != "runtime_event":
                return False  # a replay gap frame carries the latest cursor: not the edge yet
            return bool(edge) and int(frame.data.get("sequence", 0)) >= edge[0]

        frames = self.frames_since_start(at_edge)
        return [f.data["event"] for f in frames if f.name == "runtime_event"]


def start_server(directory: Path, *extra: str, env: dict[str, str] | None = None) -> Server:
    directory.mkdir(parents=True, exist_ok=True)
    # A hub cache of its own (the runtime loads cached hub files by name): what the machine's
    # cache holds never changes a test's answers.
    isolated = {"HF_HUB_CACHE": str(directory / "hub-cache"), **(env or {})}
    full_env = dict(os.environ, SKIPPY_RUNTIME_DIR=str(directory), **isolated)
    log = open(directory / "serve.log", "wb")  # noqa: SIM115 - kept open for the server's life
    process = subprocess.Popen(
        [sys.executable, "-m", "skippyctl", "runtime", "serve", "--port", "0", *extra],
        stdout=log,
        stderr=log,
        env=full_env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError((directory / "serve.log").read_text())
        path = directory / "runtime.json"
        if path.exists():
            data = orjson.loads(path.read_bytes())
            return Server(directory, Discovery(**data), process)
        time.sleep(0.05)
    process.kill()
    raise AssertionError("server did not start")


REAL_MODEL = (
    Path(__file__).resolve().parents[2] / "fixtures" / "real" / ("SmolLM2-135M-Instruct.Q4_1.gguf")
)
"""The real instruct model `make fixtures` fetches (scripts/fetch_real_fixtures.py)."""
VENDORED_TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "templates"
"""llama.cpp's chat templates `make fixtures` takes from the llama-cpp-python sdist."""


@contextlib.contextmanager
def real_model_server(directory: Path, alias: str, **options: Any) -> Iterator[Server]:
    """A runtime serving the real model as ``alias`` (load ``options`` such as ctx, lanes)."""
    if not REAL_MODEL.exists():
        pytest.fail("the real model is not in fixtures/real: run `make fixtures`")
    running = start_server(directory)
    try:
        answer = running.load(REAL_MODEL, alias=alias, **options)
        assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


def openai_client(server: Server) -> Any:
    """The official client on ``server`` (no retries: a test sees the first answer)."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


def stop_server(server: Server) -> None:
    stop_runtime(server.directory)
    try:
        server.process.wait(20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(
        tmp_path_factory.mktemp("runtime"),
        "--replay-records",
        "4096",
        "--max-queue",
        "8",
        # The tiny model decodes a token in ~0.1 ms: 1 ms per step keeps timeouts and
        # disconnects reachable before a request fills its lane.
        env={"SKIPPY_TEST_DECODE_DELAY_MS": "1"},
    )
    try:
        answer = running.load(fixture_dir / "tiny.gguf", lanes=4)
        assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)
