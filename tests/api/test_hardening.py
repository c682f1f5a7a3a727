"""The HTTP edge refuses what it cannot honour, in one error shape (issue 10), against a real
runtime serving the tiny fixture from a `--model-root`: declared body models (a wrong type is a
400 naming the field), OpenAI-shaped routing and query errors, model-root confinement, NUL paths,
the body-size limit, refused (never ignored) parameters, `stream_options.include_usage`."""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from skippyctl.acquisition.artifacts import check_artifact
from skippyctl.api.edge import MAX_REQUEST_BODY_BYTES
from skippyctl.events.reasons import ReasonCode
from tests.api.conftest import Server, assert_openai_error, start_server, stop_server


@pytest.fixture(scope="module")
def rooted(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("rooted")
    root = base / "models"
    (root / "sub").mkdir(parents=True)
    shutil.copy(fixture_dir / "tiny.gguf", root / "tiny.gguf")
    outside = base / "outside"
    outside.mkdir()
    shutil.copy(fixture_dir / "tiny.gguf", outside / "secret.gguf")
    (root / "escape.gguf").symlink_to(outside / "secret.gguf")
    (root / "inside-link.gguf").symlink_to(root / "tiny.gguf")
    running = start_server(
        base / "runtime",
        "--model-root",
        str(root),
        "--max-queue",
        "8",
        env={"SKIPPY_TEST_DECODE_DELAY_MS": "1"},
    )
    try:
        # A relative path: resolved against the model root.
        answer = running.load(Path("tiny.gguf"), lanes=2)
        assert answer["state"] == "available", answer
        yield running
    finally:
        stop_server(running)


def _root(server: Server) -> Path:
    return server.directory.parent / "models"


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.discovery.token, max_retries=0)


def _chat(content: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


PART_TEXT = "messages[0].content[0].text"
WRONG_TYPES = [
    # (path, body, the param the error must name) — the first five were 500s before issue 10.
    ("/v1/chat/completions", _chat([{"type": "text", "text": 5}]), "messages[0].content[0].text"),
    (
        "/v1/chat/completions",
        _chat([{"type": "text", "text": None}]),
        "messages[0].content[0].text",
    ),
    (
        "/v1/chat/completions",
        _chat([{"type": "text", "text": ["a"]}]),
        "messages[0].content[0].text",
    ),
    ("/api/runtime/models/tiny/unload", {"drain_timeout_s": "soon"}, "drain_timeout_s"),
    ("/api/runtime/models/load", {"model": "tiny.gguf", "max_queue": "8"}, "max_queue"),
    ("/api/runtime/models/load", {"model": "tiny.gguf", "lanes": 1.5}, "lanes"),
    ("/api/runtime/models/load", {"model": "tiny.gguf", "ctx": True}, "ctx"),
    ("/api/runtime/models/load", {"model": 12}, "model"),
    ("/api/runtime/models/load", {"alias": "x"}, "model"),
    ("/api/runtime/models/tiny/unload", {"force": "yes"}, "force"),
    ("/v1/chat/completions", _chat(None), "messages[0].content"),
    ("/v1/chat/completions", _chat(7), "messages[0].content"),
    (
        "/v1/chat/completions",
        _chat([{"type": "image_url", "image_url": {}}]),
        "messages[0].content[0].type",
    ),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, "messages"),
    ("/v1/chat/completions", {**_chat("hi"), "stream": "yes"}, "stream"),
    (
        "/v1/chat/completions",
        {**_chat("hi"), "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
    ),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "seed": "1"}, "seed"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stop": [1]}, "stop[0]"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"1": "x"}}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "user": 5}, "user"),
    ("/v1/completions", {"model": ["tiny"], "prompt": "x"}, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": None}, "prompt"),
    # tool calls
    ("/v1/chat/completions", {**_chat("hi"), "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {**_chat("hi"), "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    (
        "/v1/chat/completions",
        {**_chat("hi"), "tool_choice": {"type": "function", "function": {"name": ""}}},
        "tool_choice.function.name",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), WRONG_TYPES)
def test_a_wrong_type_is_a_400_naming_the_field(
    rooted: Server, path: str, body: dict[str, Any], param: str
) -> None:
    with rooted.http() as http:
        response = http.post(path, json=body)
    error = assert_openai_error(response, 400)
    assert error["reason_code"] == "invalid_configuration"
    assert error["param"] == param, error
    assert f"'{param}'" in error["message"], error


def test_type_errors_leave_the_model_serving(rooted: Server) -> None:
    with rooted.http() as http:
        for path, body, _ in WRONG_TYPES:
            assert http.post(path, json=body).status_code == 400
        assert http.get("/health").json()["models"]["tiny"] == "available"
        ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"n": 2}, "n"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
        ("/v1/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
    ],
)
def test_parameters_the_runtime_cannot_honour_are_refused_not_ignored(
    rooted: Server, path: str, extra: dict[str, Any], param: str
) -> None:
    base: dict[str, Any] = (
        _chat("hi")
        if path.endswith("chat/completions")
        else {
            "model": "tiny",
            "prompt": "hi",
            "max_tokens": 2,
        }
    )
    with rooted.http() as http:
        response = http.post(path, json={**base, **extra})
    error = assert_openai_error(response, 400)
    assert error["param"] == param
    assert error["code"] == "unsupported_parameter"
    assert error["reason_code"] == "unsupported_capability"
    assert f"'{param}'" in error["message"]


def test_neutral_values_of_refused_parameters_and_unknown_fields_are_accepted(
    rooted: Server,
) -> None:
    client = _openai(rooted)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        max_tokens=2,
        logprobs=False,
        top_logprobs=0,
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        response_format={"type": "text"},
        extra_body={"cache_prompt": True, "some_vendor_knob": {"nested": [1, 2]}},
    )
    assert chat.choices[0].message.role == "assistant"
    completion = client.completions.create(
        model="tiny", prompt=["one prompt"], max_tokens=2, logprobs=0, echo=False, best_of=1
    )
    assert completion.choices[0].finish_reason in ("length", "stop")


