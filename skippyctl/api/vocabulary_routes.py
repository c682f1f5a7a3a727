"""llama-server's `/tokenize` and `/detokenize`, on the model a request names (or the only one).

The model's engine answers from its vocabulary (``ModelServer.tokenize`` / ``detokenize``), off
its decode step. The caller's text and token ids go back to the caller only: nothing here
emits an event.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from skippyctl.api.context import ApiContext
from skippyctl.api.engine_answers import engine_answer, server_for
from skippyctl.api.errors import JsonResponse
from skippyctl.api.schemas import (
    DetokenizeBody,
    Detokenized,
    TokenizeBody,
    Tokenized,
    errors,
    json_body,
    read_body,
)


def _piece(piece: tuple[int, ...]) -> str | list[int]:
    """llama-server's form: the text when the bytes are UTF-8, else the bytes."""
    try:
        return bytes(piece).decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def register_vocabulary_routes(app: FastAPI, ctx: ApiContext) -> None:
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
        server = await server_for(ctx, body.model)
        if isinstance(server, Response):
            return server
        result = await engine_answer(
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
        server = await server_for(ctx, body.model)
        if isinstance(server, Response):
            return server
        result = await engine_answer(server.detokenize(tuple(body.tokens)), "tokens")
        if isinstance(result, Response):
            return result
        return JsonResponse({"content": result.content or ""})
