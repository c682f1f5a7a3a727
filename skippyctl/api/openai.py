"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

Streaming responses are SSE `data: {chunk}` lines ending in `data: [DONE]`; a failure after the
stream started is sent as one `data: {"error": …}` line before `[DONE]` (the official client
raises it). A client that goes away cancels its request (between decode steps). Sessions come
from the `user` field or an `X-Session-Id` header and are mapped to opaque ids by the scheduler.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from skippyctl.api.context import ApiContext
from skippyctl.api.errors import JsonResponse, error_body, error_response
from skippyctl.events.reasons import ReasonCode
from skippyctl.reducer.state import SERVING_MODEL_STATES
from skippyctl.runtime.requests import (
    ChatTurn,
    Finished,
    GenerationParams,
    InvalidRequest,
    RequestHandle,
    TextChunk,
)

_FAILURE_STATUS = {
    ReasonCode.CONTEXT_EXHAUSTED: (400, "context_length_exceeded"),
    ReasonCode.INVALID_CONFIGURATION: (400, "invalid_request"),
    ReasonCode.TIMEOUT: (504, "timeout"),
    ReasonCode.PROCESS_CRASH: (503, "engine_crashed"),
    ReasonCode.STAGE_UNAVAILABLE: (503, "model_unavailable"),
    ReasonCode.CANCELLATION: (499, "cancelled"),
}
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
_CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _number(body: dict[str, Any], key: str, default: Any, kind: type[Any]) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadRequest(f"'{key}' must be a number", key)
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise _BadRequest(f"'{key}' must be an integer", key)
        return int(value)
    return float(value)


