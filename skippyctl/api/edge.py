"""The outer ASGI layer: the request-body size limit and the last-resort error answer.

Body limit: a request whose `Content-Length` exceeds `MAX_REQUEST_BODY_BYTES` is refused with 413
before a byte of its body is read; a chunked (or lying) body is counted while it is read and
refused the moment it passes the limit — the server never buffers more than the limit plus one
receive chunk. The 413 is OpenAI-shaped (`code: request_body_too_large`, `reason_code:
invalid_configuration`).

Last resort: an exception no handler turned into a response becomes a shaped 500
(`internal_runtime_failure`) here instead of reaching uvicorn, whose traceback log would carry the
exception's message — which may hold a path or a request value (ARCHITECTURE §7). The log line
names only the exception type and the code location.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skippyctl.api.errors import error_response
from skippyctl.events.reasons import ReasonCode

MAX_REQUEST_BODY_BYTES: Final = 8 * 1024 * 1024
"""8 MiB: a prompt of a few million characters (far beyond any context the runtime serves) fits;
anything larger is refused before it is buffered."""

DISCARD_MAX_BYTES: Final = 64 * 1024 * 1024
DISCARD_MAX_S: Final = 5.0
"""Before a 413, the rest of the body is read and dropped (never kept) up to these bounds, so
that the client, still sending, gets to read the answer instead of a connection reset; a client
that sent `Expect: 100-continue` is answered at once and sends nothing."""

_log = logging.getLogger("skippyctl.api")


class BodyTooLarge(Exception):
    """Raised from `receive` when a body passes the limit (caught by `EdgeMiddleware`)."""


class EdgeMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_REQUEST_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            try:
                declared_bytes = int(declared)
            except ValueError:
                declared_bytes = -1
            if declared_bytes < 0:
                await self._refuse(
                    scope,
                    send,
                    "invalid Content-Length header",
                    400,
                    ReasonCode.INVALID_CONFIGURATION,
                )
                return
            if declared_bytes > limit:
                if Headers(scope=scope).get("expect", "").lower() != "100-continue":
                    await _discard(receive)
                await self._too_large(scope, send)
                return
        received = 0
        started = False
        ended = False

        async def limited_receive() -> Message:
            nonlocal received, ended
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                ended = not message.get("more_body", False)
                if received > limit:
                    raise BodyTooLarge
            else:
                ended = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception as error:  # noqa: BLE001 - the last resort: answer, never crash
            if _is_too_large(error):
                if not started:
                    if not ended:
                        await _discard(receive)
                    await self._too_large(scope, send)
                return
            _log.error("unhandled %s in the API at %s", type(error).__name__, _where(error))
            if not started:
                await self._refuse(
                    scope,
                    send,
                    "internal error",
                    500,
                    ReasonCode.INTERNAL_RUNTIME_FAILURE,
                    code="internal_error",
                )

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await self._refuse(
            scope,
            send,
            f"request body larger than {self.max_body_bytes} bytes",
            413,
            ReasonCode.INVALID_CONFIGURATION,
            code="request_body_too_large",
        )

    @staticmethod
    async def _refuse(
        scope: Scope,
        send: Send,
        message: str,
        status: int,
        reason: ReasonCode | None,
        code: str | None = None,
    ) -> None:
        # Connection: close — the client may still be sending a body nobody will read.
        response = error_response(
            message, status, code=code, reason=reason, headers={"Connection": "close"}
        )

        async def no_body() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, no_body, send)


async def _discard(receive: Receive) -> None:
    """Read and drop what is left of a request body, within DISCARD_MAX_BYTES/DISCARD_MAX_S."""
    dropped = 0
    try:
        async with asyncio.timeout(DISCARD_MAX_S):
            while dropped <= DISCARD_MAX_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


def _is_too_large(error: BaseException) -> bool:
    """BodyTooLarge, also when a task group (anyio, in Starlette) wrapped it."""
    if isinstance(error, BodyTooLarge):
        return True
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(lambda e: isinstance(e, BodyTooLarge)) is not None
    return False


def _where(error: BaseException) -> str:
    """`file.py:line` of the innermost frame — never the exception's message."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.tb_frame.f_code.co_filename)}:{frame.tb_lineno}"
