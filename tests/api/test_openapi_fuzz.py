"""Schema-driven fuzzing of a real runtime serving the tiny fixture (issue 10).

schemathesis generates requests for every operation of `/openapi.json` — positive ones (the
schema says valid: they must be accepted) and negative ones (they must be refused with a 4xx) —
and checks each answer against the document: status documented, content type and body schema as
declared, auth enforced, unsupported methods 405. On top: no 5xx but a documented 503, and every
error in the one OpenAI shape. A hypothesis test then throws random and oversized bodies at every
body-taking endpoint. Afterwards the engine that served before still serves.

Left out of the fuzzing, by design: `POST /api/runtime/shutdown` (it ends the runtime) and the
live SSE stream `GET /api/runtime/events/v1` (it never ends; test_runtime_ops covers it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from skippyctl.api.edge import MAX_REQUEST_BODY_BYTES
from tests.api.conftest import ERROR_FIELDS, Server, start_server, stop_server

EXAMPLES_PER_OPERATION = 25
FUZZ_EXAMPLES = 60
POSITIVE_LOAD_STATUSES = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]
"""schemathesis' default answers to schema-valid data, plus the load path's semantic 400."""
ENGINES_BEFORE: list[dict[str, Any]] = []
"""The engine processes serving before the fuzzing (filled by the `fuzzed` fixture)."""
BODY_PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/api/runtime/models/load",
    # Bodies are validated before the model is looked up; a valid one must not unload the
    # model the last test checks, so the fuzzing aims at one that is not loaded.
    "/api/runtime/models/not-loaded/unload",
]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("fuzzed"), "--max-queue", "16")
    try:
        answer = running.load(fixture_dir / "tiny.gguf", lanes=2)
        assert answer["state"] == "available", answer
        with running.http() as http:
            ENGINES_BEFORE[:] = http.get("/api/runtime/state").json()["engines"]
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def api_schema(fuzzed: Server) -> Any:
    config = schemathesis.Config.from_dict(
        {
            # The token as configuration (not a per-call override), so the negative cases that
            # drop it really go out without it and must get a 401.
            "headers": fuzzed.headers,
            # Undeclared query parameters are ignored by design (like unknown body fields);
            # "an extra query parameter must be refused" is not this API's contract.
            "generation": {"allow-extra-parameters": False},
            "operations": [
                {
                    # A schema-valid load path can still be refused, with the documented 400
                    # naming `model`: `~user` of an unknown user, a path outside the model root.
                    "include-path": "/api/runtime/models/load",
                    "include-method": "POST",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": POSITIVE_LOAD_STATUSES}
                    },
                }
            ],
        }
    )
    schema = schemathesis.openapi.from_url(
        f"{fuzzed.url}/openapi.json", config=config, headers=fuzzed.headers, timeout=30
    )
    return schema


schema = (
    schemathesis.pytest.from_fixture("api_schema")
    .exclude(path="/api/runtime/shutdown")
    .exclude(path="/api/runtime/events/v1")
)


def _assert_error_shape(status: int, content_type: str, body: bytes) -> None:
    assert content_type.startswith("application/json"), (status, content_type)
    document = orjson.loads(body)
    assert set(document) == {"error"}, document
    error = document["error"]
    assert set(error) == ERROR_FIELDS, error
    assert error["message"] and error["type"]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_within_its_documented_contract(case: Any, fuzzed: Server) -> None:
    response = case.call(timeout=60)
    # Our own 5xx rule replaces schemathesis' (which forbids every 5xx): a documented 503 is
    # the runtime saying "not serving now", not a failure.
    assert response.status_code < 500 or response.status_code == 503, (
        case.method,
        case.path,
        response.status_code,
        response.text[:300],
    )
    case.validate_response(response, excluded_checks=[not_a_server_error])
    if response.status_code >= 400:
        _assert_error_shape(
            response.status_code, response.headers.get("content-type", [""])[0], response.content
        )


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
KNOWN_KEYS = st.sampled_from(
    [
        "model",
        "prompt",
        "messages",
        "max_tokens",
        "stream",
        "stream_options",
        "logit_bias",
        "stop",
        "seed",
        "n",
        "logprobs",
        "drain_timeout_s",
        "force",
        "max_queue",
        "ctx",
        "lanes",
        "alias",
        # tool calls
        "tool_choice",
        "parallel_tool_calls",
    ]
)


def _dumps(value: Any) -> bytes:
    # The standard library writes what orjson refuses: integers past 64 bits, and Infinity
    # (not JSON at all: the server must refuse it as such).
    return json.dumps(value).encode()


# Bodies: random bytes, random JSON, objects with the known keys set to random values (also
# with a servable model, so some reach the engine).
BODIES = st.one_of(
    st.binary(max_size=256),
    JSON_VALUES.map(_dumps),
    st.dictionaries(KNOWN_KEYS, JSON_VALUES, max_size=6).map(_dumps),
    st.dictionaries(KNOWN_KEYS, JSON_VALUES, max_size=6)
    .map(lambda d: {**d, "model": "tiny", "max_tokens": 2})
    .map(_dumps),
)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(BODY_PATHS), body=BODIES)
def test_random_bodies_get_a_shaped_answer_never_a_server_error(
    fuzzed: Server, path: str, body: bytes
) -> None:
    with httpx.Client(base_url=fuzzed.url, headers=fuzzed.headers, timeout=60) as http:
        response = http.post(path, content=body)
    assert response.status_code < 500 or response.status_code == 503, response.text[:300]
    if response.status_code >= 400:
        _assert_error_shape(
            response.status_code, response.headers.get("content-type", ""), response.content
        )


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(BODY_PATHS),
    extra=st.integers(min_value=1, max_value=3 * 1024 * 1024),
    chunked=st.booleans(),
)
def test_oversized_bodies_are_413s(fuzzed: Server, path: str, extra: int, chunked: bool) -> None:
    size = MAX_REQUEST_BODY_BYTES + extra
    payload = b'{"model": "' + b"m" * (size - 13) + b'"}'

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    with httpx.Client(base_url=fuzzed.url, headers=fuzzed.headers, timeout=60) as http:
        response = http.post(path, content=pieces() if chunked else payload)
    assert response.status_code == 413, response.text[:300]
    _assert_error_shape(413, response.headers["content-type"], response.content)


def test_the_engine_still_serves_after_the_fuzzing(fuzzed: Server) -> None:
    """Runs last in this module: the same engine process serves the same model."""
    with fuzzed.http() as http:
        health = http.get("/health").json()
        assert health["models"]["tiny"] == "available", health
        assert health["status"] in ("ready", "degraded")
        state = http.get("/api/runtime/state").json()
        engines = [e for e in state["engines"] if e["model_id"] == "tiny"]
        assert engines == [e for e in ENGINES_BEFORE if e["model_id"] == "tiny"]
        ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
