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

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from skippyctl.api.context import ApiContext
from skippyctl.api.edge import EdgeMiddleware
from skippyctl.api.errors import JsonResponse, error_response, install_error_handlers
from skippyctl.api.openai import register_openai_routes
from skippyctl.api.query_parameters import refuse_repeated_scalar_query_parameters
from skippyctl.api.schemas import (
    FIELD_NAMES,
    SSE,
    CancelAccepted,
    HealthDocument,
    LoadAccepted,
    LoadBody,
    ReceiptDocument,
    RecentEvents,
    SessionSaveAccepted,
    ShutdownAccepted,
    StateDocument,
    UnloadAccepted,
    UnloadBody,
    add_request_models,
    errors,
    json_body,
    read_body,
    sse_event,
)
from skippyctl.config.load_options import LoadOptions
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import InvalidLogicalId, LogicalId, make_event, summaries
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.codec import event_frame, event_record, frame
from skippyctl.output.redact import redact
from skippyctl.output.state import state_document
from skippyctl.pipeline.dispatch import Dispatched, SubscriptionClosed
from skippyctl.reducer.state import LOADING_MODEL_STATES, NodeState

PUBLIC_PATHS = frozenset({"/health", "/metrics"})
LOGICAL_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:+=-]{0,63}$"
"""What `LogicalId` accepts (declared so the OpenAPI document says it)."""
# Event frames written to an SSE client in one chunk at most (what gathered since the last look).
SSE_FRAMES_PER_WRITE = 256


def health_document(ctx: ApiContext) -> tuple[int, dict[str, Any]]:
    """`/health`: 200 when the runtime answers and can serve or is idle; 503 while loading (no
    model ready yet) or draining. The body says which: ready, degraded, loading, idle, draining."""
    state = ctx.host.pipeline.state
    node = state.node
    loading = any(m.state in LOADING_MODEL_STATES for m in state.models.values())
    if node is NodeState.ACCEPTING:
        status, code = "ready", 200
    elif node is NodeState.DEGRADED:
        status, code = "degraded", 200
    elif node in (NodeState.DRAINING, NodeState.STOPPED):
        status, code = "draining", 503
    elif loading or node is NodeState.STARTING:
        status, code = "loading", 503
    else:
        status, code = "idle", 200
    return code, {
        "status": status,
        "node": node.value,
        "models": {str(m.model_id): m.state.value for m in state.models.values()},
        "version": ctx.version,
        "process_instance_id": ctx.instance_id,
    }


