"""OpenAI-style error bodies, each with our reason code — for every error the server answers.

Every error response, whatever raised it (a handler, request validation, routing, the body-size
limit, an unexpected exception), has one shape:
`{"error": {"message", "type", "param", "code", "reason_code"}}`. Messages name the problem and
the offending parameter, never echo a request's values (prompt text, paths, names).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Sequence
from typing import Any, Final

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from skippyctl.events.reasons import ReasonCode


class JsonResponse(JSONResponse):
    """JSON rendered with orjson (the issue asks for orjson responses). A JSONResponse, so the
    OpenAPI document shows a route's response model (not a string)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ErrorDetail(BaseModel):
    """The `error` object (OpenAI's fields plus our `reason_code`)."""

    model_config = ConfigDict(title="ErrorDetail")

    message: str
    type: str
    param: str | None
    code: str | None
    reason_code: str | None
    """One of the documented reason codes (`skippyctl.events.reasons.ReasonCode`), or null."""


class ErrorBody(BaseModel):
    """Every error response body."""

    model_config = ConfigDict(title="ErrorBody")

    error: ErrorDetail


def error_body(
    message: str,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    reason: ReasonCode | None = None,
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
            "reason_code": None if reason is None else reason.value,
        }
    }


def error_response(
    message: str,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    reason: ReasonCode | None = None,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    return JsonResponse(
        error_body(message, status, param=param, code=code, reason=reason),
        status_code=status,
        headers=headers,
    )


# -- validation errors -----------------------------------------------------------------------------

UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"
"""The pydantic error type our request models raise for a parameter the runtime cannot honour."""

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TYPE_ERRORS: Final = frozenset(
    {
        "string_type",
        "int_type",
        "float_type",
        "bool_type",
        "list_type",
        "dict_type",
        "model_type",
        "model_attributes_type",
        "int_from_float",
        "none_required",
        "literal_error",
        "int_parsing",
        "float_parsing",
        "bool_parsing",
        "missing_argument",
    }
)


def _param(loc: Sequence[int | str], fields: frozenset[str]) -> str | None:
    """`('messages', 0, 'content', 'list[TextPart]', 1, 'text')` -> `messages[0].content[1].text`.

    Union-member tags and dict keys that pydantic puts in a location are dropped: only declared
    field names and list indexes name a parameter (and a client's dict key is never echoed)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in fields and _IDENTIFIER.match(part):
            out += f".{part}" if out else part
        else:
            continue
    return out or None


def model_field_names(models: Iterable[type[BaseModel]]) -> frozenset[str]:
    """Every field name (and alias) of these models and the models nested in them."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    pending = list(models)
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            names.add(info.alias or name)
            pending.extend(_nested_models(info.annotation))
    return frozenset(names)


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):  # unions, list[...], dict[...], Annotated[...]
        found.extend(_nested_models(arg))
    return found


def validation_error_response(
    errors: Sequence[Any],
    fields: frozenset[str],
    *,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    """One 400 for a failed validation: the most specific error (the deepest location) names
    its parameter; alternatives of a union at that same place are joined with "or"."""
    if not errors:
        return error_response(
            "invalid request", 400, code="invalid_value", reason=ReasonCode.INVALID_CONFIGURATION
        )
    located = [(_param(tuple(e.get("loc", ())), fields), e) for e in errors]
    deepest = max(len(tuple(e.get("loc", ()))) for _, e in located)
    # Prefer the deepest error; among equals, the first (pydantic reports in field order).
    param, first = next((p, e) for p, e in located if len(tuple(e.get("loc", ()))) == deepest)
    kind = str(first.get("type", ""))
    if kind == "missing":
        return error_response(
            f"'{param}' is required",
            400,
            param=param,
            code="missing_required_parameter",
            reason=ReasonCode.INVALID_CONFIGURATION,
            headers=headers,
        )
    if kind == UNSUPPORTED_PARAMETER:
        return error_response(
            str(first.get("msg", "unsupported parameter")),
            400,
            param=param,
            code=UNSUPPORTED_PARAMETER,
            reason=ReasonCode.UNSUPPORTED_CAPABILITY,
            headers=headers,
        )
    here = [e for p, e in located if p == param and len(tuple(e.get("loc", ()))) >= deepest - 1]
    # A union's alternatives: when the value had the type of one of them, only that one's
    # complaint (a bound, a pattern) is news; the others would only say "not a string".
    constraints = [e for e in here if str(e.get("type", "")) not in _TYPE_ERRORS]
    messages: list[str] = []
    for error in constraints or here:
        text = _message(error)
        if text not in messages:
            messages.append(text)
    kind = str((constraints or here)[0].get("type", ""))
    where = f"'{param}'" if param else "request body"
    return error_response(
        f"invalid {where}: {', or '.join(messages)}",
        400,
        param=param,
        code="invalid_type" if kind in _TYPE_ERRORS else "invalid_value",
        reason=ReasonCode.INVALID_CONFIGURATION,
        headers=headers,
    )


def _message(error: Any) -> str:
    text = str(error.get("msg", "invalid value"))
    if text.startswith("Value error, "):
        text = text[len("Value error, ") :]
    return text[:1].lower() + text[1:]


# -- handlers for what FastAPI and Starlette raise themselves -------------------------------------

_STATUS_CODES: Final = {
    404: ("no such endpoint", "not_found"),
    405: ("method not allowed on this endpoint", "method_not_allowed"),
    413: ("request body too large", "request_body_too_large"),
}


def install_error_handlers(app: FastAPI, fields: frozenset[str]) -> None:
    """Routing errors (404/405) and query/path/header validation answer in the same OpenAI shape
    as every handler's own errors. (Unexpected exceptions: `skippyctl.api.edge`.)"""

    async def on_http_error(_request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        message, code = _STATUS_CODES.get(error.status_code, (None, None))
        if message is None:
            detail = error.detail if isinstance(error.detail, str) else None
            message = detail or "request failed"
        headers = dict(error.headers) if error.headers else None
        return error_response(
            message,
            error.status_code,
            code=code,
            reason=ReasonCode.INVALID_CONFIGURATION if error.status_code < 500 else None,
            headers=headers,
        )

    async def on_validation_error(_request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        errors = []
        names = set(fields)
        for item in error.errors():
            loc = tuple(item.get("loc", ()))
            if len(loc) >= 2 and loc[0] in ("query", "path", "header", "cookie"):
                # A declared parameter: its name is the param (headers by their wire name).
                loc = loc[1:]
                names.add(str(loc[0]))
            elif loc and loc[0] == "body":
                loc = loc[1:]
            errors.append({**item, "loc": loc})
        return validation_error_response(errors, frozenset(names))

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
