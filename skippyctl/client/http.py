"""A synchronous client for the runtime's management API and live event stream.

`RuntimeClient` talks to the runtime a discovery file names (`skippyctl.client.launch.connect`
finds or starts one). Transport errors surface as `RuntimeUnreachable` (the CLI maps it to its
exit code), API errors as `ApiError`, never as a raw traceback. Messages carry no absolute
path (they may become JSON error records).

A request and its answer (`state`, `load`, `health`, ...) go over the standard library's
`http.client`, one connection each (the runtime is local, a connection costs well under a
millisecond); only the live stream (`frames`) uses httpx, imported when a stream opens. Why:
httpx with httpcore and h11 took ~100 ms to import and set up on this machine, half of a
script's `skippyctl ps --json` (docs/BENCHMARKS.md section 8), which needs one request.
Neither goes through a proxy from the environment (HTTP_PROXY, ALL_PROXY): the runtime a
discovery file names is reached directly.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from queue import Empty, Full, Queue
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlsplit

import orjson

from skippyctl.client.discovery import Discovery

if TYPE_CHECKING:  # types only: the client imports what a command uses when it runs
    import httpx

    from skippyctl.config.load_options import LoadOptions

_PATH_SAFE: Final = "/?=&:@!$'()*+,;%~"
"""Left as they are in a request path (what httpx leaves); anything else is percent-encoded."""
_TRANSPORT_ERRORS: Final = (OSError, http.client.HTTPException)
_PUT_WAIT_S: Final = 0.1


class RuntimeUnreachable(Exception):
    """No runtime answers (and, when asked to, none could be started)."""


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        raw = body.get("error")
        error: dict[str, Any] = raw if isinstance(raw, dict) else {}
        super().__init__(str(error.get("message") or f"HTTP {status}"))
        self.status = status
        self.reason_code: str | None = error.get("reason_code")
        self.body = body


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE frame of the live stream."""

    name: str
    cursor: str | None
    data: dict[str, Any]


