"""The management routes under `/api/runtime`: the state document, diagnostics, recent events,
request receipts, model load and unload, operation cancel, session save and shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from starlette.responses import Response

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_response
from skippyctl.api.health_routes import health_counters
from skippyctl.api.model_demand import loadable_document, loadable_models, rejection_response
from skippyctl.api.schemas import (
    CancelAccepted,
    LoadAccepted,
    LoadBody,
    LoadEstimate,
    PullAccepted,
    PullBody,
    ReceiptDocument,
    RecentEvents,
    SessionSaveAccepted,
    ShutdownAccepted,
    StateDocument,
    UnloadAccepted,
    UnloadBody,
    errors,
    json_body,
    read_body,
)
from skippyctl.config.load_options import LoadOptions
from skippyctl.events.envelope import InvalidLogicalId, LogicalId
from skippyctl.events.identity import is_logical_id, model_id_for
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.codec import event_record
from skippyctl.output.redact import redact
from skippyctl.output.state import state_document
from skippyctl.runtime.memory_estimate import estimate_load
from skippyctl.runtime.model_server import Rejection
from skippyctl.runtime.pulls import TooManyPulls
from skippyctl.runtime.scheduler import DemandRefused

LOGICAL_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:+=-]{0,63}$"
"""What `LogicalId` accepts (declared so the OpenAPI document says it)."""


def register_runtime_routes(app: FastAPI, ctx: ApiContext) -> None:
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
        default_ttl_s = ctx.scheduler.default_ttl_s
        document["loadable_models"] = [
            loadable_document(entry, default_ttl_s) for entry in await loadable_models(ctx, state)
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
        options = await _load_options(ctx, request)
        if isinstance(options, Response):
            return options
        handle = await asyncio.to_thread(ctx.scheduler.load, options)
        return JsonResponse(
            {
                "operation_id": str(handle.operation_id),
                "model_id": None if handle.model_id is None else str(handle.model_id),
                "problem": handle.problem,
                "already_available": handle.already_available,
            },
            status_code=200 if handle.already_available else 202,
        )

    pull_route: dict[str, Any] = {
        "status_code": 202,
        "response_model": PullAccepted,
        "response_class": JsonResponse,
        "responses": errors(400, 401, 413, 503),
        "openapi_extra": json_body(PullBody),
    }

    @app.post("/api/runtime/models/pull", **pull_route)
    @app.post("/api/models/pull", **pull_route)
    async def pull(request: Request) -> Response:
        """Fetch a model into the local cache and check it, in the runtime: the pull's
        events (``model_queued`` … ``model_preparation_completed``, download progress) go to
        the runtime's event stream under the operation id answered here; cancel it with
        ``POST /api/runtime/operations/{id}/cancel``. ``/api/models/pull`` is the same call
        under the name operators of other runtimes look for."""
        body = await read_body(request, PullBody)
        if isinstance(body, Response):
            return body
        try:
            operation = ctx.scheduler.pulls.start(body.ref, body.revision)
        except TooManyPulls as error:
            return error_response(
                str(error),
                503,
                code="too_many_pulls",
                reason=ReasonCode.RESERVATION_EXHAUSTED,
                headers={"Retry-After": "5"},
            )
        return JsonResponse({"operation_id": str(operation)}, status_code=202)

    @app.post(
        "/api/runtime/models/estimate",
        response_model=LoadEstimate,
        response_class=JsonResponse,
        responses=errors(400, 401, 404, 413),
        openapi_extra=json_body(LoadBody),
    )
    async def estimate(request: Request) -> Response:
        """What a load with these options would take in memory (weights, KV cache, compute
        buffers), read from the file's header without loading it, beside the runtime's memory
        budget."""
        options = await _load_options(ctx, request)
        if isinstance(options, Response):
            return options
        try:
            found = await asyncio.to_thread(estimate_load, options)
        except OSError:
            return error_response(
                "the model file cannot be read",
                404,
                param="model",
                code="model_not_found",
                reason=ReasonCode.MISSING_ARTIFACT,
            )
        return JsonResponse(
            {
                "model_id": str(model_id_for(options.model, options.alias)),
                **found.document(),
                "memory_budget_bytes": ctx.scheduler.memory_budget_bytes,
                "memory_budget_used_bytes": ctx.scheduler.memory_in_use_bytes(),
            }
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
        if not ctx.scheduler.pulls.cancel(operation):
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


async def _load_options(ctx: ApiContext, request: Request) -> LoadOptions | Response:
    """A load's options from its body, the model's path resolved against the model root; or
    the 400 to answer with."""
    body = await read_body(request, LoadBody)
    if isinstance(body, Response):
        return body
    options = LoadOptions.from_json(body.model_dump())
    given = body.model_dump(exclude_unset=True)
    known = await asyncio.to_thread(_known_load, ctx, options.model, given)
    if isinstance(known, Rejection):
        return rejection_response(known)
    if known is not None:
        return known
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
    return options.replace(model=artifact)


def _known_load(
    ctx: ApiContext, name: str, given: dict[str, Any]
) -> LoadOptions | Rejection | None:
    """The load of a model the runtime may load on demand (a preset, a file of its models
    directory, a cached hub file) named by its id where no file of that name is: the catalog's
    options (an hf:// preset's file prepared from the hub cache, or downloaded into it), with
    what the request set (``given``) on top. None: ``name`` is a path as usual."""
    # An id is a short token without `/`, `~` or NUL: safe to look for as a file name.
    if not is_logical_id(name) or name.lower().endswith(".gguf") or Path(name).exists():
        return None
    entry = ctx.scheduler.catalog.find(name)
    if entry is None:
        return None
    try:
        return ctx.scheduler.entry_options(entry, {k: v for k, v in given.items() if k != "model"})
    except DemandRefused as refused:
        return refused.rejection


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
