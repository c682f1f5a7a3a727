"""The scheduler: per-model admission queues in front of the engine's lanes, sessions, unload.

Per model, at most `lanes` requests are in the engine at once; the rest wait in a bounded FIFO
(`max_queue`); beyond it a request is rejected at once (`request_rejected`,
`reservation_exhausted`, HTTP 429). Every request gets exactly one terminal event and exactly
one `Finished` chunk, whatever happens: completion, cancellation (client gone, forced unload),
timeout (in the queue or in the engine), engine crash (`process_crash`).

Threads: engine messages arrive on each engine's reader thread (`on_engine_message`); callers
submit from API handlers; a `skippy-scheduler` housekeeping thread expires deadlines (queued and
running), idle sessions, and watches engine liveness. One lock per model server guards its queue
and running set; events are submitted to the pipeline (nonblocking) outside of any wait, and
commands to an engine are queued (`EngineProcess.send` never blocks).

Invariants:

- Whoever removes a request from the running set (under the server lock) — its `gen_done`, the
  host-side deadline, the engine's exit — is the only one that emits its terminal events and
  delivers its `Finished`. Exactly once, whatever order they race in.
- Deadlines are kept by the host whatever the engine does (stopped, stuck in a decode): a running
  request still running `HOST_DEADLINE_GRACE_S` after its deadline is ended here (timed_out), its
  host lane is freed at once and the engine is told to cancel it. The engine's later messages for
  it, `gen_done` included, are ignored (`_abandoned`), so nothing is emitted or freed twice.
- A request whose engine command would exceed the control channel's frame limit is refused at
  admission (`context_exhausted`; `invalid_configuration` for a value JSON cannot carry, such as
  a seed beyond 64 bits): no request can break the channel.
- An engine that sends nothing (not even a `pong`) for `engine_unresponsive_after_s` while its
  model serves is reported once with `model_degraded` (reason `timeout`), and with
  `model_recovery_completed` when it is heard again.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.engine.protocol import (
    MAX_MESSAGE_BYTES,
    MessageTooLarge,
    UnencodableMessage,
    encode_frame,
)
from skippyctl.engine.supervisor import EngineProcess
from skippyctl.engine.worker import serving_events_enabled
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    BatchingMode,
    LogicalId,
    Progress,
    Scope,
    StopReason,
    make_event,
    summaries,
)
from skippyctl.events.identity import OperationIds
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from skippyctl.runtime.host import LoadHandle, LoadRequest, RuntimeHost
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle, TextChunk
from skippyctl.runtime.sessions import SessionRegistry

DEFAULT_MAX_QUEUE: Final = 64
HOUSEKEEPING_INTERVAL_S: Final = 0.2
DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
MEMORY_OBSERVATION_INTERVAL_S: Final = 10.0
HOST_DEADLINE_GRACE_S: Final = 0.2
"""The engine ends a request at its deadline itself (with its token counts); the host ends it this
much later if the engine has not (stopped, stuck in a long decode)."""
ENGINE_UNRESPONSIVE_ENV: Final = "SKIPPY_ENGINE_UNRESPONSIVE_S"
"""Seconds without a word from a serving engine before `model_degraded` (default below)."""
DEFAULT_ENGINE_UNRESPONSIVE_S: Final = 5.0
MAX_HEARTBEAT_INTERVAL_S: Final = 1.0
_FRAME_MARGIN_BYTES: Final = 256
"""Admission checks the command with this margin: the timeout it carries is recomputed at start."""

_STOP_REASONS: Final = {
    "eos": StopReason.EOS,
    "stop": StopReason.STOP_STRING,
    "length": StopReason.LENGTH,
    "cancelled": StopReason.CANCELLED,
    "timeout": StopReason.TIMEOUT,
    "error": StopReason.ERROR,
}
_OUTCOME_EVENTS: Final = {
    "completed": (EventId.GENERATION_COMPLETED, EventId.REQUEST_COMPLETED, Outcome.SUCCESS),
    "cancelled": (EventId.GENERATION_CANCELLED, EventId.REQUEST_CANCELLED, Outcome.CANCELLED),
    "timed_out": (EventId.GENERATION_TIMED_OUT, EventId.REQUEST_TIMED_OUT, Outcome.FAILURE),
    "failed": (EventId.GENERATION_FAILED, EventId.REQUEST_FAILED, Outcome.FAILURE),
}
_CACHE_EVENTS: Final = {
    "hit": EventId.PROMPT_CACHE_RESTORE_HIT,
    "partial": EventId.PROMPT_CACHE_RESTORE_PARTIAL,
    "miss": EventId.PROMPT_CACHE_RESTORE_MISS,
}
_KV_EVENTS: Final = {
    "initialized": EventId.KV_CACHE_INITIALIZATION_COMPLETED,
    "pressure_crossed": EventId.CACHE_PRESSURE_CROSSED,
    "pressure_cleared": EventId.CACHE_PRESSURE_CLEARED,
    "approaching_limit": EventId.CONTEXT_CAPACITY_APPROACHING_LIMIT,
}


def _reason(value: Any) -> ReasonCode | None:
    try:
        return None if value is None else ReasonCode(value)
    except ValueError:
        return ReasonCode.UNKNOWN_FAILURE


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused before it reached a lane."""

    status: int
    reason: ReasonCode
    message: str
    retry_after_s: int | None = None


