"""OpenAI-style error bodies, each with our reason code."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from skippyctl.events.reasons import ReasonCode


class JsonResponse(Response):
    """JSON rendered with orjson (the issue asks for orjson responses)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


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
