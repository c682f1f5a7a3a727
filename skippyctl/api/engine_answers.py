"""Routes answered by a model's engine off the decode step (`/tokenize`, `/detokenize`,
`/v1/embeddings`): which model a request names, and the engine's answer or the error instead."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Final, TypeVar

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.api.model_demand import serving_model
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.model_server import ModelServer

ANSWER_TIMEOUT_S: Final = 30.0
"""Such an answer takes milliseconds to a few seconds; this long means the engine is stuck."""

A = TypeVar("A")


async def server_for(ctx: ApiContext, name: str | None) -> ModelServer | JsonResponse:
    """The model `name` serves as (loaded on demand when it must be), or the only one loaded
    when `name` is None; else the 404, 400 or 503 to answer with."""
    if name is not None:
        server = await serving_model(ctx, name)
        if server is None:
            return error_response(
                f"model '{name}' is not loaded",
                404,
                param="model",
                code="model_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return server
    servers = ctx.scheduler.servers()
    if len(servers) != 1:
        return error_response(
            f"{len(servers)} models are loaded: name one in 'model'",
            400,
            param="model",
            code="invalid_value",
            reason=ReasonCode.INVALID_CONFIGURATION,
        )
    return servers[0]


def _refusal(problem: str, reason: ReasonCode | None, param: str) -> JsonResponse:
    if reason is ReasonCode.UNSUPPORTED_CAPABILITY:
        return error_response(
            problem, 400, param="model", code="model_not_supported", reason=reason
        )
    if reason is ReasonCode.INTERNAL_RUNTIME_FAILURE:
        return error_response(problem, 500, code="internal_error", reason=reason)
    if reason is ReasonCode.STAGE_UNAVAILABLE:
        return error_response(problem, 503, code="model_unavailable", reason=reason)
    return error_response(
        problem, 400, param=param, code="invalid_value", reason=ReasonCode.INVALID_CONFIGURATION
    )


async def engine_answer(future: Future[A] | None, param: str) -> A | JsonResponse:
    """The engine's answer, or the response to send instead: 503 when no engine answers, the
    refusal the answer states (400 naming `param` for the request's input, 400 for a model that
    cannot do this, 500 for a failed computation)."""
    if future is None:
        return error_response(
            "the model is not serving",
            503,
            code="model_unavailable",
            reason=ReasonCode.STAGE_UNAVAILABLE,
        )
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            result = await asyncio.wrap_future(future)
    except (TimeoutError, ConnectionError):
        return error_response(
            "the model's engine did not answer",
            503,
            code="model_unavailable",
            reason=ReasonCode.PROCESS_CRASH,
        )
    answered: Any = result
    if answered.problem is not None:
        return _refusal(answered.problem, getattr(answered, "reason", None), param)
    return result
