"""Declared query parameters are validated exactly as declared: a scalar given twice is a 400.

Starlette keeps the last of a repeated query parameter's values and FastAPI validates only that
one, so `?limit=1&limit=2` passed as `limit=2` where the OpenAPI document declares one integer.
`refuse_repeated_scalar_query_parameters` runs as an app-wide dependency (`create_app` installs
it), so every route — and every route added later — is covered: it looks up the matched route's
query parameters in the app's OpenAPI document (the declaration clients read) and refuses one
that is not an array but was given more than once, with the 400 any other invalid parameter gets
(`invalid_request_error`, `reason_code: invalid_configuration`), naming it. Undeclared query
parameters stay ignored, as unknown body fields are; repeating one changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

REPEATED_PARAMETER: Final = "repeated_parameter"
"""The validation error type of a scalar query parameter given more than once."""

Operation = tuple[str, str]
"""(HTTP method, path template), as in the OpenAPI document: `("GET", "/api/runtime/state")`."""


def scalar_query_parameters(document: Mapping[str, Any]) -> dict[Operation, frozenset[str]]:
    """The query parameters of each operation that the document declares to take one value."""
    table: dict[Operation, frozenset[str]] = {}
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, Mapping):
                continue
            names = frozenset(
                str(parameter["name"])
                for parameter in operation.get("parameters", [])
                if parameter.get("in") == "query" and not _takes_a_list(parameter.get("schema"))
            )
            if names:
                table[(method.upper(), path)] = names
    return table


def _takes_a_list(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    options = schema.get("anyOf") or schema.get("oneOf") or [schema]
    return any(isinstance(option, Mapping) and option.get("type") == "array" for option in options)


def _table(app: FastAPI) -> dict[Operation, frozenset[str]]:
    # Built once per app from its (cached) document: the routes do not change once it serves.
    table: dict[Operation, frozenset[str]] | None = getattr(
        app.state, "scalar_query_parameters", None
    )
    if table is None:
        table = scalar_query_parameters(app.openapi())
        app.state.scalar_query_parameters = table
    return table


async def refuse_repeated_scalar_query_parameters(request: Request) -> None:
    query = request.query_params
    route = request.scope.get("route")
    if not query or not isinstance(route, APIRoute):
        return
    declared = _table(request.app).get((request.method, route.path_format), frozenset())
    repeated = [
        {
            "type": REPEATED_PARAMETER,
            "loc": ("query", name),
            "msg": "Given more than once; it takes one value",
            "input": None,
        }
        for name in sorted(declared)
        if len(query.getlist(name)) > 1
    ]
    if repeated:
        raise RequestValidationError(repeated)
