"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

Request bodies are validated by the models in `skippyctl.api.schemas` (a wrong type or an
unsupported parameter is a 400 naming it). Streaming responses are SSE `data: {chunk}` lines
ending in `data: [DONE]`; with `stream_options.include_usage` every chunk carries `usage: null`
and one last chunk with `choices: []` carries the request's usage, as OpenAI does. A failure after
the stream started is sent as one `data: {"error": …}` line before `[DONE]` (the official client
raises it). A client that goes away cancels its request (between decode steps). Sessions come
from the `user` field or an `X-Session-Id` header and are mapped to opaque ids by the scheduler.

A chat request with `tools` (and `tool_choice` not `none`) has its reply read for tool calls
(`skippyctl.api.tool_calls`): found calls are the message's `tool_calls` (`content` null when the
reply was only calls, `finish_reason: "tool_calls"`), streamed as `delta.tool_calls` chunks as
OpenAI streams them; the count goes to the request's receipt before the response's last byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from skippyctl.api.context import ApiContext
from skippyctl.api.direct_stream import SseSocketSink, sse_template, stream_offer, transport
from skippyctl.api.errors import JsonResponse, error_body, error_response
from skippyctl.api.forced_tool_calls import forced_tool_call
from skippyctl.api.logprobs import chat_logprobs, completion_logprobs
from skippyctl.api.model_demand import loadable_document, loadable_models, serving_model
from skippyctl.api.schemas import (
    SSE,
    ChatCompletion,
    ChatCompletionBody,
    Completion,
    CompletionBody,
    ModelList,
    errors,
    json_body,
    read_body,
    sse_event,
)
from skippyctl.api.schemas import ChatMessage as ChatMessageBody
from skippyctl.api.tool_calls import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    Delta,
    ToolCallStream,
    parse_reply,
)
from skippyctl.config.tool_call_format import ToolCallFormat
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.codec.encode import rfc3339
from skippyctl.reducer.state import LOADING_MODEL_STATES, SERVING_MODEL_STATES
from skippyctl.runtime.model_server import ModelServer, Rejection
from skippyctl.runtime.requests import (
    ChatMessage,
    Finished,
    GenerationParams,
    InvalidRequest,
    RequestHandle,
    TextChunk,
    TokenLogprob,
    ToolCall,
)

# A failed generation's reason -> (HTTP status, OpenAI `code`). `context_length_exceeded` is the
# code OpenAI itself uses (clients match on it); the reason code says `context_exhausted`.
_FAILURE_STATUS: Final = {
    ReasonCode.CONTEXT_EXHAUSTED: (400, "context_length_exceeded"),
    ReasonCode.INVALID_CONFIGURATION: (400, "invalid_request"),
    ReasonCode.UNSUPPORTED_CAPABILITY: (400, "unsupported_parameter"),
    ReasonCode.TIMEOUT: (504, "timeout"),
    ReasonCode.PROCESS_CRASH: (503, "engine_crashed"),
    ReasonCode.STAGE_UNAVAILABLE: (503, "model_unavailable"),
    ReasonCode.OUT_OF_MEMORY: (503, "out_of_memory"),
    ReasonCode.RESOURCE_ALLOCATION_FAILURE: (503, "resource_exhausted"),
    ReasonCode.CANCELLATION: (499, "cancelled"),
}
_FINISH: Final = {"eos": "stop", "stop": "stop", "length": "length"}
COMPLETION_DEFAULT_MAX_TOKENS: Final = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS: Final = 256
ENGINE_STREAM_GRACE_S: Final = 5.0
"""How long a stream the host ended (its deadline) waits for the engine to let go of the
client's connection before the host writes the stream's end; past it the connection is closed
instead (the engine is stuck, and a late write of its own would corrupt the stream)."""

T = TypeVar("T")


