"""The fleet dashboard over running runtimes: `FleetLiveSource` (every node's SSE stream, merged
by `skippyctl.client.fleet.FleetStream`) and `FleetLiveControl` (load/unload on one node).

`FleetLiveSource` follows the `FleetEventSource` contract (skippy_tui.fleet_source). The
`FleetStream` it opens at `start` follows each node on a thread of its own — reconnecting with
backoff, resuming after the last cursor, starting over from a restarted runtime's first event —
and its items are translated here (`fleet_items`), on the source's own thread
(`skippy-tui-fleet`): a node's `runtime_event` frame is decoded with the wire codec into a
`NodeItem` event (and a `NodeItem(DecodeSkipped)` per skip); its `runtime_state` frame, which
opens every connection, gives what it may load on demand (`LoadableModels`, read from the state
document: no event says it, and a fleet view reads it again at each reconnection only); a
`runtime_replay_gap` frame is a `NodeGap`; `NodeUp` and `NodeDown` pass as they are. A node that
cannot be reached is a `NodeDown` with its reason code, retried for as long as the dashboard
runs; the local runtime is attached, never started (`fleet_factories`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from skippy_tui.fleet_source import FleetSink, FleetSourceItem, NodeGap, NodeItem
from skippy_tui.sources import DecodeSkipped, LoadableModels
from skippyctl.client.fleet import ClientFactory, FleetItem, FleetStream, NodeFrame
from skippyctl.output.codec import decode_frame_event

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient
    from skippyctl.config.fleet import Fleet
    from skippyctl.config.runtime_settings import RuntimeSettings

POLL_S: Final = 0.1
"""How long the source waits on the merged stream before it looks at its stop flag again."""


def fleet_items(item: FleetItem) -> list[FleetSourceItem]:
    """What one item of the merged stream is to the dashboard (see the module's docstring)."""
    if not isinstance(item, NodeFrame):
        return [item]
    node, frame = item.node, item.frame
    if frame.name == "runtime_event":
        event, skipped = decode_frame_event(frame.data)
        items: list[FleetSourceItem] = [NodeItem(node, DecodeSkipped(r)) for r in skipped]
        if event is not None:
            items.append(NodeItem(node, event))
        return items
    if frame.name == "runtime_state":
        from skippyctl.output.state_reader import read_state_document

        state = frame.data.get("state")
        document = read_state_document(state if isinstance(state, dict) else {})
        return [NodeItem(node, LoadableModels(document.loadable))]
    if frame.name == "runtime_replay_gap":
        gap = frame.data.get("gap")
        reason = gap.get("reason") if isinstance(gap, dict) else None
        return [NodeGap(node, reason if isinstance(reason, str) else "unknown")]
    return []  # runtime_health: the runtime's own counters, which its events also carry


class FleetLiveSource:
    """A `FleetEventSource` over every member's live SSE stream."""

    def __init__(
        self, factories: Mapping[str, ClientFactory], description: str = "live fleet"
    ) -> None:
        """`factories`: a client factory per node (`skippyctl.client.fleet.fleet_factories`)."""
        self._factories = dict(factories)
        self._description = description
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sink: FleetSink | None = None
        self._stream: FleetStream | None = None
        self._thread: threading.Thread | None = None
        self.delivered = 0

    @property
    def description(self) -> str:
        return self._description

    @property
    def nodes(self) -> Sequence[str]:
        return tuple(self._factories)

    def start(self, sink: FleetSink) -> None:
        if self._thread is not None:
            raise RuntimeError("source already started")
        self._sink = sink
        self._stream = FleetStream(self._factories)
        self._thread = threading.Thread(target=self._run, name="skippy-tui-fleet", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            self._sink = None
        if self._stream is not None:
            self._stream.close(timeout_s)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _deliver(self, item: FleetSourceItem) -> None:
        with self._lock:  # serialised with stop(): nothing is delivered after it returns
            if self._sink is not None:
                self._sink(item)
                self.delivered += 1

    def _run(self) -> None:
        stream = self._stream
        assert stream is not None
        while not self._stop.is_set():
            item = stream.next(POLL_S)
            if item is None:
                continue
            for translated in fleet_items(item):
                self._deliver(translated)


class FleetLiveControl:
    """`FleetControl` over each node's management API (called from a worker thread): a client
    of the node for each call (the local runtime attached, never started), closed after it."""

    def __init__(self, fleet: Fleet, settings: RuntimeSettings) -> None:
        self._fleet = fleet
        self._settings = settings

    def _client(self, node: str) -> RuntimeClient:
        from skippyctl.client.fleet import node_client
        from skippyctl.client.http import RuntimeUnreachable
        from skippyctl.config.fleet import FleetError

        try:
            return node_client(self._fleet, node, self._settings, autostart=False)
        except FleetError as error:
            raise RuntimeError(f"{error} ({error.reason})") from error
        except RuntimeUnreachable as error:
            raise RuntimeError(f"node {node} unreachable: {error}") from error

    def load(self, node: str, path: str) -> None:
        from skippyctl.client.http import ApiError, RuntimeUnreachable
        from skippyctl.config.load_options import LoadOptions

        client = self._client(node)
        try:
            client.load(LoadOptions(path))
        except ApiError as error:
            raise RuntimeError(f"load refused by {node}: {error}") from error
        except RuntimeUnreachable as error:
            raise RuntimeError(f"node {node} unreachable: {error}") from error
        finally:
            client.close()

    def unload(self, node: str, model_id: str, force: bool) -> None:
        from skippyctl.client.http import ApiError, RuntimeUnreachable

        client = self._client(node)
        try:
            client.unload(model_id, force, None)
        except ApiError as error:
            raise RuntimeError(f"unload refused by {node}: {error}") from error
        except RuntimeUnreachable as error:
            raise RuntimeError(f"node {node} unreachable: {error}") from error
        finally:
            client.close()
