"""The runtime's HTTP surface (FastAPI): management, live events, OpenAI-compatible generation.

Auth: a bearer token (from the discovery file) guards every path but `/health` and `/metrics`
(an unknown path without the token is a 401, with it a 404). Every error — a handler's, request
validation, routing (404/405), the body limit (413), an unexpected exception (500) — is
OpenAI-shaped with a `reason_code` (api/errors.py, api/edge.py). Request bodies are validated by
the models in api/schemas.py, which also make up the OpenAPI document at `/openapi.json`.
Nothing private is logged or evented here: request bodies stay in handler memory; the client's
`model` name is never echoed into events (unknown models are rejected without it).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from skippyctl.api.context import ApiContext
from skippyctl.api.edge import EdgeMiddleware
from skippyctl.api.embedding_routes import register_embedding_routes
from skippyctl.api.errors import error_response, install_error_handlers
from skippyctl.api.event_stream import register_event_stream_route
from skippyctl.api.health_routes import register_health_routes
from skippyctl.api.openai import register_openai_routes
from skippyctl.api.query_parameters import refuse_repeated_scalar_query_parameters
from skippyctl.api.runtime_routes import register_runtime_routes
from skippyctl.api.schemas import FIELD_NAMES, add_request_models
from skippyctl.api.vocabulary_routes import register_vocabulary_routes

PUBLIC_PATHS = frozenset({"/health", "/metrics"})


class BearerAuthMiddleware:
    """Every path but PUBLIC_PATHS needs `Authorization: Bearer <token>` (checked before
    routing: an unknown path without the token is a 401, not a 404). Pure ASGI, so a streamed
    response passes straight through."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self.token):
            response = error_response("missing or wrong bearer token", 401, code="invalid_api_key")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(ctx: ApiContext, on_ready: Callable[[], None] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()  # the socket accepts connections from here on: safe to advertise it
        yield

    app = FastAPI(
        title="skippyctl runtime",
        version=ctx.version,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(refuse_repeated_scalar_query_parameters)],
    )
    app.state.ctx = ctx
    install_error_handlers(app, FIELD_NAMES)

    app.add_middleware(BearerAuthMiddleware, token=ctx.token)
    # Outermost (added last): the body-size limit and the last-resort 500 wrap everything.
    app.add_middleware(EdgeMiddleware, max_body_bytes=ctx.max_body_bytes)

    register_health_routes(app, ctx)
    register_runtime_routes(app, ctx)
    register_event_stream_route(app, ctx)
    register_openai_routes(app, ctx)
    register_vocabulary_routes(app, ctx)
    register_embedding_routes(app, ctx)
    _document(app)
    return app


def _document(app: FastAPI) -> None:
    """The OpenAPI document: every request model, the bearer scheme (all but /health and
    /metrics need it), and the error body on every operation."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, routes=app.routes, openapi_version="3.1.0"
            )
            add_request_models(document)
            components = document.setdefault("components", {})
            components.setdefault("securitySchemes", {})["bearer"] = {
                "type": "http",
                "scheme": "bearer",
            }
            document["security"] = [{"bearer": []}]
            for item in document.get("paths", {}).values():
                for operation in item.values():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)  # FastAPI's default; validation answers 400
            schemas = components.get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
