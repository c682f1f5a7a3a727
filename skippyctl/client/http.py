"""A synchronous client for the runtime's management API and live event stream.

`RuntimeClient` talks to the runtime a discovery file names (`skippyctl.client.launch.connect`
finds or starts one). Transport errors surface as `RuntimeUnreachable` (the CLI maps it to its
exit code), API errors as `ApiError`, never as a raw traceback. Messages carry no absolute
path (they may become JSON error records).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from skippyctl.client.discovery import Discovery

if TYPE_CHECKING:  # only a type here: the client imports what a command uses when it runs
    from skippyctl.config.load_options import LoadOptions


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
    def __init__(self, discovery: Discovery, timeout_s: float = 30.0) -> None:
        self.discovery = discovery
        self._http = httpx.Client(
            base_url=discovery.url,
            headers={"Authorization": f"Bearer {discovery.token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def reachable(self) -> bool:
        try:
            self._http.get("/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return True

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(
                method, path, content=None if body is None else orjson.dumps(body)
            )
        except httpx.HTTPError as error:
            raise RuntimeUnreachable(
                f"the runtime at {self.discovery.url} did not answer: {error}"
            ) from error
        try:
            payload = orjson.loads(response.content) if response.content else {}
        except orjson.JSONDecodeError:
            payload = {}
        if response.status_code >= 400:
            raise ApiError(response.status_code, payload if isinstance(payload, dict) else {})
        return payload

    def health(self) -> tuple[int, dict[str, Any]]:
        try:
            response = self._http.get("/health", timeout=5.0)
        except httpx.HTTPError as error:
            raise RuntimeUnreachable(str(error)) from error
        return response.status_code, orjson.loads(response.content)

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

    def frames(self, last_event_id: str | None = None) -> Iterator[Frame]:
        """The live stream, frame by frame (blocking). Ends when the server closes it."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        try:
            with self._http.stream(
                "GET",
                "/api/runtime/events/v1",
                headers=headers,
                timeout=httpx.Timeout(30.0, read=None),
            ) as response:
                if response.status_code != 200:
                    raise ApiError(response.status_code, {})
                name, cursor, data = "message", None, b""
                for line in response.iter_lines():
                    if not line:
                        if data:
                            yield Frame(name, cursor, orjson.loads(data))
                        name, cursor, data = "message", None, b""
                    elif line.startswith(":"):
                        continue
                    elif line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("id: "):
                        cursor = line[4:]
                    elif line.startswith("data: "):
                        data += line[6:].encode()
        except httpx.HTTPError as error:
            raise RuntimeUnreachable(
                f"event stream from {self.discovery.url} broke: {error}"
            ) from error


class FrameReader:
    """Reads a stream's frames on a background thread into a queue (so a caller can also react
    to Ctrl-C and timeouts while waiting)."""

    def __init__(self, client: RuntimeClient, last_event_id: str | None = None) -> None:
        self.queue: SimpleQueue[Frame | Exception | None] = SimpleQueue()
        self.connected = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, last_event_id), name="skippy-sse-reader", daemon=True
        )
        self._thread.start()

    def _run(self, client: RuntimeClient, last_event_id: str | None) -> None:
        try:
            for frame in client.frames(last_event_id):
                self.connected.set()
                self.queue.put(frame)
        except Exception as error:  # noqa: BLE001 - handed to the reading thread as a value
            self.queue.put(error)
        finally:
            self.connected.set()
            self.queue.put(None)

    def get(self, timeout_s: float) -> Frame | Exception | None | bool:
        """A frame, an exception, None at end of stream, or False on timeout."""
        try:
            return self.queue.get(timeout=timeout_s)
        except Empty:
            return False