def _params(body: dict[str, Any], chat: bool) -> GenerationParams:
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)
    ):
        raise _BadRequest("'stop' must be a string or a list of strings", "stop")
    bias_raw = body.get("logit_bias") or {}
    if not isinstance(bias_raw, dict):
        raise _BadRequest("'logit_bias' must map token ids to numbers", "logit_bias")
    try:
        bias = tuple((int(k), float(v)) for k, v in bias_raw.items())
    except (TypeError, ValueError) as error:
        raise _BadRequest("'logit_bias' must map token ids to numbers", "logit_bias") from error
    if body.get("n", 1) != 1:
        raise _BadRequest("only n=1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    messages: tuple[ChatTurn, ...] | None = None
    prompt: str | None = None
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise _BadRequest("'messages' must be a non-empty list", "messages")
        turns = []
        for message in raw:
            if not isinstance(message, dict) or message.get("role") not in _CHAT_ROLES:
                raise _BadRequest("each message needs a known 'role'", "messages")
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(
                    p.get("text", "")
                    for p in content
                    if isinstance(p, dict) and p.get("type") == "text"
                )
            if not isinstance(content, str):
                raise _BadRequest("each message needs string 'content'", "messages")
            turns.append(ChatTurn(str(message["role"]), content))
        messages = tuple(turns)
    else:
        raw_prompt = body.get("prompt")
        if isinstance(raw_prompt, list) and len(raw_prompt) == 1 and isinstance(raw_prompt[0], str):
            raw_prompt = raw_prompt[0]
        if not isinstance(raw_prompt, str):
            raise _BadRequest("'prompt' must be a string", "prompt")
        prompt = raw_prompt
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _BadRequest("'seed' must be an integer", "seed")
    try:
        return GenerationParams(
            prompt=prompt,
            messages=messages,
            max_tokens=_number(body, "max_tokens", 16 if not chat else 256, int)
            if max_tokens is not None or not chat
            else 256,
            temperature=_number(body, "temperature", 0.8, float),
            top_k=_number(body, "top_k", 40, int),
            top_p=_number(body, "top_p", 0.95, float),
            min_p=_number(body, "min_p", 0.05, float),
            repeat_penalty=_number(body, "repeat_penalty", 1.0, float),
            seed=seed,
            logit_bias=bias,
            stop=tuple(stop or ()),
            timeout_s=_number(body, "timeout", None, float),
        )
    except InvalidRequest as error:
        raise _BadRequest(str(error), error.param) from error


def _session_key(body: dict[str, Any], request: Request) -> str | None:
    header = request.headers.get("x-session-id")
    user = body.get("user")
    key = header or (user if isinstance(user, str) else None)
    return key[:256] if key else None


def register_openai_routes(app: FastAPI, ctx: ApiContext) -> None:
    @app.get("/v1/models")
    async def models() -> Response:
        state = ctx.host.pipeline.state
        data = [
            {
                "id": str(m.model_id),
                "object": "model",
                "created": int(ctx.started_wall),
                "owned_by": "skippyctl",
            }
            for m in state.models.values()
            if m.state in SERVING_MODEL_STATES
        ]
        return JsonResponse({"object": "list", "data": data})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(ctx, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(ctx, request, chat=True)


async def _generate(ctx: ApiContext, request: Request, chat: bool) -> Response:
    raw = await request.body()
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
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error_response(
            "'model' is required", 400, param="model", reason=ReasonCode.INVALID_CONFIGURATION
        )
    try:
        params = _params(body, chat)
    except _BadRequest as error:
        return error_response(
            str(error), 400, param=error.param, reason=ReasonCode.INVALID_CONFIGURATION
        )
    stream = bool(body.get("stream", False))
    handle, rejection = ctx.scheduler.generate(model, params, _session_key(body, request))
    if rejection is None:
        handle.bind_loop(asyncio.get_running_loop())
        rejection = ctx.scheduler.enqueue(handle)
    request_header = {"X-Request-Id": str(handle.request_id)}
    if rejection is not None:
        headers = dict(request_header)
        if rejection.retry_after_s is not None:
            headers["Retry-After"] = str(rejection.retry_after_s)
        code = "model_not_found" if rejection.status == 404 else None
        return error_response(
            rejection.message, rejection.status, code=code, reason=rejection.reason, headers=headers
        )
    created = int(time.time())
    completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    model_id = str(handle.model_id)
    if stream:
        return StreamingResponse(
            _stream(ctx, request, handle, chat, completion_id, created, model_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **request_header},
        )
    text_parts: list[str] = []
    finished = await _collect(ctx, request, handle, text_parts)
    if finished is None:
        return Response(status_code=499, headers=request_header)
    if finished.outcome != "completed":
        status, code = _FAILURE_STATUS.get(
            finished.reason or ReasonCode.UNKNOWN_FAILURE, (500, "failed")
        )
        return error_response(
            f"generation {finished.outcome}",
            status,
            code=code,
            reason=finished.reason,
            headers=request_header,
        )
    usage = {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }
    finish = _FINISH.get(finished.stop_reason or "", "stop")
    text = "".join(text_parts)
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return JsonResponse(
        {
            "id": completion_id,
            "object": kind,
            "created": created,
            "model": model_id,
            "choices": [choice],
            "usage": usage,
        },
        headers=request_header,
    )


async def _next(handle: RequestHandle, request: Request) -> TextChunk | Finished | None:
    """The next chunk; None when the client went away (the request is then cancelled)."""
    while True:
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a new Task per chunk.
            async with asyncio.timeout(0.5):
                return await handle.next_chunk()
        except TimeoutError:
            if await request.is_disconnected():
                return None


async def _collect(
    ctx: ApiContext, request: Request, handle: RequestHandle, parts: list[str]
) -> Finished | None:
    try:
        while True:
            chunk = await _next(handle, request)
            if chunk is None:
                ctx.scheduler.cancel(handle)
                return None
            if isinstance(chunk, Finished):
                return chunk
            parts.append(chunk.text)
    except asyncio.CancelledError:
        ctx.scheduler.cancel(handle)
        raise


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _stream(
    ctx: ApiContext,
    request: Request,
    handle: RequestHandle,
    chat: bool,
    completion_id: str,
    created: int,
    model_id: str,
) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None, first: bool = False) -> bytes:
        if chat:
            body: dict[str, Any] = {"role": "assistant"} if first else {}
            if delta is not None:
                body["content"] = delta
            choice: dict[str, Any] = {
                "index": 0,
                "delta": body,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        return _sse(
            {
                "id": completion_id,
                "object": kind,
                "created": created,
                "model": model_id,
                "choices": [choice],
            }
        )

    finished = False
    try:
        if chat:
            yield chunk(None, None, first=True)
        while True:
            item = await _next(handle, request)
            if item is None:
                return
            if isinstance(item, TextChunk):
                if item.text:
                    yield chunk(item.text, None)
                continue
            finished = True
            if item.outcome == "completed":
                yield chunk(None if chat else "", _FINISH.get(item.stop_reason or "", "stop"))
            else:
                status, code = _FAILURE_STATUS.get(
                    item.reason or ReasonCode.UNKNOWN_FAILURE, (500, "failed")
                )
                yield _sse(
                    error_body(f"generation {item.outcome}", status, code=code, reason=item.reason)
                )
            yield b"data: [DONE]\n\n"
            return
    finally:
        if not finished:
            ctx.scheduler.cancel(handle)
