"""The runtime's HTTP surface (FastAPI): management, live events, OpenAI-compatible generation.

Auth: a bearer token (from the discovery file) guards control, state and generation endpoints;
`/health` and `/metrics` answer without it. Errors are OpenAI-shaped with a `reason_code`.
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
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.api.openai import register_openai_routes
from skippyctl.events.envelope import InvalidLogicalId, LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.records import event_record
from skippyctl.output.state import state_document
from skippyctl.output.wire import event_object, frame
from skippyctl.pipeline.dispatch import Dispatched, SubscriptionClosed
from skippyctl.reducer.state import LOADING_MODEL_STATES, NodeState
from skippyctl.runtime.host import LoadRequest

PUBLIC_PATHS = frozenset({"/health", "/metrics"})
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
    if ctx.metrics.exporter is not None:  # absent when no telemetry endpoint is configured
        counters["telemetry_exporter"] = ctx.metrics.exporter.stats().as_dict()
    return counters


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
    )
    app.state.ctx = ctx

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        if request.url.path in PUBLIC_PATHS:
            response: Response = await call_next(request)
            return response
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.encode(), ctx.token.encode()
        ):
            return error_response("missing or wrong bearer token", 401, code="invalid_api_key")
        response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> Response:
        code, body = health_document(ctx)
        return JsonResponse(body, status_code=code)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = ctx.metrics.render(ctx.host.pipeline.state, ctx.host.pipeline.health())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/api/runtime/state")
    async def runtime_state(recent: int = 0) -> Response:
        state = ctx.host.pipeline.state
        events = state.recent_events[-max(0, min(recent, 128)) :] if recent > 0 else None
        document = state_document(state, health=health_counters(ctx), recent=events)
        document["engines"] = [
            {"model_id": model_id, "pid": pid} for model_id, pid in ctx.host.engine_pids().items()
        ]
        return JsonResponse(document)

    @app.get("/api/runtime/events/recent")
    async def recent_events(limit: int = 128) -> Response:
        state = ctx.host.pipeline.state
        events = state.recent_events[-max(1, min(limit, 128)) :]
        return JsonResponse({"events": [event_record(e) for e in events]})

    @app.post("/api/runtime/models/load")
    async def load(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        path = body.get("model")
        if not isinstance(path, str) or not path:
            return error_response(
                "'model' (a path to a GGUF file) is required",
                400,
                param="model",
                reason=ReasonCode.INVALID_CONFIGURATION,
            )
        try:
            load_request = LoadRequest(
                artifact=_resolve(ctx.model_root, path),
                alias=_opt(body, "alias", str),
                context_tokens=_opt(body, "ctx", int),
                lanes=_opt(body, "lanes", int) or 1,
                gpu_layers=_opt(body, "gpu_layers", int) or 0,
                timeout_s=_opt(body, "timeout_s", float),
            )
        except (TypeError, ValueError) as error:
            return error_response(str(error), 400, reason=ReasonCode.INVALID_CONFIGURATION)
        max_queue = _opt(body, "max_queue", int)
        handle = await asyncio.to_thread(ctx.scheduler.load, load_request, max_queue)
        return JsonResponse(
            {
                "operation_id": str(handle.operation_id),
                "model_id": None if handle.model_id is None else str(handle.model_id),
                "problem": handle.problem,
                "already_available": handle.already_available,
            },
            status_code=200 if handle.already_available else 202,
        )

    @app.post("/api/runtime/models/{model_id}/unload")
    async def unload(model_id: str, request: Request) -> Response:
        body = await _json_body(request, allow_empty=True)
        if isinstance(body, Response):
            return body
        force = bool(body.get("force", False))
        drain = _opt(body, "drain_timeout_s", float)
        if drain is not None and drain < 0:
            return error_response(
                "drain_timeout_s must not be negative",
                400,
                param="drain_timeout_s",
                reason=ReasonCode.INVALID_CONFIGURATION,
            )
        operation = ctx.scheduler.unload(model_id, force=force, drain_timeout_s=drain or 30.0)
        if operation is None:
            return error_response(
                "model is not loaded",
                404,
                code="model_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return JsonResponse({"operation_id": str(operation), "model_id": model_id}, status_code=202)

    @app.post("/api/runtime/operations/{operation_id}/cancel")
    async def cancel(operation_id: str) -> Response:
        try:
            operation = LogicalId(operation_id)
        except InvalidLogicalId:
            return error_response("not an operation id", 400, param="operation_id")
        ctx.host.cancel(operation, ReasonCode.CANCELLATION)
        return JsonResponse(
            {"operation_id": operation_id, "cancel_requested": True}, status_code=202
        )

    @app.post("/api/runtime/shutdown")
    async def shutdown() -> Response:
        ctx.request_shutdown()
        return JsonResponse({"stopping": True}, status_code=202)

    @app.get("/api/runtime/events/v1")
    async def events(request: Request) -> Response:
        peer = request.client.host if request.client else "unknown"
        if not ctx.limiter.allow(peer):
            return error_response(
                "too many event-stream reconnects; slow down", 429, headers={"Retry-After": "2"}
            )
        last_event_id = request.headers.get("last-event-id") or request.query_params.get("since")
        return StreamingResponse(
            _event_stream(ctx, request, last_event_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    register_openai_routes(app, ctx)
    return app


async def _json_body(request: Request, allow_empty: bool = False) -> dict[str, Any] | Response:
    raw = await request.body()
    if not raw and allow_empty:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return error_response(
            "request body is not valid JSON (UTF-8)", 400, reason=ReasonCode.INVALID_CONFIGURATION
        )
    if not isinstance(body, dict):
        return error_response(
            "request body must be a JSON object", 400, reason=ReasonCode.INVALID_CONFIGURATION
        )
    return body


def _opt(body: dict[str, Any], key: str, kind: type[Any]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"'{key}' must be {kind.__name__}")
    return value


def _resolve(model_root: Path | None, path: str) -> str:
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and model_root is not None:
        candidate = model_root / candidate
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
                    yield _gap(ctx, "evicted")
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
    dispatcher = ctx.host.pipeline.dispatcher
    return frame(
        "runtime_event",
        {"event": event_object(item.event)},
        cursor=dispatcher.cursor(item.sequence),
        instance=ctx.instance_id,
        sequence=item.sequence,
    )


def _gap(ctx: ApiContext, reason: str) -> bytes:
    dispatcher = ctx.host.pipeline.dispatcher
    oldest, latest = dispatcher.retained_range()
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