def test_include_usage_sends_a_last_usage_chunk_with_no_choices(rooted: Server) -> None:
    client = _openai(rooted)
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens >= 1 and last.usage.prompt_tokens >= 1
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason in ("length", "stop")
    completions = list(
        client.completions.create(
            model="tiny",
            prompt="over the",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert completions[-1].choices == [] and completions[-1].usage is not None
    assert completions[-1].usage.completion_tokens == 3
    # Without the option: no usage chunk, as before.
    plain = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
    )
    assert all(c.choices for c in plain)


def test_the_usage_chunk_comes_right_before_done(rooted: Server) -> None:
    body = {**_chat("hi"), "stream": True, "stream_options": {"include_usage": True}}
    with rooted.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"choices":[]' in lines[-2] and '"usage":{"prompt_tokens"' in lines[-2]


def test_query_routing_and_method_errors_are_openai_shaped(rooted: Server) -> None:
    with rooted.http() as http:
        for path, param in [
            ("/api/runtime/state?recent=abc", "recent"),
            ("/api/runtime/events/recent?limit=x", "limit"),
        ]:
            error = assert_openai_error(http.get(path), 400)
            assert error["param"] == param
            assert error["reason_code"] == "invalid_configuration"
        error = assert_openai_error(http.post("/api/runtime/operations/not an id!/cancel"), 400)
        assert error["param"] == "operation_id"
        error = assert_openai_error(http.get("/no/such/route"), 404)
        assert error["code"] == "not_found" and error["reason_code"] == "invalid_configuration"
        wrong_method = http.delete("/v1/models")
        error = assert_openai_error(wrong_method, 405)
        assert error["code"] == "method_not_allowed"
        assert "GET" in wrong_method.headers["allow"]
        # Public paths stay public, also for a wrong method.
        assert_openai_error(httpx.post(f"{rooted.url}/health"), 405)
    with httpx.Client(base_url=rooted.url) as anonymous:
        # An unknown route needs the token too: 401 before 404.
        error = assert_openai_error(anonymous.get("/no/such/route"), 401)
        assert error["code"] == "invalid_api_key"
        assert_openai_error(anonymous.get("/openapi.json"), 401)
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/metrics").status_code == 200


def test_a_nul_byte_in_a_model_path_is_refused_and_nothing_is_left_loading(
    rooted: Server,
) -> None:
    with rooted.http() as http:
        for path in ["tiny\x00.gguf", "\x00", str(_root(rooted) / "x\x00y.gguf")]:
            error = assert_openai_error(
                http.post("/api/runtime/models/load", json={"model": path, "alias": "nul"}), 400
            )
            assert error["param"] == "model"
            assert error["reason_code"] == "invalid_configuration"
        state = http.get("/api/runtime/state").json()
        assert [m["model_id"] for m in state["models"]] == ["tiny"]
        assert http.get("/health").json()["status"] == "ready"
        again = http.post("/api/runtime/models/load", json={"model": "tiny.gguf"})
        assert again.status_code == 200 and again.json()["already_available"] is True


def test_the_artifact_check_calls_a_nul_path_invalid_instead_of_raising() -> None:
    """The host's pre-check behind the edge (a path with NUL cannot exist; `stat` raises)."""
    problem = check_artifact(Path("tiny\x00.gguf"))
    assert problem is not None
    assert problem.reason is ReasonCode.INVALID_CONFIGURATION
    assert "\x00" not in problem.message


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.gguf",
        "sub/../../outside/secret.gguf",
        "escape.gguf",  # a symlink inside the root that points out of it
        "/etc/hostname",
    ],
)
def test_model_root_confines_what_the_api_loads(rooted: Server, path: str) -> None:
    with rooted.http() as http:
        response = http.post("/api/runtime/models/load", json={"model": path, "alias": "escaped"})
        error = assert_openai_error(response, 400)
        assert error["param"] == "model"
        assert error["reason_code"] == "invalid_configuration"
        assert "outside the model root" in error["message"]
        assert str(rooted.directory.parent) not in response.text  # no absolute path echoed
        models = [m["model_id"] for m in http.get("/api/runtime/state").json()["models"]]
        assert "escaped" not in models


