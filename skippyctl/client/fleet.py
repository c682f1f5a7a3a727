"""Reaching a fleet's members: a `RuntimeClient` per node (`node_client`), and one merged
live event stream over all of them (`FleetStream`).

The local member is the runtime this user's discovery file names (launched or attached as any
command does); a remote member is reached at its fleet entry's URL with the key its entry names
(read when the node is reached, never kept in a record) and, for https, its pinned certificate
or the system's CA store.

`FleetStream` reads every node's SSE stream on a thread of its own and hands the frames out of
one bounded queue, each with its node's name (a reader that would overfill it waits: its
runtime then drops it as a lagging subscriber and reports the gap, rather than this process
holding what nobody reads). A node whose stream breaks, or that cannot be reached, is
reported (`NodeDown`, with a reason code) and retried with backoff for as long as the stream
runs; it resumes after the last cursor it delivered (`Last-Event-ID`), or from the start of a
new instance's retained events when the runtime there restarted (`NodeUp.restarted`). So every
record a node retained reaches the reader once, in that node's cursor order; what a node lost
while nobody read it is a replay gap frame, as for one runtime.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from queue import Empty, Full, Queue
from typing import TYPE_CHECKING, Any, Final

from skippyctl.client.discovery import Discovery
from skippyctl.client.http import ApiError, Frame, RuntimeClient, RuntimeUnreachable
from skippyctl.config.fleet import LOCAL_NODE, Fleet, FleetEntry, FleetError, unknown_node_message

if TYPE_CHECKING:
    from skippyctl.config.runtime_settings import RuntimeSettings

BACKOFF_S: Final = (0.25, 0.5, 1.0, 2.0, 5.0)
"""Waits between a node's reconnection attempts (the last one repeats)."""
MAX_PENDING: Final = 16384
"""Items the merged queue holds before a node's reader waits for its reader to take some: a
node read faster than the stream is consumed then falls behind in its runtime, which drops it
as a lagging subscriber and says so (a replay gap), instead of this process growing without
bound."""
PUT_WAIT_S: Final = 0.1
RATE_LIMITED_WAIT_S: Final = 2.0
"""The Retry-After of the runtime's 429 to a peer that reconnects too often (api/event_stream)."""


def ssl_context_for(entry: FleetEntry) -> ssl.SSLContext | None:
    """The verification of a https node: its pinned certificate when the entry names one (and
    only it), else None (the system's CA store). Hostnames are checked either way."""
    if entry.cert is None:
        return None
    from skippyctl.client.launch import trust_only

    try:
        return trust_only(entry.cert.expanduser())
    except OSError as error:  # ssl.SSLError is one: a file that holds no certificate
        raise FleetError(
            "fleet_cert_unreadable",
            f"node {entry.name!r}: its pinned certificate cannot be read "
            f"({error.strerror or type(error).__name__})",
        ) from error


def remote_client(entry: FleetEntry, timeout_s: float = 30.0) -> RuntimeClient:
    """A client of a remote member (its instance id is learnt from /health when needed)."""
    discovery = Discovery(
        pid=0,
        url=entry.url,
        token=entry.read_key() or "",
        version="",
        process_instance_id="",
        started_at="",
    )
    return RuntimeClient(discovery, timeout_s=timeout_s, ssl_context=ssl_context_for(entry))


def node_client(
    fleet: Fleet,
    name: str,
    settings: RuntimeSettings,
    autostart: bool = True,
) -> RuntimeClient:
    """A client of member `name`: the local runtime (launched when `autostart`), or a remote
    one. Raises FleetError for an unknown node or an unusable entry, RuntimeUnreachable when
    the local runtime cannot be reached or started."""
    if name == LOCAL_NODE:
        from skippyctl.client.launch import connect

        return connect(settings, autostart=autostart)
    entry = fleet.entry(name)
    if entry is None:
        raise FleetError("fleet_node_unknown", unknown_node_message(fleet, name))
    return remote_client(entry)


def instance_of(client: RuntimeClient) -> tuple[str, str]:
    """(process instance id, version) from the node's /health; RuntimeUnreachable when it
    does not answer as a runtime."""
    try:
        _status, body = client.health()
    except ValueError as error:  # not JSON: something else listens there
        raise RuntimeUnreachable(f"{client.discovery.url} does not answer as a runtime") from error
    instance = body.get("process_instance_id") if isinstance(body, dict) else None
    if not isinstance(instance, str) or not instance:
        raise RuntimeUnreachable(f"{client.discovery.url} does not answer as a runtime")
    version = body.get("version")
    return instance, version if isinstance(version, str) else ""