def _params(
    body: CompletionBody | ChatCompletionBody, form: ToolCallFormat | None = None
) -> GenerationParams:
    """The host's parameters from a validated body (ranges are GenerationParams' to check);
    `form`: the tool-call form of the model's chat template (a forced call is written in it)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    bias = tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items())
    messages: tuple[ChatMessage, ...] | None = None
    logprobs: int | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    template_kwargs: dict[str, Any] | None = None
    prompt: str | None = None
    json_schema = None if body.response_format is None else body.response_format.schema_text()
    json_schema_tags: tuple[str, str] | None = None
    if isinstance(body, ChatCompletionBody):
        wanted = (
            body.max_tokens if body.max_completion_tokens is None else body.max_completion_tokens
        )
        max_tokens = CHAT_DEFAULT_MAX_TOKENS if wanted is None else wanted
        messages = tuple(_chat_message(m) for m in body.messages)
        if body.top_logprobs and not body.logprobs:
            raise InvalidRequest("top_logprobs", "top_logprobs needs logprobs: true")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        if body.tools and body.tool_choice != "none":  # `none`: no tools reach the template
            tools = tuple(t.model_dump(exclude_none=True) for t in body.tools)
        template_kwargs = body.chat_template_kwargs
        forced = forced_tool_call(body, form)
        if forced is not None:
            json_schema, json_schema_tags = forced
    else:
        max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        prompt = body.text()
        logprobs = body.logprobs
    return GenerationParams(
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=_or(body.temperature, 0.8),
        top_k=_or(body.top_k, 40),
        top_p=_or(body.top_p, 0.95),
        min_p=_or(body.min_p, 0.05),
        repeat_penalty=_or(body.repeat_penalty, 1.0),
        presence_penalty=_or(body.presence_penalty, 0.0),
        frequency_penalty=_or(body.frequency_penalty, 0.0),
        repeat_last_n=_or(body.repeat_last_n, 64),
        grammar=body.grammar,
        json_schema=json_schema,
        json_schema_tags=json_schema_tags,
        logprobs=logprobs,
        seed=body.seed,
        logit_bias=bias,
        stop=tuple(stop or ()),
        timeout_s=body.timeout,
        keep_alive_s=body.keep_alive,
        tools=tools,
        chat_template_kwargs=template_kwargs,
    )


def _chat_message(message: ChatMessageBody) -> ChatMessage:
    """A validated message as the engine's template renderer takes it (llama-server's reading:
    text parts stay parts, object arguments become JSON text)."""
    content = message.content
    return ChatMessage(
        role=message.role,
        content=content if isinstance(content, str) else None,
        parts=None
        if content is None or isinstance(content, str)
        else tuple(p.text for p in content),
        tool_calls=tuple(
            ToolCall(
                name=call.function.name,
                arguments=call.function.arguments
                if isinstance(call.function.arguments, str)
                else orjson.dumps(call.function.arguments).decode(),
                id=call.id,
            )
            for call in message.tool_calls or ()
        ),
        name=message.name,
        tool_call_id=message.tool_call_id,
        reasoning_content=message.reasoning_content,
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


@dataclass(frozen=True, slots=True)
class ToolReading:
    """How a chat reply is read for tool calls (api/tool_calls.py): the request's tool names,
    the form the model's template teaches (None: both forms) and whether several calls may be
    taken."""

    names: frozenset[str]
    form: ToolCallFormat | None
    parallel: bool

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.names, form=self.form, parallel=self.parallel)


def _tool_reading(
    body: CompletionBody | ChatCompletionBody, server: ModelServer | None
) -> ToolReading | None:
    """None when the reply is not read for calls: no tools, or `tool_choice: none`."""
    if not isinstance(body, ChatCompletionBody) or body.tool_choice == "none":
        return None
    names = frozenset(_tool_names(body))
    if not names:
        return None
    form = None if server is None else server.tool_call_format
    return ToolReading(names, form, parallel=body.parallel_tool_calls is not False)


def _tool_names(body: ChatCompletionBody) -> list[str]:
    """The names of the request's function tools (validated: every tool names its function)."""
    return [tool.function.name for tool in body.tools or ()]


def _finish_with_calls(finish: str, calls: int) -> str:
    """OpenAI's `tool_calls` when the reply called tools (a reply cut by max_tokens stays
    `length`, as llama-server answers)."""
    return "tool_calls" if calls and finish != "length" else finish


def _session_key(body: CompletionBody | ChatCompletionBody, request: Request) -> str | None:
    header = request.headers.get("x-session-id")
    key = header or body.user
    return key[:256] if key else None


