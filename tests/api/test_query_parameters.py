"""Every declared scalar query parameter, of every route, refuses a repeat with a 400 naming it.

The table is built from the app itself (`app.routes`, each route's parameters as the OpenAPI
document declares them), so a new endpoint is covered without touching this file. The app runs
in-process: a refused request never reaches a handler, so a stand-in context serves.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from skippyctl.api.app import create_app
from skippyctl.api.context import ApiContext
from tests.api.conftest import assert_openai_error

TOKEN = "query-parameters-test-token"
KNOWN_SCALARS = {
    ("GET", "/api/runtime/state", "recent"),
    ("GET", "/api/runtime/diagnostics/native-log", "limit"),
    ("GET", "/api/runtime/events/recent", "limit"),
    ("GET", "/api/runtime/events/v1", "since"),
}
"""The fuzzer's finds (and the event stream's cursor): the walk must reach at least these."""
SAMPLE_VALUES = {"integer": "1", "number": "1.5", "boolean": "true"}


def _app() -> FastAPI:
    # Only what create_app reads while it builds the routes; no handler runs in these tests.
    ctx = SimpleNamespace(token=TOKEN, version="0.0.0", max_body_bytes=1 << 20)
    return create_app(cast(ApiContext, ctx))


APP = _app()


def _scalar_query_parameters(app: FastAPI) -> list[tuple[str, str, str, str]]:
    """(method, path, parameter, a valid value) for every declared scalar query parameter."""
    document = app.openapi()["paths"]
    found = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        for method in sorted(route.methods):
            operation = document.get(route.path_format, {}).get(method.lower(), {})
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                types = {option.get("type") for option in schema.get("anyOf", [schema])}
                if parameter["in"] != "query" or "array" in types:
                    continue
                value = next((SAMPLE_VALUES[t] for t in types if t in SAMPLE_VALUES), "a")
                found.append((method, route.path_format, parameter["name"], value))
    return found


CASES = _scalar_query_parameters(APP)


def test_the_walk_reaches_every_known_scalar_query_parameter() -> None:
    assert {(method, path, name) for method, path, name, _ in CASES} >= KNOWN_SCALARS


@pytest.mark.parametrize(("method", "path", "name", "value"), CASES)
def test_a_repeated_scalar_query_parameter_is_a_400_naming_it(
    method: str, path: str, name: str, value: str
) -> None:
    url = re.sub(r"\{[^}]+\}", "item-1", path)
    with TestClient(APP, raise_server_exceptions=True) as client:
        response = client.request(
            method,
            url,
            params=[(name, value), (name, value)],
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    error = assert_openai_error(response, 400)
    assert error["param"] == name, error
    assert error["type"] == "invalid_request_error"
    assert error["reason_code"] == "invalid_configuration"
    assert name in error["message"] and "more than once" in error["message"], error


def test_an_undeclared_query_parameter_stays_ignored_even_repeated() -> None:
    """Undeclared parameters are ignored like unknown body fields (the fuzz test's contract):
    repeating one changes nothing, so the request fails only on what it really lacks."""
    with TestClient(APP) as client:
        response = client.post(
            "/api/runtime/models/load",
            params=[("unknown", "1"), ("unknown", "2")],
            content=b"{}",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
    error: dict[str, Any] = assert_openai_error(response, 400)
    assert error["param"] != "unknown", error