# -- the merged stream ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeFrame:
    """One SSE frame of one node's stream; `prepared`: what the stream's `prepare` made of it
    on the node's thread (None without one)."""

    node: str
    frame: Frame
    prepared: Any = None


@dataclass(frozen=True, slots=True)
class NodeUp:
    """The node's stream is (again) open. `restarted`: a different runtime instance answers
    than before (its cursor started over)."""

    node: str
    instance: str
    version: str
    restarted: bool = False


@dataclass(frozen=True, slots=True)
class NodeDown:
    """The node cannot be reached or its stream broke; it is retried after `retry_in_s`."""

    node: str
    reason_code: str
    message: str
    attempt: int
    retry_in_s: float


FleetItem = NodeFrame | NodeUp | NodeDown
ClientFactory = Callable[[], RuntimeClient]
Prepare = Callable[[str, Frame], Any]
"""Work on a frame done on its node's thread as it is read (decoding, encoding), so the reader
of the merged queue is not the one thread every node's frames wait for."""


def reason_of(error: BaseException) -> str:
    """The reason code of a node that cannot be followed."""
    if isinstance(error, FleetError):
        return error.reason
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "tls_verify_failed"
        if isinstance(cause, ssl.SSLError):
            return "tls_failed"
        cause = cause.__cause__ or cause.__context__
    if isinstance(error, ApiError):
        if error.status in (401, 403):
            return "node_unauthorized"
        return "node_rate_limited" if error.status == 429 else "node_refused_stream"
    if isinstance(error, StreamClosed):
        return "node_stream_closed"
    return "node_unreachable"


class StreamClosed(Exception):
    """The node closed its stream (it is shutting down, or dropped this subscriber)."""


