"""Per-model admission: the bounded queue in front of one engine's lanes, and every terminal.

A :class:`ModelServer` admits at most `lanes` requests into its engine at once; the rest wait in a
bounded FIFO (`max_queue`); beyond it a request is rejected at once (`request_rejected`,
`reservation_exhausted`, HTTP 429). Every request gets exactly one terminal event and exactly
one `Finished` chunk, whatever happens: completion, cancellation (client gone, forced unload),
timeout (in the queue or in the engine), engine crash (`process_crash`, or `stage_unavailable`
when the host found a stage of the split model gone).

It talks to its engine through :class:`EngineLink` (the supervisor's ``EngineProcess`` is one;
the unit tests use an in-memory double) and to its owner (the scheduler, which routes model ids
to servers and keeps sessions) through :class:`ServerOwner`; the translation of what the engine
says into events is ``runtime/observations.py``.

Threads: engine messages arrive on the engine's reader thread
(:meth:`ModelServer.on_engine_message`);
callers submit from API handlers; the scheduler's housekeeping thread expires deadlines and
checks liveness. One lock guards the queue and running set; events are submitted (nonblocking)
and commands queued (`EngineLink.send` never blocks), never waited on under it.

Invariants:

- Whoever removes a request from the running set (under the lock) — its `GenDone`, the host-side
  deadline, the engine's exit — is the only one that emits its terminal events and delivers its
  `Finished`. Exactly once, whatever order they race in.
- Deadlines are kept by the host whatever the engine does (stopped, stuck in a decode): a running
  request still running `HOST_DEADLINE_GRACE_S` after its deadline is ended here (timed_out), its
  host lane is freed at once and the engine is told to cancel it. The engine's later messages for
  it, `GenDone` included, are ignored (`_abandoned`), so nothing is emitted or freed twice.
- A plain text stream's engine may hold its text (`hold_text`) until told who writes the
  stream (`resolve_stream`): the host, or the engine itself, which is handed the client's
  connection. The handle says so (`engine_stream`) until the engine has let go of it — its
  `GenDone`, even for a request the host ended, or its exit — so the host's own end of the
  stream never meets a write of the engine's on the wire.
- A request whose engine command would exceed the control channel's frame limit is refused at
  admission (`context_exhausted`; `invalid_configuration` for a value JSON cannot carry, such as
  a seed beyond 64 bits): no request can break the channel.
- `ready` resolves once the engine serves (or fails when it exits first, a failed load
  included): what a request for a model still loading waits on (``Scheduler.demand``).
- Idle time: a serving model with nothing queued or running is idle from that moment
  (`idle_since_ns`); with an idle TTL (the latest request's keep_alive, else `ttl_s`; none when
  `pinned`) it says so with `model_idle_timer_started`, and `model_idle_timer_cleared` when a
  request comes first. The scheduler unloads it once the TTL has passed
  (:meth:`claim_idle_expired`, which stops admission in the same lock, so no request is
  admitted into an expiring model). Neither that nor an eviction (:meth:`claim_for_eviction`)
  takes a model whose waiting requests have not arrived yet (:meth:`expect_arrivals`).
- An engine that sends nothing (not even a `Pong`) for `unresponsive_after_s` while its model
  serves is reported once with `model_degraded` (reason `timeout`) and `model_recovery_started`
  (the heartbeat goes on), then with `model_recovery_completed` when it is heard again, or
  `model_recovery_failed` (with the exit's reason) when it exits first. Under the restart
  policy `on-failure`, one still silent a whole window later is killed
  (`EngineLink.kill_unresponsive`): its exit is a crash with reason `timeout`, and the
  scheduler restarts the model.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Final, Protocol, assert_never

from skippyctl.config.load_options import LoadOptions, RestartPolicy
from skippyctl.config.tool_call_format import ToolCallFormat
from skippyctl.engine.channel import (
    MAX_MESSAGE_BYTES,
    MessageTooLarge,
    UnencodableMessage,
    encode_frame,
)
from skippyctl.engine.protocol_commands import (
    AttachStream,
    Cancel,
    Command,
    Detokenize,
    Embed,
    ReleaseText,
    Tokenize,
)
from skippyctl.engine.protocol_messages import (
    EmbeddingAnswer,
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenSpecSwitched,
    GenStarted,
    GenText,
    GenToken,
    Kv,
    ServingMessage,
    SessionChanged,
    StateExported,
    StateImported,
    VocabularyAnswer,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, StopReason, make_event, summaries
from skippyctl.events.reasons import GenerationOutcome, Outcome, ReasonCode
from skippyctl.runtime.observations import (
    KV_EVENTS,
    KV_TRIMMING_CHANGES,
    SESSION_EVENTS,
    Emission,
    ServingEvents,
    done_emissions,
    eviction_reason,
    host_ended_emissions,
    host_stop_reason,
    observation_emissions,
    prefill_ended,
    unstarted_emission,
)
from skippyctl.runtime.requests import Finished, RequestHandle, StreamOffer, TextChunk

HOST_DEADLINE_GRACE_S: Final = 0.2
"""The engine ends a request at its deadline itself (with its token counts); the host ends it this
much later if the engine has not (stopped, stuck in a long decode)."""
_FRAME_MARGIN_BYTES: Final = 256
"""Admission checks the command with this margin: the timeout it carries is recomputed at start."""
_REJECTED: Final = "rejected"


class EngineLink(Protocol):
    """What admission needs of a running engine."""

    @property
    def serving(self) -> bool:
        """The engine has a serving context and has not exited."""
        ...

    def send(self, command: Command) -> bool:
        """Queue a command without blocking; False if the engine is gone. Raises
        MessageTooLarge / UnencodableMessage for a command that cannot be framed."""
        ...

    def attach_stream(self, command: AttachStream, fd: int) -> bool:
        """Hand the engine a client connection for `command`'s request (the caller keeps
        `fd`); never blocks. False if it could not be handed over."""
        ...

    def silent_for_s(self, now_ns: int | None = None) -> float: ...
    def ping(self) -> bool: ...
    def abort_decode(self) -> None: ...
    def kill_unresponsive(self) -> None:
        """End an engine that stopped answering: its exit is a crash (reason ``timeout``)."""
        ...


class ServerOwner(Protocol):
    """What a model server tells its owner (the scheduler)."""

    def session_released(self, handle: RequestHandle) -> None: ...
    def server_exited(self, server: ModelServer, crashed: bool) -> bool:
        """The server's engine is gone (``crashed``: not stopped by the host). True when a
        restart follows: the server keeps its queued requests for it instead of failing them
        (:meth:`ModelServer.take_queued`, :meth:`ModelServer.fail_queued`)."""
        ...


@dataclass(frozen=True, slots=True)
class Liveness:
    heartbeat_interval_s: float
    """A serving engine silent this long is pinged."""
    unresponsive_after_s: float
    """A serving engine silent this long (no pong, no message) is reported degraded."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused before it reached a lane."""

    status: int
    reason: ReasonCode
    message: str
    retry_after_s: int | None = None


