"""The unauthenticated routes: `/health` (is the runtime up, can it serve) and `/metrics`
(Prometheus text), and the pipeline counters the state document and the event stream report
as its health."""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI
from starlette.responses import PlainTextResponse, Response

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse
from skippyctl.api.schemas import HealthDocument
from skippyctl.reducer.state import LOADING_MODEL_STATES, NodeState

PUBLIC: Final[dict[str, Any]] = {"security": []}
"""The OpenAPI marker of an operation that needs no bearer token."""


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


def register_health_routes(app: FastAPI, ctx: ApiContext) -> None:
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