class RuntimeClient:
    def __init__(
        self,
        discovery: Discovery,
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context`: how an https runtime's certificate is verified (None: the system's
        CA store). A discovery without a token (a fleet node that needs no key) sends none."""
        self.discovery = discovery
        self.timeout_s = timeout_s
        self._url = urlsplit(discovery.url)
        self._ssl_context = ssl_context
        self._headers = {"Authorization": f"Bearer {discovery.token}"} if discovery.token else {}
        self._lock = threading.Lock()
        self._stream_http: httpx.Client | None = None
        self._closed = False

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """How this client verifies an https runtime (None: the system's CA store)."""
        return self._ssl_context

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._stream_http is not None:
                self._stream_http.close()

    def _exchange(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout_s: float | None = None,
        headers_out: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One request and its whole answer on a connection of its own: (status, body); the
        answer's headers go into ``headers_out`` when given. Raises one of _TRANSPORT_ERRORS
        when the runtime cannot be reached or answers badly."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        connection: http.client.HTTPConnection
        if self._url.scheme == "https":
            connection = http.client.HTTPSConnection(
                self._url.hostname or "",
                self._url.port,
                timeout=timeout,
                context=self._ssl_context or ssl.create_default_context(),
            )
        else:
            connection = http.client.HTTPConnection(
                self._url.hostname or "", self._url.port, timeout=timeout
            )
        try:
            target = quote(self._url.path.rstrip("/") + path, safe=_PATH_SAFE)
            connection.request(method, target, body=body, headers=self._headers)
            response = connection.getresponse()
            if headers_out is not None:
                headers_out.update(response.getheaders())
            return response.status, response.read()
        finally:
            connection.close()

    def reachable(self) -> bool:
        try:
            self._exchange("GET", "/health", timeout_s=2.0)
        except _TRANSPORT_ERRORS:
            return False
        return True

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        headers_out: dict[str, str] | None = None,
    ) -> Any:
        try:
            status, content = self._exchange(
                method, path, None if body is None else orjson.dumps(body), timeout_s, headers_out
            )
        except _TRANSPORT_ERRORS as error:
            raise RuntimeUnreachable(
                f"the runtime at {self.discovery.url} did not answer: {error}"
            ) from error
        try:
            payload = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            payload = {}
        if status >= 400:
            raise ApiError(status, payload if isinstance(payload, dict) else {})
        return payload

    def health(self) -> tuple[int, dict[str, Any]]:
        try:
            status, content = self._exchange("GET", "/health", timeout_s=5.0)
        except _TRANSPORT_ERRORS as error:
            raise RuntimeUnreachable(str(error)) from error
        return status, orjson.loads(content)

    def state(self, recent: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/runtime/state?recent={recent}")
        return result

    def recent_events(self, limit: int = 128) -> list[dict[str, Any]]:
        """The lifecycle and warning events the reducer retained (at most 128 NDJSON records)."""
        result: dict[str, Any] = self._call("GET", f"/api/runtime/events/recent?limit={limit}")
        events = result.get("events")
        return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []

    def native_log(self, limit: int = 2000) -> list[dict[str, Any]]:
        """Drain the engines' opt-in native debug log (empty without capture)."""
        result: dict[str, Any] = self._call(
            "GET", f"/api/runtime/diagnostics/native-log?limit={limit}"
        )
        engines = result.get("engines")
        return [e for e in engines if isinstance(e, dict)] if isinstance(engines, list) else []

    def load(self, options: LoadOptions) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/runtime/models/load", options.to_json())
        return result

    def completion(
        self, body: dict[str, Any], timeout_s: float = 600.0
    ) -> tuple[dict[str, Any], str]:
        """A non-streamed ``/v1/completions`` answer and its request id (for its receipt)."""
        headers: dict[str, str] = {}
        answer: dict[str, Any] = self._call("POST", "/v1/completions", body, timeout_s, headers)
        return answer, headers.get("X-Request-Id", headers.get("x-request-id", ""))

    def models(self) -> list[dict[str, Any]]:
        """``/v1/models``: the loaded, loading and loadable models."""
        listing: dict[str, Any] = self._call("GET", "/v1/models")
        cards: list[dict[str, Any]] = listing.get("data", [])
        return cards

    def pull(self, ref: str, revision: str | None = None) -> str:
        """Start a pull in the runtime (``POST /api/runtime/models/pull``); its operation id."""
        body: dict[str, Any] = {"ref": ref}
        if revision is not None:
            body["revision"] = revision
        result: dict[str, Any] = self._call("POST", "/api/runtime/models/pull", body)
        return str(result["operation_id"])

    def estimate(self, options: LoadOptions) -> dict[str, Any]:
        """What a load of ``options`` would take in memory (its estimate endpoint)."""
        result: dict[str, Any] = self._call(
            "POST", "/api/runtime/models/estimate", options.to_json()
        )
        return result

    def unload(self, model_id: str, force: bool, drain_timeout_s: float | None) -> dict[str, Any]:
        body: dict[str, Any] = {"force": force}
        if drain_timeout_s is not None:
            body["drain_timeout_s"] = drain_timeout_s
        result: dict[str, Any] = self._call("POST", f"/api/runtime/models/{model_id}/unload", body)
        return result

    def receipt(self, request_id: str) -> dict[str, Any] | None:
        """The generation receipt of an ended request; None while there is none (unknown,
        still running, evicted)."""
        try:
            result: dict[str, Any] = self._call(
                "GET", f"/api/runtime/requests/{request_id}/receipt"
            )
        except ApiError as error:
            if error.status in (400, 404):
                return None
            raise
        return result

    def cancel(self, operation_id: str) -> None:
        self._call("POST", f"/api/runtime/operations/{operation_id}/cancel", {})

    def shutdown(self) -> None:
        self._call("POST", "/api/runtime/shutdown", {})

    def _stream_client(self) -> httpx.Client:
        """The httpx client of the live stream, made when the first stream opens."""
        import httpx

        with self._lock:
            if self._closed:
                raise RuntimeUnreachable("the client was closed")
            if self._stream_http is None:
                self._stream_http = httpx.Client(
                    base_url=self.discovery.url,
                    headers=self._headers,
                    timeout=self.timeout_s,
                    verify=self._ssl_context or True,
                    trust_env=False,  # the runtime is reached directly, never through a proxy
                )
            return self._stream_http

    def frames(self, last_event_id: str | None = None) -> Iterator[Frame]:
        """The live stream, frame by frame (blocking). Ends when the server closes it."""
        import httpx

        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        try:
            with self._stream_client().stream(
                "GET",
                "/api/runtime/events/v1",
                headers=headers,
                timeout=httpx.Timeout(30.0, read=None),
            ) as response:
                if response.status_code != 200:
                    raise ApiError(response.status_code, {})
                yield from sse_frames(response.iter_raw())
        except httpx.HTTPError as error:
            raise RuntimeUnreachable(
                f"event stream from {self.discovery.url} broke: {error}"
            ) from error


def sse_frames(chunks: Iterable[bytes]) -> Iterator[Frame]:
    """The frames of an SSE byte stream, however it is cut into chunks: a frame ends at a blank
    line; `event:`, `id:` and `data:` lines (one optional space after the colon; several data
    lines joined by newlines), comments (`:`) and other fields ignored, CR LF and CR taken as
    line ends. A frame without data is no frame. One pass over the raw bytes: it needs no text
    decoding of lines it then encodes again for JSON (what httpx's line iterator did)."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        if b"\r" in pending:
            # A CR last may be the first half of a CR LF the chunking cut: it waits.
            held = pending.endswith(b"\r")
            text = bytes(pending[:-1] if held else pending).replace(b"\r\n", b"\n")
            pending = bytearray(text.replace(b"\r", b"\n") + (b"\r" if held else b""))
        yield from _complete_frames(pending)
    if pending.endswith(b"\r"):  # the stream ended: a CR held back was a line end
        pending[-1:] = b"\n"
        yield from _complete_frames(pending)


def _complete_frames(pending: bytearray) -> Iterator[Frame]:
    """The frames complete in `pending`, removed from it."""
    start = 0
    while (end := pending.find(b"\n\n", start)) >= 0:
        frame = _sse_frame(bytes(pending[start:end]))
        start = end + 2
        if frame is not None:
            yield frame
    del pending[:start]


def _sse_frame(block: bytes) -> Frame | None:
    name, cursor, data = "message", None, []
    for line in block.split(b"\n"):
        field, colon, value = line.partition(b":")
        if not colon or not field:
            continue  # a comment (":…"), or a line that is no field
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"id":
            cursor = value.decode("utf-8", "replace")
    if not data:
        return None
    return Frame(name, cursor, orjson.loads(b"\n".join(data)))


MAX_PENDING_FRAMES: Final = 16384
"""Frames a reader holds before it stops reading its socket until some are taken: a runtime
read faster than its stream is consumed then drops the lagging subscriber and says so (a
replay gap), rather than this process holding what nobody reads."""


class FrameReader:
    """Reads a stream's frames on a background thread into a bounded queue (so a caller can
    also react to Ctrl-C and timeouts while waiting). `close()` lets a thread that waits for
    room give up."""

    def __init__(
        self,
        client: RuntimeClient,
        last_event_id: str | None = None,
        max_pending: int = MAX_PENDING_FRAMES,
    ) -> None:
        self.queue: Queue[Frame | Exception | None] = Queue(max_pending)
        self.connected = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, last_event_id), name="skippy-sse-reader", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Nobody will read on: the thread stops waiting for room (it ends with its stream)."""
        self._closed.set()

    def _put(self, item: Frame | Exception | None) -> bool:
        """Queue `item`, waiting for room; False once closed."""
        while not self._closed.is_set():
            try:
                self.queue.put(item, timeout=_PUT_WAIT_S)
                return True
            except Full:
                continue
        return False

    def _run(self, client: RuntimeClient, last_event_id: str | None) -> None:
        try:
            for frame in client.frames(last_event_id):
                self.connected.set()
                if not self._put(frame):
                    return
        except Exception as error:  # noqa: BLE001 - handed to the reading thread as a value
            self._put(error)
        finally:
            self.connected.set()
            self._put(None)

    def get(self, timeout_s: float) -> Frame | Exception | None | bool:
        """A frame, an exception, None at end of stream, or False on timeout."""
        try:
            return self.queue.get(timeout=timeout_s)
        except Empty:
            return False
