"""A request's model, loaded on demand: what every route that names a model waits on first.

A model that serves is returned at once. One that is still loading, or that the runtime's
catalog knows but has not loaded (``runtime serve --presets`` / ``--models-dir``), is waited
for (``Scheduler.demand``: concurrent requests share one load); the wait is bounded by the
runtime's queue (503 with Retry-After beyond it) and a load that fails answers 503 with its
reason. A name nobody knows is the caller's to refuse (None).

``loadable_models`` is what ``/v1/models`` and the state document list as loadable: the
catalog's models that are neither serving nor loading.
"""

from __future__ import annotations

import asyncio
from typing import Any

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.reducer.state import LOADING_MODEL_STATES, SERVING_MODEL_STATES, RuntimeView
from skippyctl.runtime.model_catalog import Loadable
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


async def loadable_models(ctx: ApiContext, state: RuntimeView) -> list[Loadable]:
    """The models the catalog knows that ``state`` has neither serving nor loading, in the
    catalog's order (a failed or unloaded model is loadable again). Reading the catalog may
    touch the disk (the models directory, the hub cache), so it runs off the event loop."""
    present = {
        str(view.model_id)
        for view in state.models.values()
        if view.state in SERVING_MODEL_STATES or view.state in LOADING_MODEL_STATES
    }
    known = await asyncio.to_thread(ctx.scheduler.catalog.loadable)
    return [entry for entry in known if str(entry.model_id) not in present]


def loadable_document(entry: Loadable, default_ttl_s: float) -> dict[str, Any]:
    """One entry of the state document's ``loadable_models``: its id and where it comes from,
    never a path; ``idle_ttl_s`` only when it would unload on its own once loaded."""
    document: dict[str, Any] = {
        "model_id": str(entry.model_id),
        "source": entry.source.value,
        "pinned": entry.pinned,
    }
    ttl = entry.idle_ttl_s(default_ttl_s)
    if ttl is not None:
        document["idle_ttl_s"] = ttl
    return document
