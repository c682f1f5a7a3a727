"""OpenAI's `/v1/embeddings`, served by an embedding model (one whose GGUF declares a pooling).

The model's engine evaluates each input and returns its pooled, unit-length vector
(``ModelServer.embed``, engine/embeddings.py), as llama-server `--embeddings` does. A generative
model is refused with a 400 naming `model` (`model_not_supported`, `unsupported_capability`), as
llama-server refuses a model without pooling. `encoding_format: base64` (what the official
client asks for by default) is the float32 little-endian bytes, base64. The inputs and vectors
go back to the caller only: nothing here emits an event.
"""

from __future__ import annotations

import base64
from array import array
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from skippyctl.api.context import ApiContext
from skippyctl.api.engine_answers import engine_answer, server_for
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.api.schemas import EmbeddingBody, Embeddings, errors, json_body, read_body
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.requests import EmbeddingAnswer


def _encoded(vector: tuple[float, ...], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        packed = array("f", vector)
        if packed.itemsize != 4:  # pragma: no cover - every platform CPython runs on
            raise RuntimeError("float32 is not 4 bytes here")
        if array("h", [1]).tobytes() != b"\x01\x00":
            packed.byteswap()  # the wire is little-endian, as numpy's frombuffer reads it
        return base64.b64encode(packed.tobytes()).decode("ascii")
    return list(vector)


def _inputs(body: EmbeddingBody) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The body's input as texts or token lists (exactly one of the two is non-empty)."""
    value: Any = body.input
    if isinstance(value, str):
        return (value,), ()
    if all(isinstance(item, str) for item in value):
        return tuple(value), ()
    if all(isinstance(item, int) for item in value):
        return (), (tuple(value),)
    return (), tuple(tuple(item) for item in value)


def register_embedding_routes(app: FastAPI, ctx: ApiContext) -> None:
    @app.post(
        "/v1/embeddings",
        response_model=Embeddings,
        response_class=JsonResponse,
        responses=errors(400, 401, 404, 413, 500, 503),
        openapi_extra=json_body(EmbeddingBody),
    )
    async def embeddings(request: Request) -> Response:
        body = await read_body(request, EmbeddingBody)
        if isinstance(body, Response):
            return body
        server = await server_for(ctx, body.model)
        if isinstance(server, Response):
            return server
        if server.pooling is None:
            return error_response(
                f"model '{server.model_id}' has no pooling: it serves completions, not embeddings "
                "(an embedding model's GGUF declares its pooling type)",
                400,
                param="model",
                code="model_not_supported",
                reason=ReasonCode.UNSUPPORTED_CAPABILITY,
            )
        texts, token_lists = _inputs(body)
        result = await engine_answer(server.embed(texts, token_lists), "input")
        if isinstance(result, Response):
            return result
        answer: EmbeddingAnswer = result
        return JsonResponse(
            {
                "object": "list",
                "data": [
                    {
                        "object": "embedding",
                        "index": index,
                        "embedding": _encoded(vector, body.encoding_format),
                    }
                    for index, vector in enumerate(answer.vectors)
                ],
                "model": body.model or str(server.model_id),
                "usage": {
                    "prompt_tokens": answer.prompt_tokens,
                    "total_tokens": answer.prompt_tokens,
                },
            }
        )