class _NodeFollower:
    """One node's stream on a thread of its own, reconnecting until stopped."""

    def __init__(
        self,
        name: str,
        factory: ClientFactory,
        out: Queue[FleetItem],
        stop: threading.Event,
        since: str | None,
        prepare: Prepare | None = None,
    ) -> None:
        self.name = name
        self._prepare = prepare
        self._factory = factory
        self._out = out
        self._stop = stop
        self.cursor: str | None = since
        self.instance: str | None = None
        self.streaming = False
        self._client: RuntimeClient | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"skippy-fleet-{name}", daemon=True)

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self.streaming = False
            try:
                self._follow_once()
                raise StreamClosed(f"node {self.name!r} closed its event stream")
            except Exception as error:  # noqa: BLE001 - any failure is this node's state, retried
                if self._stop.is_set():
                    return
                # A stream that flowed and then broke starts its backoff over.
                attempt = 1 if self.streaming else attempt + 1
                wait_s = BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1]
                if isinstance(error, ApiError) and error.status == 429:
                    wait_s = max(wait_s, RATE_LIMITED_WAIT_S)  # the stream's Retry-After
                self._put(NodeDown(self.name, reason_of(error), str(error), attempt, wait_s))
                self._drop_client()
                if self._stop.wait(wait_s):
                    return

    def _put(self, item: FleetItem) -> None:
        """Queue `item`, waiting while the queue is full (until the stream is closed)."""
        while not self._stop.is_set():
            try:
                self._out.put(item, timeout=PUT_WAIT_S)
                return
            except Full:
                continue

    def _drop_client(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def close(self) -> None:
        self._drop_client()

    def _follow_once(self) -> None:
        client = self._factory()
        with self._lock:
            if self._stop.is_set():
                client.close()
                return
            self._client = client
        instance, version = instance_of(client)
        restarted = self.instance is not None and instance != self.instance
        if restarted or self.cursor is None or self.cursor.split(":")[1:2] != [instance]:
            # A new instance (or a first connection without a cursor of this instance):
            # everything it retained, from its start.
            self.cursor = f"rt1:{instance}:0"
        self.instance = instance
        announced = False
        for frame in client.frames(self.cursor):
            if not announced:
                # Connected: the first frame (the runtime_state frame) came.
                self._put(NodeUp(self.name, instance, version, restarted))
                announced = self.streaming = True
            if frame.name == "runtime_event" and frame.cursor:
                self.cursor = frame.cursor
            prepared = None if self._prepare is None else self._prepare(self.name, frame)
            self._put(NodeFrame(self.name, frame, prepared))
            if self._stop.is_set():
                return


class FleetStream:
    """Every node's live stream, merged into one queue (per node in cursor order)."""

    def __init__(
        self,
        factories: Mapping[str, ClientFactory],
        since: Mapping[str, str] | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        self._queue: Queue[FleetItem] = Queue(MAX_PENDING)
        self._stop = threading.Event()
        since = since or {}
        self.followers = {
            name: _NodeFollower(name, factory, self._queue, self._stop, since.get(name), prepare)
            for name, factory in factories.items()
        }
        for follower in self.followers.values():
            follower.thread.start()

    @property
    def nodes(self) -> Sequence[str]:
        return tuple(self.followers)

    def cursors(self) -> dict[str, str]:
        """Where each node's stream would resume (the last cursor delivered per node)."""
        return {n: f.cursor for n, f in self.followers.items() if f.cursor is not None}

    def next(self, timeout_s: float) -> FleetItem | None:
        """The next item, waiting at most `timeout_s` (0: only one already there)."""
        try:
            if timeout_s <= 0:
                return self._queue.get_nowait()
            return self._queue.get(timeout=timeout_s)
        except Empty:
            return None

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        for follower in self.followers.values():
            follower.close()
        deadline = time.monotonic() + timeout_s
        for follower in self.followers.values():
            follower.thread.join(max(0.0, deadline - time.monotonic()))


def fleet_factories(
    fleet: Fleet, settings: RuntimeSettings, nodes: Sequence[str] | None = None
) -> dict[str, ClientFactory]:
    """A client factory per member (all of them, or `nodes`): the local runtime is attached,
    never started, by a fleet view (its absence is a node state like any other)."""
    chosen = list(fleet.names()) if not nodes else list(nodes)
    for name in chosen:
        if name != LOCAL_NODE and fleet.entry(name) is None:
            raise FleetError("fleet_node_unknown", unknown_node_message(fleet, name))

    def factory(name: str) -> ClientFactory:
        if name == LOCAL_NODE:
            return lambda: node_client(fleet, LOCAL_NODE, settings, autostart=False)
        entry = fleet.entry(name)
        assert entry is not None
        return lambda: remote_client(entry)

    return {name: factory(name) for name in chosen}


# -- records: what `events --follow --fleet --json` prints, and what a fleet replay reads ---------

NODE_RECORD: Final = "node_status"
"""The `record` of a node's reachability line in a fleet stream (an event record has none)."""


def node_status_record(item: NodeUp | NodeDown, wall_s: float | None = None) -> dict[str, Any]:
    """The NDJSON record of a node's reachability change (`record: node_status`)."""
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(time.time() if wall_s is None else wall_s, UTC)
    record: dict[str, Any] = {
        "schema_version": 1,
        "record": NODE_RECORD,
        "ts": stamp.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "node": item.node,
    }
    if isinstance(item, NodeUp):
        record.update(
            state="reachable",
            process_instance_id=item.instance,
            version=item.version,
            restarted=item.restarted,
        )
    else:
        record.update(
            state="unreachable",
            reason_code=item.reason_code,
            message=item.message,
            attempt=item.attempt,
            retry_in_s=item.retry_in_s,
        )
    return record


def read_node_status(record: Mapping[str, Any]) -> NodeUp | NodeDown | None:
    """The reachability change a `node_status` record states (None when it is not one, or is
    malformed)."""
    node = record.get("node")
    if record.get("record") != NODE_RECORD or not isinstance(node, str):
        return None
    if record.get("state") == "reachable":
        return NodeUp(
            node,
            str(record.get("process_instance_id") or ""),
            str(record.get("version") or ""),
            bool(record.get("restarted")),
        )
    if record.get("state") == "unreachable":
        attempt, retry = record.get("attempt"), record.get("retry_in_s")
        return NodeDown(
            node,
            str(record.get("reason_code") or "node_unreachable"),
            str(record.get("message") or ""),
            attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1,
            float(retry) if isinstance(retry, int | float) and not isinstance(retry, bool) else 0.0,
        )
    return None
