"""The dashboard over a running runtime: `LiveSource` (its SSE event stream) and `LiveControl`
(load/unload through its management API).

`LiveSource` follows the `EventSource` contract (skippy_tui.sources): on its own thread it reads
the runtime's SSE stream, decodes each `runtime_event` frame with the wire codec and delivers
the event, and a `DecodeSkipped` per record, field or value the codec did not take. The first
connection replays everything the runtime retained (cursor `rt1:<instance>:0`) so the
client-side reducer starts from the runtime's history. When the
stream breaks it delivers `RuntimeDown(attempt)`, reconnects with backoff — re-reading the
discovery file, so a restarted runtime is found — resuming from the last cursor (or from the
start of a new runtime instance's retained events), and delivers `RuntimeBack()` once frames
flow again. The state document is not decoded into a `RuntimeView`: the replayed events rebuild
the state (a replay gap means the oldest history is missing).

What the runtime may load on demand is in no event, so a second thread (`skippy-tui-loadable`)
reads it from the state document (`loadable_models`) and delivers `LoadableModels`: at start,
within `LOADABLE_MIN_INTERVAL_S` of an event that can change it (a model loaded, failed or
unloaded, a download ended) and at least every `LOADABLE_MAX_AGE_S` (a file copied into the
models directory, presets edited), never more often than every `LOADABLE_MIN_INTERVAL_S`. A read
that fails (the runtime is down) delivers nothing: the last list stays.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from skippy_tui.sources import (
    DecodeSkipped,
    LoadableModels,
    RuntimeBack,
    RuntimeDown,
    Sink,
    SourceItem,
)
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category, DeliveryClass
from skippyctl.output.codec import decode_frame_event

if TYPE_CHECKING:
    from skippyctl.client.http import FrameReader, RuntimeClient
    from skippyctl.config.runtime_settings import RuntimeSettings

BACKOFF_S: Final = (0.5, 1.0, 2.0, 5.0)
POLL_S: Final = 0.1
LOADABLE_MIN_INTERVAL_S: Final = 2.0
"""The loadable list is read at most this often (each read lists the models directory and the
hub cache in the runtime)."""
LOADABLE_MAX_AGE_S: Final = 15.0
"""…and at least this often, for changes no event announces (files, presets)."""
_LOADABLE_CATEGORIES: Final = frozenset(
    {
        Category.MODEL_PREPARATION,
        Category.MODEL_LOADING,
        Category.MODEL_AVAILABILITY,
        Category.MODEL_UNLOADING,
    }
)
_LOADABLE_DELIVERY: Final = frozenset({DeliveryClass.TERMINAL, DeliveryClass.STATE_TRANSITION})


def changes_loadable(event: Event) -> bool:
    """Whether ``event`` can change what the runtime lists as loadable (a model's load, its
    availability or unload, a download: their terminals and state transitions)."""
    return event.category in _LOADABLE_CATEGORIES and event.delivery in _LOADABLE_DELIVERY


def _cursor_for(client: RuntimeClient, cursor: str | None) -> str:
    """Resume from `cursor` when it belongs to this runtime instance, else replay from 0."""
    instance = client.discovery.process_instance_id
    if cursor is not None and cursor.split(":")[1:2] == [instance]:
        return cursor
    return f"rt1:{instance}:0"


class LiveSource:
    """An `EventSource` over the runtime's live SSE stream, reconnecting when it breaks."""

    def __init__(self, client: RuntimeClient, settings: RuntimeSettings) -> None:
        """``settings``: the process's (read once at its start), which say where the discovery
        file is to find a restarted runtime again."""
        self._client = client
        self._settings = settings
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sink: Sink | None = None
        self._thread: threading.Thread | None = None
        self._loadable_thread: threading.Thread | None = None
        self._loadable_due = threading.Event()
        self.cursor: str | None = None
        self.delivered = 0
        self.reconnects = 0
        self.loadable_reads = 0
        """State documents read for the loadable list (tests wait on it)."""

    @property
    def description(self) -> str:
        return f"live {self._client.discovery.url}"

    @property
    def client(self) -> RuntimeClient:
        """The client of the runtime currently followed (replaced when it restarted)."""
        return self._client

    def start(self, sink: Sink) -> None:
        if self._thread is not None:
            raise RuntimeError("source already started")
        self._sink = sink
        self._thread = threading.Thread(target=self._run, name="skippy-tui-live", daemon=True)
        self._loadable_thread = threading.Thread(
            target=self._refresh_loadable, name="skippy-tui-loadable", daemon=True
        )
        self._thread.start()
        self._loadable_thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._loadable_due.set()  # wakes the loadable thread to see the stop
        with self._lock:
            self._sink = None
        for thread in (self._thread, self._loadable_thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout_s)

    def _deliver(self, item: SourceItem) -> None:
        with self._lock:  # serialised with stop(): nothing is delivered after it returns
            if self._sink is not None:
                self._sink(item)

    def _refresh_loadable(self) -> None:
        """Read the loadable list when due (see the module's docstring), until stopped."""
        from skippyctl.client.http import ApiError, RuntimeUnreachable
        from skippyctl.output.state_reader import read_state_document

        while not self._stop.is_set():
            self._loadable_due.clear()
            try:
                document = self._client.state()
            except (RuntimeUnreachable, ApiError):
                pass  # down or refusing: the last list stays until a read succeeds
            else:
                self.loadable_reads += 1
                self._deliver(LoadableModels(read_state_document(document).loadable))
            if self._stop.wait(LOADABLE_MIN_INTERVAL_S):
                return
            self._loadable_due.wait(LOADABLE_MAX_AGE_S - LOADABLE_MIN_INTERVAL_S)

    def _run(self) -> None:
        from skippyctl.client.http import FrameReader

        attempt = 0
        connect = True
        while not self._stop.is_set():
            if connect:
                reader = FrameReader(self._client, _cursor_for(self._client, self.cursor))
                flowing = self._pump(reader, announce_back=attempt > 0)
                if self._stop.is_set():
                    reader.close()  # its thread may wait for room nobody will make
                    return
                # Drop this client's connections: a stopping runtime waits for open ones.
                self._client.close()
                attempt = 1 if flowing else attempt + 1
            else:
                attempt += 1
            self._deliver(RuntimeDown(attempt))
            self.reconnects += 1
            if self._stop.wait(BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1]):
                return
            connect = self._reattach()

    def _reattach(self) -> bool:
        """Find the runtime again through the discovery file (it may have restarted on a new
        port, token or instance); False while none answers. Reconnecting only to a runtime that
        answers /health keeps a stopping runtime free of new streams."""
        from skippyctl.client.http import RuntimeUnreachable
        from skippyctl.client.launch import connect

        try:
            client = connect(self._settings, autostart=False)
        except RuntimeUnreachable:
            return False
        self._client.close()
        self._client = client
        return True

    def _pump(self, reader: FrameReader, announce_back: bool) -> bool:
        """Deliver the reader's events until its stream ends; True if any frame arrived."""
        flowing = False
        while not self._stop.is_set():
            frame = reader.get(POLL_S)
            if frame is False:
                continue
            if frame is None or isinstance(frame, Exception):
                return flowing
            assert not isinstance(frame, bool)
            if not flowing:
                flowing = True
                if announce_back:
                    self._deliver(RuntimeBack())
                    self._loadable_due.set()  # a restarted runtime may know other models
            if frame.name != "runtime_event":
                continue
            self.cursor = frame.cursor or self.cursor
            event, skipped = decode_frame_event(frame.data)
            for reason in skipped:
                self._deliver(DecodeSkipped(reason))
            if event is None:
                continue
            self._deliver(event)
            self.delivered += 1
            if changes_loadable(event):
                self._loadable_due.set()
        return flowing


class LiveControl:
    """`RuntimeControl` over the management API (called from a worker thread); given the
    `LiveSource`, it follows the source to a restarted runtime."""

    def __init__(self, client: RuntimeClient, source: LiveSource | None = None) -> None:
        self._fixed = client
        self._source = source

    @property
    def _client(self) -> RuntimeClient:
        return self._source.client if self._source is not None else self._fixed

    def load(self, path: str) -> None:
        from skippyctl.client.http import ApiError, RuntimeUnreachable
        from skippyctl.config.load_options import LoadOptions

        try:
            self._client.load(LoadOptions(path))
        except ApiError as error:
            raise RuntimeError(f"load refused: {error}") from error
        except RuntimeUnreachable as error:
            raise RuntimeError(f"runtime unreachable: {error}") from error

    def unload(self, model_id: str, force: bool) -> None:
        from skippyctl.client.http import ApiError, RuntimeUnreachable

        try:
            self._client.unload(model_id, force, None)
        except ApiError as error:
            raise RuntimeError(f"unload refused: {error}") from error
        except RuntimeUnreachable as error:
            raise RuntimeError(f"runtime unreachable: {error}") from error