def _stream_responses(model: type[Any]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": "The completion; with `stream: true` an SSE stream of chunks ending "
            "in `data: [DONE]`",
            "content": {SSE: {"schema": sse_event()}},
        },
        **errors(400, 401, 404, 413, 429, 499, 503, 504),
    }


def register_openai_routes(app: FastAPI, ctx: ApiContext) -> None:
    @app.get(
        "/v1/models",
        response_model=ModelList,
        response_class=JsonResponse,
        responses=errors(401),
    )
    async def models() -> Response:
        """Loaded and loading models, then the models the runtime may load on demand."""
        state = ctx.host.pipeline.state
        created = int(ctx.started_wall)
        data: list[dict[str, Any]] = []
        for view in state.models.values():
            if view.state in SERVING_MODEL_STATES:
                shown = "loaded"
            elif view.state in LOADING_MODEL_STATES:
                shown = "loading"
            else:
                continue
            model_id = str(view.model_id)
            card = _model_card(model_id, created, shown, ctx.scheduler.server(model_id))
            if view.idle_expires_wall_ns is not None:
                card["idle_expires_at"] = rfc3339(view.idle_expires_wall_ns)
            data.append(card)
        for entry in await loadable_models(ctx, state):
            card = _model_card(str(entry.model_id), created, "loadable", None)
            listed = loadable_document(entry, ctx.scheduler.default_ttl_s)
            card.update((k, v) for k, v in listed.items() if k != "model_id")
            data.append(card)
        return JsonResponse({"object": "list", "data": data})

    @app.post(
        "/v1/completions",
        response_model=Completion,
        response_class=JsonResponse,
        responses=_stream_responses(Completion),
        openapi_extra=json_body(CompletionBody),
    )
    async def completions(request: Request) -> Response:
        body = await read_body(request, CompletionBody)
        if isinstance(body, Response):
            return body
        return await _generate(ctx, request, body)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        response_class=JsonResponse,
        responses=_stream_responses(ChatCompletion),
        openapi_extra=json_body(ChatCompletionBody),
    )
    async def chat_completions(request: Request) -> Response:
        body = await read_body(request, ChatCompletionBody)
        if isinstance(body, Response):
            return body
        return await _generate(ctx, request, body)


def _model_card(
    model_id: str, created: int, state: str, server: ModelServer | None
) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "skippyctl",
        "state": state,
    }
    if server is not None:
        card["pinned"] = server.pinned
        ttl = server.idle_ttl_s()
        if ttl >= 0:
            card["idle_ttl_s"] = ttl
    return card


def _failure(reason: ReasonCode | None) -> tuple[int, str]:
    return _FAILURE_STATUS.get(reason or ReasonCode.UNKNOWN_FAILURE, (500, "failed"))


def _failure_message(finished: Finished) -> str:
    if finished.reason is ReasonCode.CONTEXT_EXHAUSTED:
        # OpenAI clients show this text as it is: say what did not fit (never the prompt).
        return (
            f"the prompt ({finished.figures.prompt_tokens} tokens) does not fit the model's "
            "context per lane; shorten it, or load the model with a larger --ctx or fewer --lanes"
        )
    if finished.detail:
        return finished.detail  # the chat template's own words (this requester's chat only)
    return f"generation {finished.outcome}"


def _rejection_code(rejection: Rejection) -> str | None:
    if rejection.status == 404:
        return "model_not_found"
    status, code = _FAILURE_STATUS.get(rejection.reason, (None, None))
    return code if status == rejection.status else None