ARRIVAL_GRACE_S: Final = 2.0
"""How long a model that has just begun to serve waits for the requests that waited for its
load before it may be unloaded as idle or evicted (:meth:`ModelServer.expect_arrivals`)."""


class ModelNotServing(Exception):
    """The model's engine exited before it served (its load failed, was cancelled, or it
    crashed); the load's events say why."""


class ModelServer:
    """One loaded model: its engine, admission queue and running requests."""

    def __init__(
        self,
        model_id: LogicalId,
        lanes: int,
        max_queue: int,
        events: ServingEvents,
        liveness: Liveness,
        owner: ServerOwner,
    ) -> None:
        self.model_id = model_id
        self.lanes = lanes
        self.max_queue = max_queue
        self.events = events
        self.liveness = liveness
        self.owner = owner
        self.engine: EngineLink | None = None
        self.speculation = "off"
        """How the engine speculates for this model (its load's ``speculation``): receipts say."""
        self.tool_call_format: ToolCallFormat | None = None
        self.pooling: str | None = None
        """An embedding model's pooling (``on_engine_serving``); None: a generative model."""
        """The tool-call form the model's chat template teaches, once the engine serves."""
        self.accepting = True
        self._lock = threading.Lock()
        self._queued: deque[RequestHandle] = deque()
        self._running: dict[str, RequestHandle] = {}
        self._abandoned: dict[str, RequestHandle] = {}
        """Ended by the host while the engine still ran them; their late messages are ignored."""
        self.idle = threading.Condition(self._lock)
        self.unresponsive = False
        self._unresponsive_since_ns = 0
        self.on_state: Callable[[ModelServer, StateExported | StateImported], None] | None = None
        """Told each session state file outcome before its event (the scheduler's state store)."""
        self._engine_asks: dict[str, Future[Any]] = {}
        """Tokenize, detokenize and embed commands awaiting their engine's answer, by id."""
        self._engine_ask_ids = itertools.count(1)
        self.unloading = False
        """An unload of this model started (it never serves again)."""
        self.memory_bytes = 0
        """What its load was estimated to take (the runtime's memory budget counts it)."""
        self.gone = threading.Event()
        """Set once an unload of this model has ended (its engine stopped, or the unload
        failed): an on-demand load of the same id waits for it."""
        self.ready: Future[None] = Future()
        """Resolved when the engine serves; failed (:class:`ModelNotServing`) if it exits
        first."""
        self.options: LoadOptions | None = None
        """The load that made it (a restart after its engine dies loads the same)."""
        self.ttl_s = -1.0
        """Idle seconds before the scheduler unloads the model; -1: never."""
        self.pinned = False
        """Never unloaded on the runtime's own account (no idle TTL, never evicted)."""
        self.idle_since_ns: int | None = None
        """When it last became idle (serving, nothing queued or running); None: busy."""
        self.last_used_ns = time.monotonic_ns()
        """When a request last came or ended (least-recently-used order)."""
        self._expected = 0
        self._expected_until_ns = 0
        """Requests that waited for its load, not yet arrived, and until when they may
        (:meth:`expect_arrivals`)."""
        self._keep_alive_s: float | None = None
        self._idle_timer_ms: float | None = None
        """The idle TTL `model_idle_timer_started` announced, until it is cleared."""

    def tokenize(
        self, content: str, *, add_special: bool, parse_special: bool, with_pieces: bool
    ) -> Future[VocabularyAnswer] | None:
        """``content``'s tokens with this model's vocabulary (see :meth:`_ask_engine`)."""
        return self._ask_engine(
            lambda request_id: Tokenize(
                request_id, content, add_special, parse_special, with_pieces
            )
        )

    def detokenize(self, tokens: tuple[int, ...]) -> Future[VocabularyAnswer] | None:
        """The text of ``tokens`` (see :meth:`_ask_engine`)."""
        return self._ask_engine(lambda request_id: Detokenize(request_id, tokens))

    def embed(
        self, texts: tuple[str, ...], token_lists: tuple[tuple[int, ...], ...]
    ) -> Future[EmbeddingAnswer] | None:
        """One embedding per input (texts, or token lists), from an embedding model's engine
        (see :meth:`_ask_engine`)."""
        return self._ask_engine(lambda request_id: Embed(request_id, texts, token_lists))

    def _ask_engine(self, make: Callable[[str], Command]) -> Future[Any] | None:
        """Send a command answered off the decode step (tokenize, detokenize, embed; ``make``
        builds it from a fresh id) to the serving engine; its answer resolves the future. None
        when no engine serves (the caller says 503); an engine that exits first fails the future
        (``ConnectionError``)."""
        future: Future[Any] = Future()
        with self._lock:
            engine = self.engine
            if engine is None or not engine.serving:
                return None
            request_id = f"v{next(self._engine_ask_ids)}"
            self._engine_asks[request_id] = future
        try:
            sent = engine.send(make(request_id))
        except (MessageTooLarge, UnencodableMessage):
            sent = False
        if not sent:
            with self._lock:
                self._engine_asks.pop(request_id, None)
            return None
        return future

    def _emit(self, handle: RequestHandle, *emissions: Emission | Iterable[Emission]) -> None:
        flat: list[Emission] = []
        for item in emissions:
            if isinstance(item, Emission):
                flat.append(item)
            else:
                flat.extend(item)
        self.events.request(handle, flat)

    # -- admission ------------------------------------------------------------------------------
    def submit(self, handle: RequestHandle) -> Rejection | None:
        self._emit(handle, Emission(EventId.REQUEST_RECEIVED))
        unframable = _unframable(handle)
        with self._lock:
            if self._expected:
                self._expected -= 1
            if unframable is not None:
                rejection = unframable
            elif not self.accepting or self.engine is None:
                rejection = Rejection(503, ReasonCode.STAGE_UNAVAILABLE, "model is not serving")
            elif self.pooling is not None:
                rejection = Rejection(
                    400,
                    ReasonCode.UNSUPPORTED_CAPABILITY,
                    f"model '{self.model_id}' is an embedding model ({self.pooling} pooling): "
                    "it serves /v1/embeddings, not completions",
                )
            elif len(self._running) < self.lanes and not self._queued:
                self._busy_locked(handle)
                self._start_locked(handle)
                return None
            elif len(self._queued) < self.max_queue:
                self._busy_locked(handle)
                self._queued.append(handle)
                depth = len(self._queued)
                self._emit(handle, Emission(EventId.REQUEST_QUEUED, summaries(queue_depth=depth)))
                return None
            else:
                rejection = Rejection(
                    429,
                    ReasonCode.RESERVATION_EXHAUSTED,
                    f"queue full ({self.max_queue} waiting); retry later",
                    retry_after_s=1,
                )
        if rejection.reason is ReasonCode.CONTEXT_EXHAUSTED:
            self._emit(handle, Emission(EventId.CONTEXT_EXHAUSTED, reason=rejection.reason))
        rejected = Emission(
            EventId.REQUEST_REJECTED,
            summaries(queue_capacity=self.max_queue),
            outcome=Outcome.REJECTED,
            reason=rejection.reason,
        )
        self._emit(handle, rejected)
        handle.deliver(Finished(_REJECTED, rejection.reason, None))
        return rejection

    def _start_locked(self, handle: RequestHandle) -> None:
        now = time.monotonic_ns()
        handle.admitted_mono_ns = now
        wait_ms = round((now - handle.received_mono_ns) / 1e6, 3)
        self._emit(handle, Emission(EventId.REQUEST_ADMITTED, summaries(queue_wait_ms=wait_ms)))
        self._running[str(handle.request_id)] = handle
        in_use = summaries(lanes_in_use=len(self._running))
        self._emit(handle, Emission(EventId.REQUEST_EXECUTION_STARTED, in_use))
        timeout = handle.params.timeout_s
        if timeout is not None:
            elapsed = (now - handle.received_mono_ns) / 1e9
            timeout = max(0.001, timeout - elapsed)
        command = handle.params.engine_command(handle.request_id, handle.session_id, timeout)
        if handle.hold_text:
            command = dataclasses.replace(command, hold_text=True)
        assert self.engine is not None
        # If the engine is already gone the send fails silently: its exit handler fails
        # everything in `_running`, this request included, so it still gets its one terminal.
        try:
            self.engine.send(command)
            self._send_resolution_locked(handle)
        except (MessageTooLarge, UnencodableMessage) as error:
            # Admission checked the same command with a margin, so this is not expected; still,
            # the request gets its terminal (off this thread: the server lock is held here).
            reason = (
                ReasonCode.CONTEXT_EXHAUSTED
                if isinstance(error, MessageTooLarge)
                else ReasonCode.INVALID_CONFIGURATION
            )
            threading.Thread(
                target=self._end_running,
                args=(str(handle.request_id), GenerationOutcome.FAILED, reason),
                name=f"skippy-refuse-{handle.request_id}",
                daemon=True,
            ).start()

    def _next_locked(self) -> None:
        while self._queued and len(self._running) < self.lanes and self.accepting:
            self._start_locked(self._queued.popleft())
        if not self._running:
            self.idle.notify_all()
            if not self._queued and self.accepting and self.ready.done():
                self._idle_locked()

    # -- idle time ------------------------------------------------------------------------------
    def idle_ttl_s(self) -> float:
        """The idle TTL that applies now: -1 when pinned, else the latest request's keep_alive,
        else the model's."""
        if self.pinned:
            return -1.0
        return self.ttl_s if self._keep_alive_s is None else self._keep_alive_s

    def _idle_locked(self) -> None:
        now = time.monotonic_ns()
        self.last_used_ns = now
        if self.idle_since_ns is not None:
            return
        self.idle_since_ns = now
        ttl = self.idle_ttl_s()
        if ttl < 0:
            return
        self._idle_timer_ms = ttl * 1000.0
        self.events.always(
            make_event(
                EventId.MODEL_IDLE_TIMER_STARTED,
                scope=Scope(model_id=self.model_id),
                summaries=summaries(idle_ttl_ms=round(ttl * 1000.0, 3)),
                mono_ns=now,
            )
        )

    def _busy_locked(self, handle: RequestHandle) -> None:
        self._keep_alive_s = handle.params.keep_alive_s
        self.last_used_ns = time.monotonic_ns()
        self.idle_since_ns = None
        if self._idle_timer_ms is not None:
            self._idle_timer_ms = None
            self.events.always(
                make_event(EventId.MODEL_IDLE_TIMER_CLEARED, scope=Scope(model_id=self.model_id))
            )

    def idle_expiry_ns(self) -> int | None:
        """When the model's idle TTL runs out (monotonic ns), or None: busy, or no TTL."""
        since = self.idle_since_ns
        ttl = self.idle_ttl_s()
        if since is None or ttl < 0:
            return None
        return since + int(ttl * 1e9)

    def claim_idle_expired(self, now_ns: int) -> bool:
        """True when the idle TTL has run out: admission stops at once (in the same lock as
        admission), and the caller unloads the model."""
        with self._lock:
            expiry = self.idle_expiry_ns()
            if expiry is None or now_ns < expiry:
                return False
            return self._claim_idle_locked()

    def claim_for_eviction(self) -> bool:
        """True when the model serves, is idle and not pinned: admission stops at once and
        the caller unloads it to make room for another model."""
        with self._lock:
            return not self.pinned and self._claim_idle_locked()

    def _claim_idle_locked(self) -> bool:
        if not self.accepting or not self.ready.done() or self._running or self._queued:
            return False
        if self._expected and time.monotonic_ns() < self._expected_until_ns:
            return False  # the requests that waited for its load are on their way in
        self.accepting = False
        return True

    def expect_arrivals(self, count: int) -> None:
        """``count`` requests that waited for this model's load are on their way to admission:
        until they arrive (or :data:`ARRIVAL_GRACE_S` passes) it is neither unloaded as idle
        nor evicted, so a TTL of 0 or a full --max-models cannot take it from under them."""
        with self._lock:
            self._expected = max(0, count)
            self._expected_until_ns = time.monotonic_ns() + int(ARRIVAL_GRACE_S * 1e9)

    def cancel(self, request_id: str, reason: ReasonCode = ReasonCode.CANCELLATION) -> None:
        """Cancel a queued or running request (the client went away, or an unload forces it)."""
        with self._lock:
            queued = next((h for h in self._queued if str(h.request_id) == request_id), None)
            if queued is not None:
                self._queued.remove(queued)
            running = self._running.get(request_id)
        if queued is not None:
            self._finish_unstarted(queued, reason)
        elif running is not None and self.engine is not None:
            self.engine.send(Cancel(request_id))

    def _finish_unstarted(self, handle: RequestHandle, reason: ReasonCode) -> None:
        duration = round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3)
        self._emit(handle, unstarted_emission(reason, duration))
        outcome = (
            GenerationOutcome.TIMED_OUT
            if reason is ReasonCode.TIMEOUT
            else GenerationOutcome.CANCELLED
        )
        handle.deliver(Finished(outcome, reason, None))

    def expire_queued(self, now_ns: int) -> None:
        expired: list[RequestHandle] = []
        with self._lock:
            for handle in list(self._queued):
                timeout = handle.params.timeout_s
                if timeout is not None and now_ns - handle.received_mono_ns > timeout * 1e9:
                    self._queued.remove(handle)
                    expired.append(handle)
        for handle in expired:
            self._finish_unstarted(handle, ReasonCode.TIMEOUT)

    def expire_running(self, now_ns: int) -> None:
        """End, on the host, running requests whose engine has not ended them by their
        deadline (plus a short grace for the engine's own, better-informed terminal)."""
        with self._lock:
            expired = [
                request_id
                for request_id, handle in self._running.items()
                if (deadline := _host_deadline_ns(handle)) is not None and now_ns >= deadline
            ]
        for request_id in expired:
            self._end_running(request_id, GenerationOutcome.TIMED_OUT, ReasonCode.TIMEOUT)

    def next_deadline_ns(self) -> int | None:
        """The earliest host-side deadline of a queued or running request."""
        with self._lock:
            deadlines = [
                d for h in self._running.values() if (d := _host_deadline_ns(h)) is not None
            ]
            deadlines += [
                h.received_mono_ns + int(h.params.timeout_s * 1e9)
                for h in self._queued
                if h.params.timeout_s is not None
            ]
        return min(deadlines, default=None)

    def resolve_stream(self, handle: RequestHandle, offer: StreamOffer | None) -> bool:
        """Say who writes the stream of `handle`, whose engine holds its text: the engine,
        through `offer` (it writes the text to the client's connection itself), or the host
        (None). Told to the engine now if the request runs, or right after its ``Generate``.
        False if the handle cannot take it (the caller keeps `offer`)."""
        with self._lock:
            if not handle.resolve_stream(offer):
                return False
            if str(handle.request_id) in self._running:
                self._send_resolution_locked(handle)
        return True

    def _send_resolution_locked(self, handle: RequestHandle) -> None:
        """Tell the engine who writes `handle`'s stream, once it was said (behind the request's
        ``Generate``): ``AttachStream`` with the connection, or ``ReleaseText``."""
        taken = handle.take_resolution()
        engine = self.engine
        if taken is None or engine is None:
            return
        (offer,) = taken
        request_id = str(handle.request_id)
        fd = None if offer is None else offer.fd
        if offer is not None and fd is not None:
            head, tail = offer.head.decode(), offer.tail.decode()
            handle.engine_stream = engine.attach_stream(AttachStream(request_id, head, tail), fd)
            offer.close()  # the engine has its own descriptor now
        if not handle.engine_stream:
            engine.send(ReleaseText(request_id))

    def _end_running(self, request_id: str, outcome: GenerationOutcome, reason: ReasonCode) -> None:
        """End a running request on the host (its engine has not): claim it, emit its terminal
        events, free its host lane, tell the engine to drop it, deliver its `Finished`."""
        with self._lock:
            handle = self._running.pop(request_id, None)
            if handle is None:
                return  # its GenDone (or the engine's exit) came first: already ended
            self._abandoned[request_id] = handle
        engine = self.engine
        if engine is not None:
            engine.send(Cancel(request_id))
        duration = round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3)
        has_session = handle.session_id is not None
        self._emit(
            handle, host_ended_emissions(outcome, reason, has_session, duration, handle.prefilling)
        )
        with self._lock:
            self._next_locked()
        self.owner.session_released(handle)
        handle.deliver(Finished(outcome, reason, host_stop_reason(reason).value))

    # -- engine liveness (housekeeping thread) --------------------------------------------------
    def check_engine(self, now_ns: int) -> None:
        """Ping a quiet serving engine; report it degraded when it stays silent too long and
        recovered when it is heard again."""
        engine = self.engine
        if engine is None or not engine.serving:
            return
        silent = engine.silent_for_s(now_ns)
        if silent >= self.liveness.heartbeat_interval_s:
            engine.ping()
        unresponsive = silent >= self.liveness.unresponsive_after_s
        options = self.options
        restartable = options is not None and options.restart is RestartPolicy.ON_FAILURE
        if restartable and self.unresponsive and silent >= 2 * self.liveness.unresponsive_after_s:
            # Still silent a whole window after it was reported: stuck, not slow. Its exit is
            # a crash, and the restart policy brings the model back.
            engine.kill_unresponsive()
            return
        if unresponsive is self.unresponsive:
            return
        self.unresponsive = unresponsive
        scope = Scope(model_id=self.model_id)
        if unresponsive:
            self._unresponsive_since_ns = now_ns
            event = make_event(
                EventId.MODEL_DEGRADED,
                scope=scope,
                reason_code=ReasonCode.TIMEOUT,
                duration_ms=round(silent * 1000, 3),
            )
        else:
            event = make_event(
                EventId.MODEL_RECOVERY_COMPLETED,
                scope=scope,
                outcome=Outcome.SUCCESS,
                duration_ms=round((now_ns - self._unresponsive_since_ns) / 1e6, 3),
            )
        # Model availability, not a serving event: it flows with serving events off too.
        self.events.always(event)
        if unresponsive:  # the heartbeat goes on: recovery is under way from now
            self.events.always(make_event(EventId.MODEL_RECOVERY_STARTED, scope=scope))

    def counts(self) -> tuple[int, int]:
        """(running, queued)."""
        with self._lock:
            return len(self._running), len(self._queued)

    # -- engine messages (reader thread) --------------------------------------------------------
    def on_engine_serving(
        self,
        engine: object,
        lanes: int,
        tool_call_format: ToolCallFormat | None = None,
        pooling: str | None = None,
    ) -> None:
        """The engine's context exists with `lanes` lanes (its own choice when the load left
        them out): admit up to that many at once from now on. `tool_call_format`: the form its
        chat template teaches (how the API reads chat replies for tool calls); `pooling`: an
        embedding model's (it serves embeddings, not generation)."""
        with self._lock:
            self.tool_call_format = tool_call_format
            self.pooling = pooling
            self.lanes = lanes
        if not self.ready.done():
            # Unlocked: its callbacks (the scheduler's demands) call back into this server.
            self.ready.set_result(None)
        with self._lock:
            self._next_locked()

    def on_engine_message(self, engine: object, message: ServingMessage) -> None:
        match message:
            case Kv():
                self._on_kv(message)
            case SessionChanged():
                self._on_session(message)
            case StateExported() | StateImported():
                self._on_state(message)
            case VocabularyAnswer() | EmbeddingAnswer():
                with self._lock:
                    asked = self._engine_asks.pop(message.request_id, None)
                if asked is not None:
                    asked.set_result(message)
            case GenDone():
                with self._lock:
                    # Claimed here: whoever pops the request emits its terminal (exactly once).
                    handle = self._running.pop(message.request_id, None)
                    if handle is None:
                        # The host ended it already; the engine has let go of its stream now.
                        abandoned = self._abandoned.pop(message.request_id, None)
                        if abandoned is not None:
                            abandoned.engine_stream = False
                        return
                    handle.engine_stream = False
                self._on_done(handle, message)
            case GenText():
                # Under the lock, so a host-side terminal cannot slip in between: nothing of a
                # request is delivered or emitted after its terminal (neither ever blocks).
                with self._lock:
                    handle = self._running.get(message.request_id)
                    if handle is not None:
                        if message.framed:
                            handle.deliver_framed(message.text.encode("latin-1"))
                        else:
                            handle.deliver(TextChunk(message.text, message.logprobs))
            case (
                GenStarted()
                | GenPrefillProgress()
                | GenPrefillDone()
                | GenFirstToken()
                | GenProgress()
                | GenToken()
                | GenSpecSwitched()
            ):
                with self._lock:
                    handle = self._running.get(message.request_id)
                    if handle is not None:
                        if isinstance(message, GenStarted | GenPrefillDone):
                            handle.prefilling = isinstance(message, GenStarted)
                        has_session = handle.session_id is not None
                        self._emit(handle, observation_emissions(message, has_session))
            case _:
                assert_never(message)

    def _on_done(self, handle: RequestHandle, message: GenDone) -> None:
        """The engine's terminal for a request this thread claimed (popped from `_running`)."""
        duration = round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3)
        has_session = handle.session_id is not None
        self._emit(handle, done_emissions(message, has_session, duration, handle.prefilling))
        with self._lock:
            self._next_locked()
        self.owner.session_released(handle)
        # The engine's figures go on unchanged (the request's receipt is made of them).
        stop, spec_mode = message.stop_reason.value, self.speculation
        handle.deliver(
            Finished(
                message.outcome,
                message.reason,
                stop,
                message.figures,
                spec_mode,
                detail=message.detail,
                written_by="engine" if message.wrote_stream else "host",
            )
        )

    def _on_kv(self, message: Kv) -> None:
        request_id = message.request_id
        self.events.fact(
            KV_EVENTS[message.event],
            Scope(
                model_id=self.model_id,
                request_id=LogicalId(request_id) if request_id else None,
            ),
            summaries(kv_cells_used=message.cells_used, kv_cells_total=message.cells_total),
        )

    def _on_session(self, message: SessionChanged) -> None:
        event_id = SESSION_EVENTS.get(message.event)
        if event_id is None or not message.session:
            return
        scope = Scope(model_id=self.model_id, session_id=LogicalId(message.session))
        numbers = summaries(lanes=message.lane, context_tokens=message.tokens)
        self.events.event(
            make_event(
                event_id,
                scope=scope,
                reason_code=eviction_reason(message.reason),
                duration_ms=message.idle_ms,
                summaries=numbers,
            )
        )
        if message.event in KV_TRIMMING_CHANGES:
            self.events.fact(EventId.CACHE_TRIMMED, scope, numbers)

    def _on_state(self, message: StateExported | StateImported) -> None:
        # The owner's store first: whoever sees the event finds the file kept or removed.
        if self.on_state is not None:
            self.on_state(self, message)
        exported = isinstance(message, StateExported)
        if message.ok:
            event_id = (
                EventId.CACHE_STATE_EXPORT_COMPLETED
                if exported
                else EventId.CACHE_STATE_IMPORT_COMPLETED
            )
        else:
            event_id = (
                EventId.CACHE_STATE_EXPORT_FAILED if exported else EventId.CACHE_STATE_IMPORT_FAILED
            )
        self.events.event(
            make_event(
                event_id,
                scope=Scope(
                    model_id=self.model_id,
                    session_id=LogicalId(message.session) if message.session else None,
                ),
                outcome=Outcome.SUCCESS if message.ok else Outcome.FAILURE,
                reason_code=message.reason,
                duration_ms=message.ms,
                summaries=summaries(context_tokens=message.tokens, state_bytes=message.size_bytes),
            )
        )

    def on_engine_exit(
        self, engine: object, crashed: bool, reason: ReasonCode | None = None
    ) -> None:
        if not self.ready.done():
            self.ready.set_exception(ModelNotServing())
        with self._lock:
            self.accepting = False
            running = list(self._running.values())
            queued = list(self._queued)
            self._running.clear()
            self._queued.clear()
            for handle in (*running, *self._abandoned.values()):
                handle.engine_stream = False  # its descriptors closed with it
            self._abandoned.clear()
            asks = list(self._engine_asks.values())
            self._engine_asks.clear()
            self.idle.notify_all()
        for asked in asks:
            asked.set_exception(ConnectionError("the engine exited"))
        # A crash the host attributed (a lost stage of a split model) ends requests with that
        # reason; an unattributed one with process_crash.
        if reason is None:
            reason = ReasonCode.PROCESS_CRASH if crashed else ReasonCode.STAGE_UNAVAILABLE
        # Asked before anything is failed: a restart that follows keeps the queue waiting.
        restarting = self.owner.server_exited(self, crashed)
        if self.unresponsive:
            self.unresponsive = False
            if not restarting:  # it went silent and never came back: the recovery failed
                self.events.always(
                    make_event(
                        EventId.MODEL_RECOVERY_FAILED,
                        scope=Scope(model_id=self.model_id),
                        outcome=Outcome.FAILURE,
                        reason_code=reason,
                    )
                )
        failed = GenerationOutcome.FAILED
        for handle in running:
            if handle.prefilling:
                self._emit(handle, prefill_ended(failed, reason))
            self._emit(
                handle,
                Emission(EventId.GENERATION_FAILED, outcome=Outcome.FAILURE, reason=reason),
                Emission(EventId.REQUEST_FAILED, outcome=Outcome.FAILURE, reason=reason),
            )
            handle.deliver(Finished(failed, reason, StopReason.ERROR.value))
        if restarting:
            with self._lock:
                self._queued.extend(queued)
        else:
            self._fail_unstarted(queued, reason)

    def take_queued(self) -> list[RequestHandle]:
        """The requests still waiting here, handed to the server of the model's restart."""
        with self._lock:
            queued = list(self._queued)
            self._queued.clear()
        return queued

    def adopt_queued(self, handles: Iterable[RequestHandle]) -> None:
        """Take over requests that waited for the previous engine of this model (a restart):
        they wait here, first in line, until this engine serves (``on_engine_serving``)."""
        with self._lock:
            self._queued.extendleft(reversed(list(handles)))

    def fail_queued(self, reason: ReasonCode) -> None:
        """End every waiting request with ``reason`` (the model will not serve again)."""
        self._fail_unstarted(self.take_queued(), reason)

    def _fail_unstarted(self, handles: Iterable[RequestHandle], reason: ReasonCode) -> None:
        for handle in handles:
            self._emit(
                handle, Emission(EventId.REQUEST_FAILED, outcome=Outcome.FAILURE, reason=reason)
            )
            handle.deliver(Finished(GenerationOutcome.FAILED, reason, None))

    # -- unload ---------------------------------------------------------------------------------
    def drain(self, force: bool, drain_timeout_s: float) -> int:
        """Stop admitting; wait for running requests (or cancel them). Returns how many were
        cancelled."""
        with self._lock:
            self.accepting = False
            queued = list(self._queued)
            self._queued.clear()
            running_ids = list(self._running)
        for handle in queued:
            self._finish_unstarted(handle, ReasonCode.CANCELLATION)
        cancelled = len(queued)
        if force:
            if self.engine is not None and running_ids:
                self.engine.abort_decode()  # a long decode in flight stops now, not at its end
            for request_id in running_ids:
                self.cancel(request_id)
            cancelled += len(running_ids)
        deadline = time.monotonic() + (1.0 if force else drain_timeout_s)
        with self._lock:
            while self._running and time.monotonic() < deadline:
                self.idle.wait(max(0.01, deadline - time.monotonic()))
            leftover = list(self._running)
        for request_id in leftover:
            self.cancel(request_id)
        return cancelled + (0 if force else len(leftover))


def _host_deadline_ns(handle: RequestHandle) -> int | None:
    timeout = handle.params.timeout_s
    if timeout is None:
        return None
    return handle.received_mono_ns + int((timeout + HOST_DEADLINE_GRACE_S) * 1e9)


def _unframable(handle: RequestHandle) -> Rejection | None:
    """A rejection when the request's engine command cannot be framed (see engine/channel.py)."""
    params = handle.params
    command = params.engine_command(handle.request_id, handle.session_id, params.timeout_s)
    try:
        encode_frame(command, MAX_MESSAGE_BYTES - _FRAME_MARGIN_BYTES)
    except MessageTooLarge as error:
        # The command is nearly all prompt text, and a frame this large holds more tokens than
        # any context: the prompt cannot fit (the same refusal the engine gives a long prompt).
        return Rejection(
            400,
            ReasonCode.CONTEXT_EXHAUSTED,
            f"the prompt is too large ({error.size_bytes} bytes encoded; at most "
            f"{error.limit_bytes}): it cannot fit the model's context",
        )
    except UnencodableMessage:
        return Rejection(
            400,
            ReasonCode.INVALID_CONFIGURATION,
            "a request field cannot be encoded (integers are limited to 64 bits)",
        )
    return None