def health_counters(ctx: ApiContext) -> dict[str, Any]:
    health = ctx.host.pipeline.health()
    lanes = {
        cls.value: {
            "submitted": c.submitted,
            "delivered": c.delivered,
            "coalesced": c.coalesced,
            "dropped": c.dropped,
            "rejected": c.rejected,
            "pending": c.pending,
        }
        for cls, c in health.host_ingress.lanes.items()
    }
    dispatcher = health.dispatcher
    counters: dict[str, Any] = {
        "host_ingress": lanes,
        "sampled": health.host_ingress.sampled,
        "native_dropped": health.native_dropped,
        "native_coalesced": health.native_coalesced,
        "native_rejected": health.native_rejected,
        "native_unknown": health.native_unknown,
        "native_sampled": health.adapter.sampled,
        "native_state_coalesced": health.adapter.coalesced,
        "native_facts_processed": health.native_facts_processed,
        "subscribers": dispatcher.subscribers,
        "subscribers_lagging": dispatcher.lagging,
        "subscribers_disconnected_lag": dispatcher.disconnected_lag,
        "subscribers_disconnected_failed": dispatcher.disconnected_failed,
        "replay_retained": dispatcher.replay_retained,
        "replay_evicted": dispatcher.replay_evicted,
        "reducer_rejected": health.reducer_rejected,
        "health_events_emitted": health.health_events_emitted,
        "bounds": {
            "replay_frames": ctx.host.pipeline.dispatcher.max_replay_records,
            "subscriber_queue_frames": ctx.stream_queue_size,
            "keepalive_s": ctx.keepalive_s,
        },
    }
    if ctx.metrics.exporter is not None:  # absent while OTLP is off
        counters["telemetry_exporter"] = ctx.metrics.exporter.stats().as_dict()
    return counters


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

    @app.get(
        "/health",
        response_model=HealthDocument,
        response_class=JsonResponse,
        responses={503: {"model": HealthDocument, "description": "Loading or draining"}},
        openapi_extra=PUBLIC,
    )
    async def health() -> Response:
        code, body = health_document(ctx)
        return JsonResponse(body, status_code=code)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
        openapi_extra=PUBLIC,
    )
    async def metrics() -> Response:
        text = ctx.metrics.render(ctx.host.pipeline.state, ctx.host.pipeline.health())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get(
        "/api/runtime/state",
        response_model=StateDocument,
        response_class=JsonResponse,
        responses=errors(400, 401),
    )
    async def runtime_state(
        recent: Annotated[int, Query(description="Also return up to N (≤128) recent events")] = 0,
    ) -> Response:
        state = ctx.host.pipeline.state
        events = state.recent_events[-max(0, min(recent, 128)) :] if recent > 0 else None
        document = state_document(state, health=health_counters(ctx), recent=events)
        document["engines"] = [
            {"model_id": model_id, "pid": pid} for model_id, pid in ctx.host.engine_pids().items()
        ]
        return JsonResponse(document)

    @app.get(
        "/api/runtime/diagnostics/native-log",
        response_class=JsonResponse,
        responses=errors(400, 401),
    )
    async def native_log(
        limit: Annotated[
            int, Query(description="At most this many lines per engine (1-4096)")
        ] = 2000,
    ) -> Response:
        """Drain the engines' opt-in native debug log (SKIPPY_CAPTURE_NATIVE_LOG=1 at serve):
        raw llama.cpp lines with absolute paths redacted, for diagnostics only (nothing reads
        them for state). Without capture the list is empty."""
        drained = ctx.host.pipeline.native_debug_log(max(1, min(limit, 4096)))
        return JsonResponse(
            {
                "engines": [
                    {
                        "model_id": None if model_id is None else str(model_id),
                        "lines": [redact(line)[0] for line in lines],
                        "cut": cut,
                    }
                    for model_id, lines, cut in drained
                ]
            }
        )

    @app.get(
        "/api/runtime/events/recent",
        response_model=RecentEvents,
        response_class=JsonResponse,
        responses=errors(400, 401),
    )
    async def recent_events(
        limit: Annotated[int, Query(description="At most this many (1-128)")] = 128,
    ) -> Response:
        state = ctx.host.pipeline.state
        events = state.recent_events[-max(1, min(limit, 128)) :]
        return JsonResponse({"events": [event_record(e) for e in events]})

    @app.get(
        "/api/runtime/requests/{request_id}/receipt",
        response_model=ReceiptDocument,
        response_class=JsonResponse,
        responses=errors(400, 401, 404),
    )
    async def request_receipt(
        request_id: Annotated[str, PathParam(pattern=LOGICAL_ID_PATTERN)],
    ) -> Response:
        """The generation receipt of a request that ended (its id is the `X-Request-Id` of
        its response). The runtime keeps the latest 1024."""
        receipt = ctx.scheduler.receipts.get(request_id)
        if receipt is None:
            return error_response(
                "no receipt for this request (unknown, still running, or evicted)",
                404,
                code="receipt_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return JsonResponse(receipt.document())

    @app.post(
        "/api/runtime/models/load",
        status_code=202,
        response_model=LoadAccepted,
        response_class=JsonResponse,
        responses={
            200: {"model": LoadAccepted, "description": "Already available"},
            **errors(400, 401, 413),
        },
        openapi_extra=json_body(LoadBody),
    )
    async def load(request: Request) -> Response:
        body = await read_body(request, LoadBody)
        if isinstance(body, Response):
            return body
        options = LoadOptions.from_json(body.model_dump())
        try:
            artifact = resolve_model_path(ctx.model_root, options.model)
        except ModelPathRefused as refused:
            return error_response(
                str(refused),
                400,
                param="model",
                code="invalid_value",
                reason=ReasonCode.INVALID_CONFIGURATION,
            )
        handle = await asyncio.to_thread(ctx.scheduler.load, options.replace(model=artifact))
        return JsonResponse(
            {
                "operation_id": str(handle.operation_id),
                "model_id": None if handle.model_id is None else str(handle.model_id),
                "problem": handle.problem,
                "already_available": handle.already_available,
            },
            status_code=200 if handle.already_available else 202,
        )

    @app.post(
        "/api/runtime/models/{model_id}/unload",
        status_code=202,
        response_model=UnloadAccepted,
        response_class=JsonResponse,
        responses=errors(400, 401, 404, 413),
        openapi_extra=json_body(UnloadBody, required=False),
    )
    async def unload(model_id: str, request: Request) -> Response:
        body = await read_body(request, UnloadBody, allow_empty=True)
        if isinstance(body, Response):
            return body
        drain = 30.0 if body.drain_timeout_s is None else body.drain_timeout_s
        operation = ctx.scheduler.unload(model_id, force=body.force, drain_timeout_s=drain)
        if operation is None:
            return error_response(
                "model is not loaded",
                404,
                code="model_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return JsonResponse({"operation_id": str(operation), "model_id": model_id}, status_code=202)

    @app.post(
        "/api/runtime/operations/{operation_id}/cancel",
        status_code=202,
        response_model=CancelAccepted,
        response_class=JsonResponse,
        responses=errors(400, 401),
    )
    async def cancel(
        operation_id: Annotated[str, PathParam(pattern=LOGICAL_ID_PATTERN)],
    ) -> Response:
        try:
            operation = LogicalId(operation_id)
        except InvalidLogicalId:
            return error_response(
                "not an operation id",
                400,
                param="operation_id",
                code="invalid_value",
                reason=ReasonCode.INVALID_CONFIGURATION,
            )
        ctx.host.cancel(operation, ReasonCode.CANCELLATION)
        return JsonResponse(
            {"operation_id": operation_id, "cancel_requested": True}, status_code=202
        )

    @app.post(
        "/api/runtime/sessions/{session_id}/save",
        status_code=202,
        response_model=SessionSaveAccepted,
        response_class=JsonResponse,
        responses=errors(400, 401, 404),
    )
    async def save_session(
        session_id: Annotated[str, PathParam(pattern=LOGICAL_ID_PATTERN)],
    ) -> Response:
        """Save a live session's KV state now (it is saved at an unload anyway): the outcome
        is `cache_state_export_completed` / `_failed`; a file saved so survives an engine
        crash too (the next load restores it)."""
        if not ctx.scheduler.save_session(session_id):
            return error_response(
                "no such live session, or session persistence is off",
                404,
                code="session_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return JsonResponse({"session_id": session_id, "save_requested": True}, status_code=202)

    @app.post(
        "/api/runtime/shutdown",
        status_code=202,
        response_model=ShutdownAccepted,
        response_class=JsonResponse,
        responses=errors(401),
    )
    async def shutdown() -> Response:
        ctx.request_shutdown()
        return JsonResponse({"stopping": True}, status_code=202)

    @app.get(
        "/api/runtime/events/v1",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "Live SSE frames: runtime_state, runtime_event, runtime_health, "
                "runtime_replay_gap (resumable by cursor)",
                "content": {
                    SSE: {
                        "schema": sse_event(
                            [
                                "runtime_state",
                                "runtime_event",
                                "runtime_health",
                                "runtime_replay_gap",
                            ]
                        )
                    }
                },
            },
            **errors(401, 429),
        },
    )
    async def events(
        request: Request,
        since: Annotated[str | None, Query(description="Resume after this cursor")] = None,
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", description="Resume after this cursor")
        ] = None,
    ) -> Response:
        peer = request.client.host if request.client else "unknown"
        if not ctx.limiter.allow(peer):
            return error_response(
                "too many event-stream reconnects; slow down",
                429,
                code="rate_limit_exceeded",
                headers={"Retry-After": "2"},
            )
        return StreamingResponse(
            _event_stream(ctx, request, last_event_id or since),
            media_type=SSE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    register_openai_routes(app, ctx)
    _document(app)
    return app


PUBLIC: Final[dict[str, Any]] = {"security": []}


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


class ModelPathRefused(ValueError):
    """The load path is not acceptable; the message names why, never the path."""


def resolve_model_path(model_root: Path | None, path: str) -> str:
    """The artifact path to load. Without a model root: the path as given (`~` expanded).

    With a root, a relative path is taken relative to it, and the result — symlinks and `..`
    resolved — must lie inside the (resolved) root, or `ModelPathRefused`. The unresolved path
    is returned so a symlinked file keeps its own name as the model id; the host resolves it
    again when it loads (whoever can swap links inside the root in between can already put any
    file there)."""
    try:
        candidate = Path(path).expanduser()
    except RuntimeError as error:  # `~user` of an unknown user
        raise ModelPathRefused("model path names an unknown home directory") from error
    if model_root is None:
        return str(candidate)
    try:
        root = model_root.expanduser().resolve()
        if not candidate.is_absolute():
            candidate = root / candidate
        real = candidate.resolve()
    except (OSError, RuntimeError, ValueError) as error:  # symlink loop, bad bytes
        raise ModelPathRefused("model path cannot be resolved") from error
    if not real.is_relative_to(root):
        raise ModelPathRefused("model path is outside the model root")
    return str(candidate)


def _parse_cursor(value: str) -> tuple[str, int] | None:
    parts = value.split(":")
    if len(parts) != 3 or parts[0] != "rt1":
        return None
    try:
        return parts[1], int(parts[2])
    except ValueError:
        return None


async def _event_stream(
    ctx: ApiContext, request: Request, last_event_id: str | None
) -> AsyncIterator[bytes]:
    dispatcher = ctx.host.pipeline.dispatcher
    instance = ctx.instance_id
    subscription = dispatcher.subscribe(f"sse-{uuid.uuid4().hex[:8]}", ctx.stream_queue_size)
    sent = 0
    try:
        current = dispatcher.stats().dispatched
        yield frame(
            "runtime_state",
            {"state": state_document(ctx.host.pipeline.state)},
            cursor=dispatcher.cursor(current),
            instance=instance,
            sequence=current,
        )
        if last_event_id:
            parsed = _parse_cursor(last_event_id)
            if parsed is None or parsed[0] != instance:
                yield _gap(ctx, "stale_instance")
            else:
                items, gap = dispatcher.replay_since(parsed[1])
                if gap:
                    yield _gap(ctx, "evicted", parsed[1])
                for replayed in items:
                    yield _event_frame(ctx, replayed)
                    sent = replayed.sequence
        next_keepalive = time.monotonic() + ctx.keepalive_s
        next_health = time.monotonic() + 5.0
        next_disconnect_check = 0.0
        while True:
            try:
                items = subscription.get_many(SSE_FRAMES_PER_WRITE, 0)
            except SubscriptionClosed:
                return  # lagged past its bound (or shutdown): the client resumes with its cursor
            if items:
                # One write for what gathered since the last look, not one per event.
                fresh = [item for item in items if item.sequence > sent]
                if fresh:
                    yield b"".join(_event_frame(ctx, item) for item in fresh)
                    sent = fresh[-1].sequence
                continue
            now = time.monotonic()
            if now >= next_health:
                next_health = now + 5.0
                current = dispatcher.stats().dispatched
                yield frame(
                    "runtime_health",
                    {"health": health_counters(ctx)},
                    cursor=dispatcher.cursor(current),
                    instance=instance,
                    sequence=current,
                )
            if now >= next_keepalive:
                next_keepalive = now + ctx.keepalive_s
                yield b": keepalive\n\n"
            if ctx.stopping():
                return
            # Starlette's is_disconnected() costs ~0.9% of a core at 20 Hz, taken from the
            # engine's decode on a small machine; StreamingResponse notices a disconnect by
            # itself, so this is only a backstop: once a second is enough.
            if now >= next_disconnect_check:
                next_disconnect_check = now + 1.0
                if await request.is_disconnected():
                    return
            await asyncio.sleep(0.05)
    finally:
        dispatcher.unsubscribe(subscription)


def _event_frame(ctx: ApiContext, item: Dispatched) -> bytes:
    return event_frame(
        item.event,
        cursor=ctx.host.pipeline.dispatcher.cursor(item.sequence),
        instance=ctx.instance_id,
        sequence=item.sequence,
    )


def _gap(ctx: ApiContext, reason: str, asked: int | None = None) -> bytes:
    """The gap frame for a subscriber that resumed past what is retained; the runtime's own
    event system hears of it too (``runtime_replay_gap``: counted in the state's health)."""
    dispatcher = ctx.host.pipeline.dispatcher
    oldest, latest = dispatcher.retained_range()
    ctx.host.pipeline.submit(
        make_event(
            EventId.RUNTIME_REPLAY_GAP,
            summaries=summaries(
                expected_sequence=None if asked is None else asked + 1,
                received_sequence=oldest,
            ),
        )
    )
    return frame(
        "runtime_replay_gap",
        {
            "gap": {
                "reason": reason,
                "oldest_available": dispatcher.cursor(oldest),
                "latest_available": dispatcher.cursor(latest),
            }
        },
        cursor=dispatcher.cursor(latest),
        instance=ctx.instance_id,
        sequence=latest,
    )
