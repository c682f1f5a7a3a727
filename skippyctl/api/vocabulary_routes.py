"""llama-server's `/tokenize` and `/detokenize`, on the model a request names (or the only one).

The model's engine answers from its vocabulary (``ModelServer.tokenize`` / ``detokenize``), off
its decode step. The caller's text and token ids go back to the caller only: nothing here
emits an event.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Final

from fastapi import FastAPI, Request
from starlette.responses import Response

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.api.schemas import (
    DetokenizeBody,
    Detokenized,
    TokenizeBody,
    Tokenized,
    errors,
    json_body,
    read_body,
)
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.model_server import ModelServer
from skippyctl.runtime.requests import VocabularyAnswer

ANSWER_TIMEOUT_S: Final = 30.0
"""A vocabulary answer takes milliseconds; this long means the engine is stuck."""


def _piece(piece: tuple[int, ...]) -> str | list[int]:
    """llama-server's form: the text when the bytes are UTF-8, else the bytes."""
    try:
        return bytes(piece).decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def register_vocabulary_routes(app: FastAPI, ctx: ApiContext) -> None:
    def server_for(name: str | None) -> ModelServer | JsonResponse:
        if name is not None:
            server = ctx.scheduler.server(name)
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

    async def answer(
        future: Future[VocabularyAnswer] | None, param: str
    ) -> VocabularyAnswer | JsonResponse:
        """The engine's answer, or the response to send instead: 503 when no engine answers,
        400 naming ``param`` when the engine refused the request's input."""
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
        if result.problem is not None:
            return error_response(
                result.problem, 400, param=param, reason=ReasonCode.INVALID_CONFIGURATION
            )
        return result

    @app.post(
        "/tokenize",
        response_model=Tokenized,
        response_class=JsonResponse,
        responses=errors(400, 401, 404, 413, 503),
        openapi_extra=json_body(TokenizeBody),
    )
    async def tokenize(request: Request) -> Response:
        body = await read_body(request, TokenizeBody)
        if isinstance(body, Response):
            return body
        server = server_for(body.model)
        if isinstance(server, Response):
            return server
        result = await answer(
            server.tokenize(
                body.content,
                add_special=body.add_special,
                parse_special=body.parse_special,
                with_pieces=body.with_pieces,
            ),
            "content",
        )
        if isinstance(result, Response):
            return result
        if result.pieces is None:
            return JsonResponse({"tokens": list(result.tokens)})
        return JsonResponse(
            {
                "tokens": [
                    {"id": token, "piece": _piece(piece)}
                    for token, piece in zip(result.tokens, result.pieces, strict=True)
                ]
            }
        )

    @app.post(
        "/detokenize",
        response_model=Detokenized,
        response_class=JsonResponse,
        responses=errors(400, 401, 404, 413, 503),
        openapi_extra=json_body(DetokenizeBody),
    )
    async def detokenize(request: Request) -> Response:
        body = await read_body(request, DetokenizeBody)
        if isinstance(body, Response):
            return body
        server = server_for(body.model)
        if isinstance(server, Response):
            return server
        result = await answer(server.detokenize(tuple(body.tokens)), "tokens")
        if isinstance(result, Response):
            return result
        return JsonResponse({"content": result.content or ""})