async def _generate(
    ctx: ApiContext, request: Request, body: CompletionBody | ChatCompletionBody
) -> Response:
    chat = isinstance(body, ChatCompletionBody)
    received = time.monotonic_ns()
    found = await serving_model(ctx, body.model)  # loads it on demand when it must
    if isinstance(found, Response):
        return found
    server = found
    try:
        params = _params(body, None if server is None else server.tool_call_format)
    except InvalidRequest as error:
        return error_response(
            str(error),
            400,
            param=error.param,
            code="invalid_value",
            reason=ReasonCode.INVALID_CONFIGURATION,
        )
    handle, rejection = ctx.scheduler.generate(
        body.model, params, _session_key(body, request), received_mono_ns=received
    )
    tools = _tool_reading(body, ctx.scheduler.server(handle.model_id))
    if rejection is None:
        handle.bind_loop(asyncio.get_running_loop())
        # Plain text streamed over HTTP/1.1 may be written by the engine itself: it holds the
        # text until the stream's headers are out and the stream says who writes (_stream).
        handle.hold_text = bool(
            body.stream
            and tools is None
            and params.logprobs is None
            and transport(request.scope) is not None
        )
        rejection = ctx.scheduler.enqueue(handle)
    request_header = {"X-Request-Id": str(handle.request_id)}
    if rejection is not None:
        headers = dict(request_header)
        if rejection.retry_after_s is not None:
            headers["Retry-After"] = str(rejection.retry_after_s)
        return error_response(
            rejection.message,
            rejection.status,
            code=_rejection_code(rejection),
            reason=rejection.reason,
            headers=headers,
        )
    created = int(time.time())
    completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    model_id = str(handle.model_id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(
                ctx, request, handle, chat, completion_id, created, model_id, include_usage, tools
            ),
            media_type=SSE,
            headers={"Cache-Control": "no-cache", **request_header},
        )
    text_parts: list[str] = []
    token_logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
    finished = await _collect(ctx, request, handle, text_parts, token_logprobs)
    if finished is None:
        return Response(status_code=499, headers=request_header)
    if finished.outcome != "completed":
        status, code = _failure(finished.reason)
        return error_response(
            _failure_message(finished),
            status,
            code=code,
            reason=finished.reason,
            headers=request_header,
        )
    finish = _FINISH.get(finished.stop_reason or "", "stop")
    text = "".join(text_parts)
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tools is not None:
            parsed = parse_reply(text, tools.names, form=tools.form, parallel=tools.parallel)
            ctx.scheduler.receipts.note_tool_calls(handle.request_id, len(parsed.calls))
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"] = [call.document() for call in parsed.calls]
                finish = _finish_with_calls(finish, len(parsed.calls))
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None if token_logprobs is None else chat_logprobs(token_logprobs),
            "finish_reason": finish,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None if token_logprobs is None else completion_logprobs(token_logprobs),
            "finish_reason": finish,
        }
        kind = "text_completion"
    return JsonResponse(
        {
            "id": completion_id,
            "object": kind,
            "created": created,
            "model": model_id,
            "choices": [choice],
            "usage": _usage(finished),
        },
        headers=request_header,
    )


def _usage(finished: Finished) -> dict[str, int]:
    prompt, generated = finished.figures.prompt_tokens, finished.figures.generated_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
    }


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
    ctx: ApiContext,
    request: Request,
    handle: RequestHandle,
    parts: list[str],
    logprobs: list[TokenLogprob] | None = None,
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
            if logprobs is not None and chunk.logprobs:
                logprobs.extend(chunk.logprobs)
    except asyncio.CancelledError:
        ctx.scheduler.cancel(handle)
        raise


def _unwritten(direct: asyncio.Transport | None) -> bool:
    """Whether everything written to the connection so far has left the transport's buffer
    (so a direct writer's chunks follow it on the wire)."""
    return direct is not None and not direct.is_closing() and not direct.get_write_buffer_size()


def _hand_to_engine(
    ctx: ApiContext,
    handle: RequestHandle,
    direct: asyncio.Transport | None,
    template: tuple[bytes, bytes] | None,
) -> bool:
    """Say who writes a stream whose engine holds its text: the engine, handed the client's
    connection, when it can; True if so. Otherwise the host (the engine then sends the text)."""
    if not handle.hold_text:
        return False
    if direct is not None and template is not None and _unwritten(direct):
        offer = stream_offer(direct, template)
        if ctx.scheduler.resolve_stream(handle, offer):
            return True
        offer.close()
    ctx.scheduler.resolve_stream(handle, None)
    return False


def _attach_direct(
    handle: RequestHandle, direct: asyncio.Transport | None, template: tuple[bytes, bytes]
) -> bool:
    """Whether a sink on the engine reader now writes the stream's text."""
    if direct is None or not _unwritten(direct):
        return False
    sink = SseSocketSink(direct, asyncio.get_running_loop(), template)
    if handle.attach_sink(sink):
        return True
    sink.close()
    return False