def test_paths_inside_the_model_root_load(rooted: Server) -> None:
    root = _root(rooted)
    for alias, path in [
        ("absolute-inside", str(root / "tiny.gguf")),
        ("dotted-inside", "sub/../tiny.gguf"),
        ("link-inside", "inside-link.gguf"),
    ]:
        answer = rooted.load(Path(path), alias=alias)
        assert answer["state"] == "available", (path, answer)
        with rooted.http() as http:
            http.post(f"/api/runtime/models/{alias}/unload", json={"force": True})


def test_a_body_over_the_limit_is_a_413_without_being_buffered(rooted: Server) -> None:
    too_big = b"x" * (MAX_REQUEST_BODY_BYTES + 1)

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to refuse up front
        for _ in range(MAX_REQUEST_BODY_BYTES // (1 << 20) + 2):
            yield b"x" * (1 << 20)

    with rooted.http() as http:
        for content in (too_big, chunks()):
            error = assert_openai_error(http.post("/v1/completions", content=content), 413)
            assert error["code"] == "request_body_too_large"
            assert error["reason_code"] == "invalid_configuration"
        assert_openai_error(http.post("/api/runtime/models/load", content=too_big), 413)
        assert http.get("/health").json()["models"]["tiny"] == "available"


def test_a_declared_oversized_body_is_refused_before_it_is_sent(rooted: Server) -> None:
    """`Expect: 100-continue` with a 1 TB Content-Length: the 413 comes back at once; the
    server neither waits for nor reads the body."""
    address = urlsplit(rooted.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {rooted.discovery.token}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000000000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_megabyte_prompt_is_context_exhausted_and_the_engine_lives(rooted: Server) -> None:
    """The acceptance test of issue 10's prompt-too-long case: a ~1 MB prompt is a clean 400
    `context_exhausted` (OpenAI's `context_length_exceeded` code), not a 503 or a dead engine."""
    prompt = "the quick brown fox " * 52_000  # ~1 MB, far beyond the fixture's context
    assert len(prompt.encode()) < MAX_REQUEST_BODY_BYTES
    with rooted.http(timeout=120) as http:
        engines = http.get("/api/runtime/state").json()["engines"]
        response = http.post(
            "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2}
        )
        error = assert_openai_error(response, 400)
        assert error["reason_code"] == "context_exhausted"
        assert error["code"] == "context_length_exceeded"
        assert re.search(r"the prompt \(\d+ tokens\) does not fit", error["message"])
        chat = http.post("/v1/chat/completions", json={**_chat(prompt), "max_tokens": 2})
        assert assert_openai_error(chat, 400)["reason_code"] == "context_exhausted"
        ok = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
        assert http.get("/api/runtime/state").json()["engines"] == engines  # same engine pid


def test_openapi_declares_every_body_response_and_content_type(rooted: Server) -> None:
    with rooted.http() as http:
        document = http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    operations = {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    bodies = {
        ("POST", "/api/runtime/models/load"): "LoadBody",
        ("POST", "/api/runtime/models/{model_id}/unload"): "UnloadBody",
        ("POST", "/v1/completions"): "CompletionBody",
        ("POST", "/v1/chat/completions"): "ChatCompletionBody",
    }
    for key, model in bodies.items():
        content = operations[key]["requestBody"]["content"]["application/json"]
        assert content["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert model in schemas
    public = {("GET", "/health"), ("GET", "/metrics")}
    for key, operation in operations.items():
        responses = operation["responses"]
        assert "422" not in responses, key
        if key in public:
            assert operation["security"] == []
        else:
            assert responses["401"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }, key
        for status, response in responses.items():
            assert response.get("content"), (key, status)
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert list(operations["GET", "/metrics"]["responses"]["200"]["content"]) == ["text/plain"]
    assert list(operations["GET", "/api/runtime/events/v1"]["responses"]["200"]["content"]) == [
        "text/event-stream"
    ]
    completion = operations["POST", "/v1/completions"]["responses"]["200"]["content"]
    assert set(completion) == {"application/json", "text/event-stream"}
    assert completion["application/json"]["schema"] == {"$ref": "#/components/schemas/Completion"}
    refs = str(document).count("#/components/schemas/")
    assert refs and all(name in schemas for name in _referenced(document)), (
        "a $ref points at a schema the document does not have"
    )


def _referenced(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _referenced(value)
    elif isinstance(node, list):
        for item in node:
            yield from _referenced(item)
