"""A request's model, loaded on demand: what every route that names a model waits on first.

A model that serves is returned at once. One that is still loading, or that the runtime's
catalog knows but has not loaded (``runtime serve --presets`` / ``--models-dir``), is waited
for (``Scheduler.demand``: concurrent requests share one load); the wait is bounded by the
runtime's queue (503 with Retry-After beyond it) and a load that fails answers 503 with its
reason. A name nobody knows is the caller's to refuse (None).
"""

from __future__ import annotations

import asyncio

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.runtime.model_server import ModelServer, Rejection
from skippyctl.runtime.scheduler import DemandRefused


async def serving_model(ctx: ApiContext, name: str) -> ModelServer | JsonResponse | None:
    """The server of ``name`` once it serves; the response to send instead; or None when no
    model of that name is loaded, loading or known. A server that no longer accepts (it is
    unloading, its engine is gone) and that the catalog cannot load again is returned as it is:
    admission refuses it with its own reason."""
    server = ctx.scheduler.server(name)
    if server is not None and server.accepting and server.ready.done():
        return server
    try:
        demand = await asyncio.to_thread(ctx.scheduler.demand, name)
    except DemandRefused as refused:
        return rejection_response(refused.rejection)
    if demand is None:
        return server
    try:
        # Shielded: this request going away must not cancel the load the others wait for.
        return await asyncio.shield(asyncio.wrap_future(demand.future))
    except DemandRefused as refused:
        return rejection_response(refused.rejection)
    finally:
        ctx.scheduler.stop_waiting(demand)


def rejection_response(rejection: Rejection) -> JsonResponse:
    """A refused request in OpenAI's error shape, with Retry-After when waiting would help."""
    sent: dict[str, str] = {}
    if rejection.retry_after_s is not None:
        sent["Retry-After"] = str(rejection.retry_after_s)
    code = {
        404: "model_not_found",
        429: "rate_limit_exceeded",
        503: "model_unavailable",
    }.get(rejection.status)
    return error_response(
        rejection.message, rejection.status, code=code, reason=rejection.reason, headers=sent
    )