class ModelServer:
    """One loaded model: its engine, admission queue and running requests."""

    def __init__(
        self, scheduler: Scheduler, model_id: LogicalId, lanes: int, max_queue: int
    ) -> None:
        self.scheduler = scheduler
        self.model_id = model_id
        self.lanes = lanes
        self.max_queue = max_queue
        self.engine: EngineProcess | None = None
        self.accepting = True
        self._lock = threading.Lock()
        self._queued: deque[RequestHandle] = deque()
        self._running: dict[str, RequestHandle] = {}
        self._abandoned: set[str] = set()
        """Ended by the host while the engine still ran them; their late messages are ignored."""
        self.idle = threading.Condition(self._lock)
        self.unresponsive = False
        self._unresponsive_since_ns = 0

    # -- admission ------------------------------------------------------------------------------
    def submit(self, handle: RequestHandle) -> Rejection | None:
        emit = self.scheduler.emit
        emit(EventId.REQUEST_RECEIVED, handle)
        unframable = _unframable(handle)
        with self._lock:
            if unframable is not None:
                rejection = unframable
            elif not self.accepting or self.engine is None:
                rejection = Rejection(503, ReasonCode.STAGE_UNAVAILABLE, "model is not serving")
            elif len(self._running) < self.lanes and not self._queued:
                self._start_locked(handle)
                return None
            elif len(self._queued) < self.max_queue:
                self._queued.append(handle)
                depth = len(self._queued)
                emit(EventId.REQUEST_QUEUED, handle, summaries(queue_depth=depth))
                return None
            else:
                rejection = Rejection(
                    429,
                    ReasonCode.RESERVATION_EXHAUSTED,
                    f"queue full ({self.max_queue} waiting); retry later",
                    retry_after_s=1,
                )
        if rejection.reason is ReasonCode.CONTEXT_EXHAUSTED:
            emit(EventId.CONTEXT_EXHAUSTED, handle, reason=rejection.reason)
        emit(
            EventId.REQUEST_REJECTED,
            handle,
            summaries(queue_capacity=self.max_queue),
            outcome=Outcome.REJECTED,
            reason=rejection.reason,
        )
        handle.deliver(Finished("rejected", rejection.reason, None))
        return rejection

    def _start_locked(self, handle: RequestHandle) -> None:
        emit = self.scheduler.emit
        now = time.monotonic_ns()
        handle.admitted_mono_ns = now
        wait_ms = round((now - handle.received_mono_ns) / 1e6, 3)
        emit(EventId.REQUEST_ADMITTED, handle, summaries(queue_wait_ms=wait_ms))
        self._running[str(handle.request_id)] = handle
        emit(EventId.REQUEST_EXECUTION_STARTED, handle, summaries(lanes_in_use=len(self._running)))
        timeout = handle.params.timeout_s
        if timeout is not None:
            elapsed = (now - handle.received_mono_ns) / 1e9
            timeout = max(0.001, timeout - elapsed)
        message = handle.params.engine_message(handle.request_id, handle.session_id)
        message["timeout_s"] = timeout
        assert self.engine is not None
        # If the engine is already gone the send fails silently: its exit handler fails
        # everything in `_running`, this request included, so it still gets its one terminal.
        try:
            self.engine.send(message)
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
                args=(str(handle.request_id), "failed", reason),
                name=f"skippy-refuse-{handle.request_id}",
                daemon=True,
            ).start()

    def _next_locked(self) -> None:
        while self._queued and len(self._running) < self.lanes and self.accepting:
            self._start_locked(self._queued.popleft())
        if not self._running:
            self.idle.notify_all()

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
            self.engine.send({"op": "cancel", "request_id": request_id})

    def _finish_unstarted(self, handle: RequestHandle, reason: ReasonCode) -> None:
        outcome = "timed_out" if reason is ReasonCode.TIMEOUT else "cancelled"
        event_id = (
            EventId.REQUEST_TIMED_OUT if reason is ReasonCode.TIMEOUT else EventId.REQUEST_CANCELLED
        )
        self.scheduler.emit(
            event_id,
            handle,
            outcome=Outcome.FAILURE if outcome == "timed_out" else Outcome.CANCELLED,
            reason=reason,
            duration_ms=round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3),
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
            self._end_running(request_id, "timed_out", ReasonCode.TIMEOUT)

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

    def _end_running(self, request_id: str, outcome: str, reason: ReasonCode) -> None:
        """End a running request on the host (its engine has not): claim it, emit its terminal
        events, free its host lane, tell the engine to drop it, deliver its `Finished`."""
        with self._lock:
            handle = self._running.pop(request_id, None)
            if handle is None:
                return  # its gen_done (or the engine's exit) came first: already ended
            self._abandoned.add(request_id)
        engine = self.engine
        if engine is not None:
            engine.send({"op": "cancel", "request_id": request_id})
        generation_id, request_event, event_outcome = _OUTCOME_EVENTS[outcome]
        stop = StopReason.TIMEOUT if reason is ReasonCode.TIMEOUT else StopReason.ERROR
        emit = self.scheduler.emit
        if reason is ReasonCode.CONTEXT_EXHAUSTED:
            emit(EventId.CONTEXT_EXHAUSTED, handle, reason=reason)
        emit(generation_id, handle, outcome=event_outcome, reason=reason, stop_reason=stop)
        duration = round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3)
        emit(request_event, handle, outcome=event_outcome, reason=reason, duration_ms=duration)
        if handle.session_id is not None:
            emit(EventId.SESSION_IDLE, handle)
        with self._lock:
            self._next_locked()
        self.scheduler.session_released(handle)
        handle.deliver(Finished(outcome, reason, stop.value))

    # -- engine liveness (housekeeping thread) --------------------------------------------------
    def check_engine(self, now_ns: int) -> None:
        """Ping a quiet serving engine; report it degraded when it stays silent too long and
        recovered when it is heard again."""
        engine = self.engine
        if engine is None or not engine.serving:
            return
        scheduler = self.scheduler
        silent = engine.silent_for_s(now_ns)
        if silent >= scheduler.heartbeat_interval_s:
            engine.ping()
        unresponsive = silent >= scheduler.engine_unresponsive_after_s
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
        # Model availability, not a serving event: it flows with SKIPPY_SERVING_EVENTS=off too.
        scheduler.host.pipeline.submit(event)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self._running), len(self._queued)

    # -- engine messages (reader thread) --------------------------------------------------------
    def on_engine_message(self, engine: EngineProcess, message: dict[str, Any]) -> None:
        kind = message.get("msg")
        if kind == "kv":
            self._on_kv(message)
            return
        if kind == "session":
            self._on_session(message)
            return
        request_id = str(message.get("request_id", ""))
        if kind == "gen_done":
            with self._lock:
                # Claimed here: whoever pops the request emits its terminal (exactly once).
                handle = self._running.pop(request_id, None)
                if handle is None:
                    self._abandoned.discard(request_id)  # the host ended it already
                    return
            self._on_done(handle, message)
            return
        # Under the lock, so a host-side terminal cannot slip in between: nothing of a request
        # is emitted after its terminal. (Emitting and delivering never block.)
        with self._lock:
            handle = self._running.get(request_id)
            if handle is not None:
                self._on_observation(handle, kind, message)

    def _on_observation(self, handle: RequestHandle, kind: Any, message: dict[str, Any]) -> None:
        emit = self.scheduler.emit
        if kind == "gen_text":
            handle.deliver(TextChunk(str(message.get("text", ""))))
        elif kind == "gen_started":
            prompt = int(message.get("prompt_tokens", 0))
            reused = int(message.get("reused_tokens", 0))
            emit(EventId.PROMPT_PROCESSING_STARTED, handle)
            emit(EventId.TOKENIZATION_COMPLETED, handle, summaries(prompt_tokens=prompt))
            cache_event = _CACHE_EVENTS.get(str(message.get("cache")))
            if cache_event is not None:
                emit(cache_event, handle, summaries(reused_tokens=reused, prompt_tokens=prompt))
            if handle.session_id is not None:
                emit(EventId.SESSION_ACTIVE, handle, summaries(lanes=message.get("lane")))
            emit(EventId.PREFILL_STARTED, handle, summaries(prompt_tokens=prompt - reused))
        elif kind == "gen_prefill_progress":
            emit(
                EventId.PREFILL_PROGRESS,
                handle,
                progress=Progress(
                    int(message.get("done", 0)), int(message.get("total", 0)), ProgressUnit.TOKENS
                ),
            )
        elif kind == "gen_prefill_done":
            tokens = int(message.get("tokens", 0))
            ms = float(message.get("ms", 0.0))
            emit(EventId.PREFILL_COMPLETED, handle, summaries(prompt_tokens=tokens), duration_ms=ms)
            emit(EventId.GENERATION_STARTED, handle)
        elif kind == "gen_first_token":
            ttft = message.get("ttft_ms")
            emit(EventId.FIRST_TOKEN_PRODUCED, handle, summaries(time_to_first_token_ms=ttft))
        elif kind == "gen_progress":
            emit(
                EventId.GENERATION_PROGRESS,
                handle,
                progress=Progress(int(message.get("generated", 0)), None, ProgressUnit.TOKENS),
            )
        elif kind == "gen_token":  # opt-in debug class: dropped (and counted) when disabled
            emit(
                EventId.GENERATION_TOKEN_OBSERVED,
                handle,
                summaries(generated_tokens=int(message.get("index", 0)) + 1),
                duration_ms=message.get("step_ms"),
            )

    def _on_done(self, handle: RequestHandle, message: dict[str, Any]) -> None:
        """The engine's terminal for a request this thread claimed (popped from `_running`)."""
        emit = self.scheduler.emit
        outcome = str(message.get("outcome", "failed"))
        generation_id, request_event, event_outcome = _OUTCOME_EVENTS.get(
            outcome, _OUTCOME_EVENTS["failed"]
        )
        reason = _reason(message.get("reason"))
        stop = _STOP_REASONS.get(str(message.get("stop_reason")))
        prompt = int(message.get("prompt_tokens") or 0)
        completion = int(message.get("completion_tokens") or 0)
        shared = int(message.get("shared_steps") or 0)
        numbers = summaries(
            prompt_tokens=prompt,
            generated_tokens=completion,
            reused_tokens=message.get("reused_tokens"),
            time_to_first_token_ms=message.get("ttft_ms"),
            prefill_ms=message.get("prefill_ms"),
            decode_ms=message.get("decode_ms"),
            prefill_tokens_per_s=message.get("prefill_tokens_per_s"),
            decode_tokens_per_s=message.get("decode_tokens_per_s"),
            shared_decode_steps=shared,
            batch_size=message.get("max_batch"),
        )
        batching = BatchingMode.CONTINUOUS if shared > 0 else BatchingMode.SINGLE
        if reason is ReasonCode.CONTEXT_EXHAUSTED:
            emit(EventId.CONTEXT_EXHAUSTED, handle, summaries(prompt_tokens=prompt), reason=reason)
        if outcome == "completed" and stop in (
            StopReason.EOS,
            StopReason.STOP_STRING,
            StopReason.LENGTH,
        ):
            emit(EventId.STOP_CONDITION_REACHED, handle, stop_reason=stop)
        duration = round((time.monotonic_ns() - handle.received_mono_ns) / 1e6, 3)
        emit(
            generation_id,
            handle,
            numbers,
            outcome=event_outcome,
            reason=reason,
            stop_reason=stop,
            batching=batching,
        )
        emit(request_event, handle, outcome=event_outcome, reason=reason, duration_ms=duration)
        if handle.session_id is not None:
            emit(EventId.SESSION_IDLE, handle)
        with self._lock:
            self._next_locked()
        self.scheduler.session_released(handle)
        handle.deliver(Finished(outcome, reason, stop.value if stop else None, prompt, completion))

    def _on_kv(self, message: dict[str, Any]) -> None:
        event_id = _KV_EVENTS.get(str(message.get("event")))
        if event_id is None:
            return
        request_id = message.get("request_id")
        self.scheduler.pipeline_submit(
            event_id,
            Scope(
                model_id=self.model_id,
                request_id=LogicalId(str(request_id)) if request_id else None,
            ),
            summaries(
                kv_cells_used=message.get("cells_used"), kv_cells_total=message.get("cells_total")
            ),
        )

    def _on_session(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        event_id = {
            "created": EventId.SESSION_CREATED,
            "trimmed": EventId.SESSION_TRIMMED,
            "evicted": EventId.SESSION_RESET,
        }.get(str(event))
        session = message.get("session")
        if event_id is None or not session:
            return
        self.scheduler.pipeline_submit(
            event_id,
            Scope(model_id=self.model_id, session_id=LogicalId(str(session))),
            summaries(lanes=message.get("lane"), context_tokens=message.get("tokens")),
        )

    def on_engine_exit(self, engine: EngineProcess, crashed: bool) -> None:
        with self._lock:
            self.accepting = False
            running = list(self._running.values())
            queued = list(self._queued)
            self._running.clear()
            self._queued.clear()
            self._abandoned.clear()
            self.idle.notify_all()
        reason = ReasonCode.PROCESS_CRASH if crashed else ReasonCode.STAGE_UNAVAILABLE
        for handle in running:
            self.scheduler.emit(
                EventId.GENERATION_FAILED, handle, outcome=Outcome.FAILURE, reason=reason
            )
            self.scheduler.emit(
                EventId.REQUEST_FAILED, handle, outcome=Outcome.FAILURE, reason=reason
            )
            handle.deliver(Finished("failed", reason, "error"))
        for handle in queued:
            self.scheduler.emit(
                EventId.REQUEST_FAILED, handle, outcome=Outcome.FAILURE, reason=reason
            )
            handle.deliver(Finished("failed", reason, None))
        self.scheduler.server_exited(self)

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


class Scheduler:
    """Owns the model servers and sessions; the API and CLI talk to this."""

    def __init__(
        self,
        host: RuntimeHost,
        max_queue: int = DEFAULT_MAX_QUEUE,
        sessions: SessionRegistry | None = None,
        engine_unresponsive_after_s: float | None = None,
    ) -> None:
        self.host = host
        self.max_queue = max_queue
        if engine_unresponsive_after_s is None:
            engine_unresponsive_after_s = _env_seconds(
                ENGINE_UNRESPONSIVE_ENV, DEFAULT_ENGINE_UNRESPONSIVE_S
            )
        if engine_unresponsive_after_s <= 0:
            raise ValueError("engine_unresponsive_after_s must be positive")
        self.engine_unresponsive_after_s = engine_unresponsive_after_s
        """A serving engine silent this long (no pong, no message) is reported degraded."""
        self.heartbeat_interval_s = min(MAX_HEARTBEAT_INTERVAL_S, engine_unresponsive_after_s / 4)
        """A serving engine silent this long is pinged."""
        self.sessions = sessions or SessionRegistry()
        self._servers: dict[LogicalId, ModelServer] = {}
        self._lock = threading.Lock()
        self._ids = OperationIds()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._housekeeping, name="skippy-scheduler", daemon=True
        )
        self.serving_events = serving_events_enabled()
        """False only for the events-off benchmark baseline (SKIPPY_SERVING_EVENTS=off): request,
        prefill, generation, session and KV events are not submitted; model lifecycle still is."""

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    # -- events ---------------------------------------------------------------------------------
    def emit(
        self,
        event_id: EventId,
        handle: RequestHandle,
        numbers: tuple[Any, ...] = (),
        *,
        outcome: Outcome | None = None,
        reason: ReasonCode | None = None,
        duration_ms: float | None = None,
        progress: Progress | None = None,
        stop_reason: StopReason | None = None,
        batching: BatchingMode | None = None,
    ) -> None:
        if not self.serving_events:
            return
        self.host.pipeline.submit(
            make_event(
                event_id,
                operation_id=handle.request_id,
                scope=Scope(
                    model_id=handle.model_id,
                    session_id=handle.session_id,
                    request_id=handle.request_id,
                ),
                outcome=outcome,
                reason_code=reason,
                duration_ms=duration_ms,
                progress=progress,
                stop_reason=stop_reason,
                batching=batching,
                summaries=numbers,
            )
        )

    def pipeline_submit(
        self, event_id: EventId, scope: Scope, numbers: tuple[Any, ...] = ()
    ) -> None:
        """A serving fact outside a request (session, KV): gated like :meth:`emit`."""
        if self.serving_events:
            self.host.pipeline.submit(make_event(event_id, scope=scope, summaries=numbers))

    # -- models ---------------------------------------------------------------------------------
    def load(self, request: LoadRequest, max_queue: int | None = None) -> LoadHandle:
        server = ModelServer(self, LogicalId("pending"), request.lanes, max_queue or self.max_queue)
        handle = self.host.load_model(request, listener=server)
        if handle.model_id is None or handle.problem is not None or handle.already_available:
            return handle
        server.model_id = handle.model_id
        server.engine = self.host.engine_for(handle.model_id)
        with self._lock:
            previous = self._servers.get(handle.model_id)
            self._servers[handle.model_id] = server
        if previous is not None and previous is not server:
            previous.accepting = False
        return handle

    def server(self, model_id: str) -> ModelServer | None:
        with self._lock:
            return self._servers.get(LogicalId(model_id)) if _valid(model_id) else None

    def servers(self) -> list[ModelServer]:
        with self._lock:
            return list(self._servers.values())

    def server_exited(self, server: ModelServer) -> None:
        for entry in self.sessions.drop_model(server.model_id):
            del entry  # the engine (and its KV) is gone; sessions start afresh next time

    # -- generation -----------------------------------------------------------------------------
    def generate(
        self, model: str, params: GenerationParams, session_key: str | None = None
    ) -> tuple[RequestHandle, Rejection | None]:
        request_id, _ = self._ids.next("req")
        server = self.server(model)
        session_id: LogicalId | None = None
        if server is not None and session_key:
            entry, new, evicted = self.sessions.resolve(server.model_id, session_key)
            session_id = entry.session_id
            entry.active_requests += 1
            if evicted is not None:
                self._abandon(server, evicted.session_id, "capacity")
            if new:
                self.pipeline_submit(
                    EventId.SESSION_REQUESTED,
                    Scope(model_id=server.model_id, session_id=session_id),
                )
        handle = RequestHandle(
            request_id=request_id,
            model_id=server.model_id if server is not None else LogicalId("unknown"),
            session_id=session_id,
            params=params,
            received_mono_ns=time.monotonic_ns(),
        )
        if server is None:
            # The requested name is never echoed into events: it may be anything a client sent.
            rejection = Rejection(404, ReasonCode.MISSING_ARTIFACT, "model not loaded")
            if self.serving_events:
                self.host.pipeline.submit(
                    make_event(
                        EventId.REQUEST_REJECTED,
                        operation_id=request_id,
                        scope=Scope(request_id=request_id),
                        outcome=Outcome.REJECTED,
                        reason_code=rejection.reason,
                    )
                )
            handle.deliver(Finished("rejected", rejection.reason, None))
            return handle, rejection
        return handle, None

    def enqueue(self, handle: RequestHandle) -> Rejection | None:
        """Admit a handle made by `generate` (after the caller bound its loop)."""
        server = self.server(handle.model_id)
        if server is None:
            rejection = Rejection(404, ReasonCode.MISSING_ARTIFACT, "model not loaded")
            handle.deliver(Finished("rejected", rejection.reason, None))
            return rejection
        refused = server.submit(handle)
        if refused is not None:
            self.session_released(handle)
        return refused

    def cancel(self, handle: RequestHandle, reason: ReasonCode = ReasonCode.CANCELLATION) -> None:
        server = self.server(handle.model_id)
        if server is not None and not handle.done:
            server.cancel(str(handle.request_id), reason)

    def session_released(self, handle: RequestHandle) -> None:
        if handle.session_id is not None:
            self.sessions.release(handle.session_id)

    def _abandon(self, server: ModelServer, session_id: LogicalId, reason: str) -> None:
        if server.engine is not None:
            server.engine.send({"op": "drop_session", "session": str(session_id), "reason": reason})
        self.pipeline_submit(
            EventId.SESSION_ABANDONED, Scope(model_id=server.model_id, session_id=session_id)
        )

    # -- unload ---------------------------------------------------------------------------------
    def unload(
        self, model_id: str, force: bool = False, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    ) -> LogicalId | None:
        """Start an unload in the background; its events say how it went. None: not loaded."""
        server = self.server(model_id)
        if server is None:
            return None
        operation_id, _ = self._ids.next("unload")
        threading.Thread(
            target=self._unload,
            args=(server, operation_id, force, drain_timeout_s),
            name=f"skippy-unload-{server.model_id}",
            daemon=True,
        ).start()
        return operation_id

    def _unload(
        self, server: ModelServer, operation_id: LogicalId, force: bool, drain_timeout_s: float
    ) -> None:
        scope = Scope(model_id=server.model_id)
        submit = self.host.pipeline.submit
        started = time.monotonic_ns()
        submit(make_event(EventId.UNLOAD_REQUESTED, operation_id=operation_id, scope=scope))
        submit(make_event(EventId.UNLOAD_STARTED, operation_id=operation_id, scope=scope))
        running, queued = server.counts()
        sessions = self.sessions.count_for_model(server.model_id)
        submit(
            make_event(
                EventId.SESSION_DRAINING_STARTED,
                operation_id=operation_id,
                scope=scope,
                summaries=summaries(
                    active_sessions=running, draining_sessions=sessions, queue_depth=queued
                ),
            )
        )
        cancelled = server.drain(force, drain_timeout_s)
        if force or cancelled:
            submit(
                make_event(
                    EventId.FORCED_UNLOAD,
                    operation_id=operation_id,
                    scope=scope,
                    summaries=summaries(cancelled_requests=cancelled),
                )
            )
        submit(
            make_event(EventId.SESSION_DRAINING_COMPLETED, operation_id=operation_id, scope=scope)
        )
        for entry in self.sessions.drop_model(server.model_id):
            submit(
                make_event(
                    EventId.SESSION_CLOSED,
                    scope=Scope(model_id=server.model_id, session_id=entry.session_id),
                )
            )
        engine = server.engine
        try:
            if engine is not None:
                self.host.stop_engine(server.model_id)
        except Exception:  # noqa: BLE001 - any failure to stop is reported, never raised
            submit(
                make_event(
                    EventId.UNLOAD_FAILED,
                    operation_id=operation_id,
                    scope=scope,
                    outcome=Outcome.FAILURE,
                    reason_code=ReasonCode.INTERNAL_RUNTIME_FAILURE,
                )
            )
            return
        with self._lock:
            if self._servers.get(server.model_id) is server:
                del self._servers[server.model_id]
        submit(
            make_event(
                EventId.UNLOAD_COMPLETED,
                operation_id=operation_id,
                scope=scope,
                outcome=Outcome.SUCCESS,
                duration_ms=round((time.monotonic_ns() - started) / 1e6, 3),
                summaries=summaries(cancelled_requests=cancelled),
            )
        )

    # -- housekeeping ---------------------------------------------------------------------------
    def _observe_host_memory(self) -> None:
        """Host memory from the OS (sysconf), never from log text; device memory is reported by
        the native layer when a model is placed (backend_device_selected)."""
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            free = os.sysconf("SC_AVPHYS_PAGES") * page
        except (OSError, ValueError):
            return
        # Not a serving event: it flows with SKIPPY_SERVING_EVENTS=off too.
        self.host.pipeline.submit(
            make_event(
                EventId.MEMORY_OBSERVED,
                scope=Scope(device_id=LogicalId("host")),
                summaries=summaries(memory_free_bytes=free, memory_total_bytes=total),
            )
        )

    def _housekeeping(self) -> None:
        next_memory = 0.0
        wait_s = HOUSEKEEPING_INTERVAL_S
        while not self._stop.wait(wait_s):
            if time.monotonic() >= next_memory:
                next_memory = time.monotonic() + MEMORY_OBSERVATION_INTERVAL_S
                self._observe_host_memory()
            now = time.monotonic_ns()
            wait_s = min(HOUSEKEEPING_INTERVAL_S, self.heartbeat_interval_s / 2)
            for server in self.servers():
                server.expire_queued(now)
                server.expire_running(now)
                server.check_engine(now)
                deadline = server.next_deadline_ns()
                if deadline is not None:
                    # Wake at the next deadline, not up to an interval after it.
                    wait_s = min(wait_s, max(0.005, (deadline - time.monotonic_ns()) / 1e9))
            for entry in self.sessions.expired():
                owner = self.server(entry.model_id)
                if owner is not None:
                    self._abandon(owner, entry.session_id, "ttl")

    def shutdown(self) -> None:
        self._stop.set()
        for server in self.servers():
            server.drain(force=True, drain_timeout_s=0.5)
        if self._thread.is_alive():
            self._thread.join(2)


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 and value == value else default  # NaN and <= 0: the default


def _host_deadline_ns(handle: RequestHandle) -> int | None:
    timeout = handle.params.timeout_s
    if timeout is None:
        return None
    return handle.received_mono_ns + int((timeout + HOST_DEADLINE_GRACE_S) * 1e9)


def _unframable(handle: RequestHandle) -> Rejection | None:
    """A rejection when the request's engine command cannot be framed (see protocol.py)."""
    message = handle.params.engine_message(handle.request_id, handle.session_id)
    try:
        encode_frame(message, MAX_MESSAGE_BYTES - _FRAME_MARGIN_BYTES)
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


def _valid(model_id: str) -> bool:
    from skippyctl.events.envelope import InvalidLogicalId

    try:
        LogicalId(model_id)
    except InvalidLogicalId:
        return False
    return True