async def _engine_let_go(handle: RequestHandle) -> bool:
    """Whether the engine has let go of the stream's connection (at once, unless the host
    ended the request while the engine still held it: then within ENGINE_STREAM_GRACE_S)."""
    deadline = time.monotonic() + ENGINE_STREAM_GRACE_S
    while handle.engine_stream:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


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
    include_usage: bool = False,
    tools: ToolReading | None = None,
) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"

    def envelope(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": kind,
            "created": created,
            "model": model_id,
            "choices": choices,
        }
        if include_usage:  # OpenAI: null on every chunk but the last, which carries it
            payload["usage"] = usage
        return _sse(payload)

    offset = 0  # characters streamed so far (the legacy shape's text_offset)

    def chunk(
        delta: str | None,
        finish: str | None,
        first: bool = False,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> bytes:
        nonlocal offset
        if chat:
            body: dict[str, Any] = {"role": "assistant"} if first else {}
            if delta is not None:
                body["content"] = delta
            choice: dict[str, Any] = {
                "index": 0,
                "delta": body,
                "logprobs": None if logprobs is None else chat_logprobs(logprobs),
                "finish_reason": finish,
            }
        else:
            choice = {
                "index": 0,
                "text": delta or "",
                "logprobs": None if logprobs is None else completion_logprobs(logprobs, offset),
                "finish_reason": finish,
            }
        offset += len(delta or "")
        return envelope([choice], None)

    def tool_delta(delta: Delta) -> bytes:
        """A content or tool-call delta as one chunk (OpenAI: a call's first chunk carries its
        index, id, type and name with empty arguments; the next ones argument fragments)."""
        if isinstance(delta, ContentDelta):
            return chunk(delta.text, None)
        if isinstance(delta, CallStart):
            call: dict[str, Any] = {
                "index": delta.index,
                "id": delta.id,
                "type": "function",
                "function": {"name": delta.name, "arguments": ""},
            }
        else:
            assert isinstance(delta, ArgumentsDelta)
            call = {"index": delta.index, "function": {"arguments": delta.fragment}}
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None}
        return envelope([{**choice, "finish_reason": None}], None)

    reader = None if tools is None else tools.stream()
    # Plain text goes to the socket from the engine itself, or from the engine reader thread
    # once the sink is attached.
    direct = (
        None
        if reader is not None or handle.params.logprobs is not None
        else transport(request.scope)
    )
    template = None if direct is None else sse_template(lambda text: chunk(text, None))
    offset = 0  # the template's chunk counted its placeholder

    finished = False
    try:
        if chat:
            yield chunk(None, None, first=True)
        if _hand_to_engine(ctx, handle, direct, template):
            template = None
        while True:
            if template is not None and _attach_direct(handle, direct, template):
                template = None
            item = await _next(handle, request)
            if item is None:
                return
            if isinstance(item, TextChunk):
                if reader is not None:
                    for delta in reader.feed(item.text):
                        yield tool_delta(delta)
                elif item.text or item.logprobs:
                    yield chunk(item.text, None, logprobs=item.logprobs)
                continue
            finished = True
            if not await _engine_let_go(handle):
                # Its write could land after our end of the stream: end the connection instead
                # (the socket itself: the engine's descriptor would keep it open).
                if direct is not None:
                    with contextlib.suppress(OSError):
                        direct.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
                    direct.abort()
                return
            if item.outcome == "completed":
                finish = _FINISH.get(item.stop_reason or "", "stop")
                if reader is not None:
                    for delta in reader.finish():
                        yield tool_delta(delta)
                    ctx.scheduler.receipts.note_tool_calls(handle.request_id, reader.call_count)
                    finish = _finish_with_calls(finish, reader.call_count)
                yield chunk(None if chat else "", finish)
                if include_usage:
                    yield envelope([], _usage(item))
            else:
                status, code = _failure(item.reason)
                yield _sse(
                    error_body(_failure_message(item), status, code=code, reason=item.reason)
                )
            yield b"data: [DONE]\n\n"
            return
    finally:
        if not finished:
            ctx.scheduler.cancel(handle)
