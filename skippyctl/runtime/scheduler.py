"""The scheduler: routes model ids to model servers, keeps sessions, loads and unloads.

Admission itself — the bounded queue in front of a model's lanes, deadlines, exactly-once
terminals, the engine heartbeat — is per model, in ``runtime/model_server.py``
(:class:`ModelServer`); this module owns the servers by model id, the client-session registry
(client keys → opaque session ids, LRU and idle TTL, sessions dropped from the engine when they
go), unload (drain, then stop the engine) and the `skippy-scheduler` housekeeping thread, which
expires deadlines (queued and running), idle sessions, and watches engine liveness for every
server.

Serving events are on unless the host's :class:`~skippyctl.engine.options.EngineOptions` (or
``serving_events``) say otherwise — the engine and the scheduler are told the same value once,
by the composition root. Model lifecycle events flow either way.

Models on demand (with a :class:`~skippyctl.runtime.model_catalog.ModelCatalog`): a request for
a model that is not loaded, or still loading, waits on :meth:`Scheduler.demand`. Concurrent
requests for one model share one load; a model the catalog knows is loaded with its preset's
options (an ``hf://`` preset prepared from the hub's cache, or downloaded into it, with the pull's
events); at most ``max_queue`` requests wait for a load, and the next is refused (503 with
Retry-After). Idle models unload after their idle TTL (``ModelServer.idle_ttl_s``: a request's
keep_alive, the load's ``ttl``, else the runtime's ``default_ttl_s``; never when pinned):
``unload_requested`` … ``unload_completed`` with reason ``idle``.

Session persistence (with a :class:`~skippyctl.runtime.session_state.SessionStateStore`): an
unload parks the model's sessions (``runtime/sessions.py``) and asks the engine to write their KV
state files before it exits; the next load of the same model id names the files in its ``Load``,
the engine restores them into lanes, and each restored session is live again under its id, so
its next request reuses the restored tokens instead of prefilling them. Without a store (the
default) an unload forgets its sessions' KV.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

from skippyctl.config.load_options import LoadOptions, RestartPolicy
from skippyctl.config.runtime_settings import DEFAULT_ENGINE_UNRESPONSIVE_S
from skippyctl.engine.protocol_commands import DropSession, SaveSessions, SessionFile
from skippyctl.engine.protocol_messages import StateExported, StateImported
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, make_event, summaries
from skippyctl.events.identity import OperationIds, is_logical_id, model_id_for
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    ModelState,
    ModelView,
)
from skippyctl.runtime.host import LoadHandle, RuntimeHost
from skippyctl.runtime.memory_pressure import (
    HostMemory,
    MemoryPressure,
    PressureChange,
    host_memory,
)
from skippyctl.runtime.model_catalog import Loadable, ModelCatalog
from skippyctl.runtime.model_server import Liveness, ModelNotServing, ModelServer, Rejection
from skippyctl.runtime.observations import ServingEvents, eviction_reason
from skippyctl.runtime.pulls import Pulls, TooManyPulls
from skippyctl.runtime.receipts import ReceiptBook, receipt_of
from skippyctl.runtime.recovery import RESTART_LIMIT, RestartBook
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle, StreamOffer
from skippyctl.runtime.session_state import SessionStateStore
from skippyctl.runtime.sessions import SessionRegistry

__all__ = ["ModelServer", "Rejection", "Scheduler"]

DEFAULT_MAX_QUEUE: Final = 64
HOUSEKEEPING_INTERVAL_S: Final = 0.2
DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
MEMORY_OBSERVATION_INTERVAL_S: Final = 10.0
MAX_HEARTBEAT_INTERVAL_S: Final = 1.0
_FAILED_LOAD_STATES: Final = frozenset(
    {ModelState.FAILED, ModelState.CANCELLED, ModelState.UNAVAILABLE}
)
DEMAND_RETRY_AFTER_S: Final = 5
"""What a request refused because too many wait for a load is told to wait before retrying."""
UNLOAD_WAIT_S: Final = DEFAULT_DRAIN_TIMEOUT_S + 90.0
"""How long an on-demand load waits for the same model's unload to end first (its drain, then
its engine's exit, which may save session state)."""
CRASH_SETTLE_WAIT_S: Final = 5.0
"""How long a restart waits for the runtime's state to show the crash (the pipeline applies it
within milliseconds) before it loads again."""


class DemandRefused(Exception):
    """A request cannot be served by loading its model: ``rejection`` says how to answer."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


@dataclass(slots=True)
class Demand:
    """One model's on-demand load (or a load in progress) and the requests waiting for it."""

    model_id: LogicalId
    future: Future[ModelServer] = field(default_factory=Future)
    """The serving model, or :class:`DemandRefused`."""
    waiting: int = 0


@dataclass(slots=True)
class _Recovery:
    """A model whose engine died while serving, being restarted (``load --restart``)."""

    model_id: LogicalId
    options: LoadOptions
    """The load to repeat: the options the crashed engine was loaded with."""
    crashed_ns: int
    demand: Demand
    """What requests for the model wait on meanwhile (``Scheduler.demand`` finds it)."""
    stop: threading.Event = field(default_factory=threading.Event)
    """Set when it must end without serving: an unload, the operator's own load, shutdown."""


class Scheduler:
    """Owns the model servers and sessions; the API and CLI talk to this.

    ``engine_unresponsive_after_s``: the runtime's SKIPPY_ENGINE_UNRESPONSIVE_S setting, which
    the composition root passes (this module reads no environment)."""

    def __init__(
        self,
        host: RuntimeHost,
        max_queue: int = DEFAULT_MAX_QUEUE,
        sessions: SessionRegistry | None = None,
        engine_unresponsive_after_s: float = DEFAULT_ENGINE_UNRESPONSIVE_S,
        serving_events: bool | None = None,
        session_state: SessionStateStore | None = None,
        catalog: ModelCatalog | None = None,
        default_ttl_s: float = -1.0,
        max_models: int | None = None,
        memory_budget_bytes: int | None = None,
        quiet_hub: bool = True,
    ) -> None:
        self.host = host
        self.memory_budget_bytes = memory_budget_bytes
        """What the loaded models may take in memory all together (their load estimates,
        runtime/memory_estimate.py); a load beyond it first unloads the least recently used
        idle, unpinned models (None: no budget)."""
        self.max_models = max_models
        """At most this many models loaded or loading; a load beyond it first unloads the least
        recently used idle, unpinned model (None: no limit)."""
        self.catalog = catalog or ModelCatalog()
        """The models it may load on demand (runtime serve --presets / --models-dir)."""
        self.default_ttl_s = default_ttl_s
        """Idle seconds before a model without its own ``ttl`` unloads; -1: never."""
        self._demands: dict[LogicalId, Demand] = {}
        self.pulls = Pulls(host.pipeline.submit, quiet_hub=quiet_hub)
        """Downloads into the model cache, told in the runtime's stream (runtime/pulls.py)."""
        self.session_state = session_state
        """Where unloads save sessions' KV state for the next load (None: they do not)."""
        self.max_queue = max_queue
        if engine_unresponsive_after_s <= 0:
            raise ValueError("engine_unresponsive_after_s must be positive")
        self.liveness = Liveness(
            heartbeat_interval_s=min(MAX_HEARTBEAT_INTERVAL_S, engine_unresponsive_after_s / 4),
            unresponsive_after_s=engine_unresponsive_after_s,
        )
        # Not `or`: an empty registry is falsy (it has a length), and it carries the TTL.
        self.sessions = sessions if sessions is not None else SessionRegistry()
        for saved in () if session_state is None else session_state.persisted:
            # The previous runtime's sessions: their keys take their ids back once restored.
            self.sessions.adopt_parked(saved.model_id, saved.key_digest, saved.session_id)
        self.receipts = ReceiptBook()
        """Every request's receipt, recorded as its terminal is delivered (runtime/receipts.py)."""
        self._servers: dict[LogicalId, ModelServer] = {}
        self.restarts = RestartBook()
        """Each model's engine restarts within the restart policy's window."""
        self._recoveries: dict[LogicalId, _Recovery] = {}
        self._lock = threading.Lock()
        self._ids = OperationIds()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._housekeeping, name="skippy-scheduler", daemon=True
        )
        if serving_events is None:
            serving_events = host.options.serving_events  # what the host's engines are told
        self.memory_pressure = MemoryPressure()
        """Host memory pressure (runtime/memory_pressure.py), fed every observation."""
        self.read_host_memory: Callable[[], HostMemory | None] = host_memory
        self.events = ServingEvents(host.pipeline.submit, serving_events)
        """Serving events only while on (off: the events-off benchmark baseline); model
        lifecycle events go through `events.always` either way."""

    @property
    def serving_events(self) -> bool:
        return self.events.enabled

    @property
    def heartbeat_interval_s(self) -> float:
        """A serving engine silent this long is pinged."""
        return self.liveness.heartbeat_interval_s

    @property
    def engine_unresponsive_after_s(self) -> float:
        """A serving engine silent this long (no pong, no message) is reported degraded."""
        return self.liveness.unresponsive_after_s

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    # -- models ---------------------------------------------------------------------------------
    def load(self, options: LoadOptions) -> LoadHandle:
        """Start loading a model for the operator (``load``, a preset, a demand): a restart of
        the same model under way gives way to it, and its restart count starts afresh."""
        try:
            model_id: LogicalId | None = model_id_for(options.model, options.alias)
        except Exception:  # noqa: BLE001 - an id the load refuses with its own terminal
            model_id = None
        if model_id is not None:
            self._cancel_recovery(model_id)
            self.restarts.forget(model_id)
        return self._load(options)

    def _load(self, options: LoadOptions) -> LoadHandle:
        server = ModelServer(
            LogicalId("pending"),
            options.lanes or 1,  # until the engine says how many it made (on_engine_serving)
            self.max_queue if options.max_queue is None else options.max_queue,
            self.events,
            self.liveness,
            self,
        )
        server.speculation = options.spec.value
        server.options = options
        server.on_state = self._on_state
        server.ttl_s = self.default_ttl_s if options.ttl is None else options.ttl
        server.pinned = options.pinned
        need = self._estimate(options)
        server.memory_bytes = need
        limited = self.max_models is not None or self.memory_budget_bytes is not None
        handle = self.host.load_model(
            options,
            listener=server,
            restore=None if self.session_state is None else self._restore_plan,
            admit=(lambda model_id: self._make_room(model_id, need)) if limited else None,
        )
        if handle.model_id is None or handle.problem is not None or handle.already_available:
            return handle
        server.model_id = handle.model_id
        server.engine = self.host.engine_for(handle.model_id)
        if server.engine is None:  # the load ended before an engine started
            server.accepting = False
            if not server.ready.done():
                server.ready.set_exception(ModelNotServing())
        with self._lock:
            previous = self._servers.get(handle.model_id)
            self._servers[handle.model_id] = server
        if previous is not None and previous is not server:
            previous.accepting = False
            # Requests that waited for a restart of this model wait for this engine now.
            server.adopt_queued(previous.take_queued())
        return handle

    def memory_in_use_bytes(self) -> int:
        """What the models loaded or loading were estimated to take (the budget's use)."""
        with self._lock:
            return sum(server.memory_bytes for server in self._servers.values() if _holds(server))

    def _estimate(self, options: LoadOptions) -> int:
        """The memory a load will take (0 without a budget, or for a file that cannot be read:
        its load fails on its own)."""
        if self.memory_budget_bytes is None or options.split:
            return 0
        from skippyctl.runtime.memory_estimate import estimate_load

        try:
            return estimate_load(options).total_bytes
        except (OSError, ValueError):
            return 0

    def _make_room(self, model_id: LogicalId, need: int) -> tuple[str, ReasonCode] | None:
        """Before a load of ``model_id`` (estimated at ``need`` bytes) starts: unload the least
        recently used idle, unpinned models until fewer than ``--max-models`` are loaded or
        loading and the budget holds ``need`` beside them (an unload in progress is waited
        for: its memory is not free until its engine is gone). The refusal when no model can
        make room, or when ``need`` alone is over the budget."""
        budget = self.memory_budget_bytes
        if budget is not None and need > budget:
            return (
                f"the load needs about {_mib(need)} and the memory budget is {_mib(budget)}",
                ReasonCode.INSUFFICIENT_MEMORY,
            )
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                held = [
                    server
                    for server in self._servers.values()
                    if server.model_id != model_id and _holds(server)
                ]
            over_count = self.max_models is not None and len(held) >= self.max_models
            used = sum(server.memory_bytes for server in held)
            over_budget = budget is not None and used + need > budget
            if not over_count and not over_budget:
                return None
            leaving = [server for server in held if server.unloading]
            if leaving:
                leaving[0].gone.wait(max(0.0, deadline - time.monotonic()))
                continue
            by_last_use = sorted(held, key=lambda server: server.last_used_ns)
            victim = next((s for s in by_last_use if s.claim_for_eviction()), None)
            if victim is None:
                if over_count:
                    return (
                        f"{len(held)} models are loaded or loading (--max-models "
                        f"{self.max_models}) and none is idle and unpinned to make room",
                        ReasonCode.MAX_MODELS,
                    )
                return (
                    f"the load needs about {_mib(need)}, {_mib(used)} of the "
                    f"{_mib(budget or 0)} memory budget is taken, and no idle, unpinned model "
                    "can make room",
                    ReasonCode.INSUFFICIENT_MEMORY,
                )
            cause = ReasonCode.MAX_MODELS if over_count else ReasonCode.MEMORY_BUDGET
            self._start_unload(victim, cause=cause)
        return "the models making room did not unload in time", ReasonCode.TIMEOUT

    def _restore_plan(self, model_id: LogicalId) -> tuple[tuple[SessionFile, ...], int]:
        assert self.session_state is not None
        return self.session_state.restore_plan(model_id)

    def _on_state(self, server: ModelServer, message: StateExported | StateImported) -> None:
        """A session state file's outcome (engine reader thread): keep the store and the
        parked sessions in step."""
        store = self.session_state
        if store is None:
            return
        session_id = LogicalId(message.session)
        if isinstance(message, StateExported):
            store.exported(server.model_id, message)
            if not message.ok:
                self.sessions.unpark(server.model_id, session_id)
            return
        store.imported(message)
        if message.ok:
            # Not parked any more (more unloaded sessions than the registry keeps): its lane
            # stays warm until a request needs it (lane_needed) or KV pressure evicts it.
            self.sessions.revive(server.model_id, session_id)
        else:
            self.sessions.unpark(server.model_id, session_id)

    def server(self, model_id: str) -> ModelServer | None:
        with self._lock:
            return self._servers.get(LogicalId(model_id)) if is_logical_id(model_id) else None

    def servers(self) -> list[ModelServer]:
        with self._lock:
            return list(self._servers.values())

    def server_exited(self, server: ModelServer, crashed: bool) -> bool:
        """The engine is gone (and its KV): sessions start afresh next time (a crash fails them:
        ``session_failed``) — except those with a state file saved on request, which stay
        parked for the next load to restore. An engine that crashed while serving is restarted
        under its load's restart policy (True: a restart follows, and the server keeps its
        queued requests for it)."""
        stored = (
            set()
            if self.session_state is None
            else set(self.session_state.stored_sessions(server.model_id))
        )
        for entry in self.sessions.drop_model(server.model_id, park=bool(stored)):
            if str(entry.session_id) in stored:
                continue
            self.sessions.unpark(server.model_id, entry.session_id)
            if crashed:  # its KV died with the engine
                self.events.event(
                    make_event(
                        EventId.SESSION_FAILED,
                        scope=Scope(model_id=server.model_id, session_id=entry.session_id),
                        outcome=Outcome.FAILURE,
                        reason_code=ReasonCode.PROCESS_CRASH,
                    )
                )
        with self._lock:
            if server.model_id in self._recoveries:
                return True  # an attempt of a restart under way: the restart decides
        options = server.options
        served = server.ready.done() and server.ready.exception() is None
        if (
            not crashed
            or not served
            or server.unloading
            or self._stop.is_set()
            or options is None
            or options.restart is not RestartPolicy.ON_FAILURE
        ):
            return False
        return self._recover(server.model_id, options)

    # -- recovery -------------------------------------------------------------------------------
    def _recover(self, model_id: LogicalId, options: LoadOptions) -> bool:
        """Start restarting a model whose engine crashed while serving (engine reader thread:
        the restart itself runs on its own thread). False when the restart policy's limit is
        reached: the model fails (``model_recovery_failed``, reason ``crash_loop``)."""
        delay_s = self.restarts.next_delay_s(model_id, time.monotonic())
        if delay_s is None:
            run: Callable[[], None] = functools.partial(
                self._recovery_failed, model_id, RESTART_LIMIT
            )
        else:
            with self._lock:
                demand = self._demands.setdefault(model_id, Demand(model_id))
                recovery = _Recovery(model_id, options, time.monotonic_ns(), demand)
                self._recoveries[model_id] = recovery
            run = functools.partial(self._run_recovery, recovery, delay_s)
        threading.Thread(target=run, name=f"skippy-recovery-{model_id}", daemon=True).start()
        return delay_s is not None

    def _run_recovery(self, recovery: _Recovery, delay_s: float | None) -> None:
        """Restart after each backoff until the model serves, the policy's limit is reached,
        or the recovery is stopped; requests waiting for the model get its outcome."""
        model_id, scope = recovery.model_id, Scope(model_id=recovery.model_id)
        attempt = 0
        while delay_s is not None:
            # The crash (or the failed attempt) first, in the state and in the stream.
            self._await_crash_settled(model_id)
            attempt = self.restarts.restarted(model_id, time.monotonic())
            self.events.always(
                make_event(
                    EventId.MODEL_RECOVERY_STARTED,
                    scope=scope,
                    summaries=summaries(attempt=attempt, retry_delay_ms=round(delay_s * 1000)),
                )
            )
            if recovery.stop.wait(delay_s):
                break
            server = self._restart(recovery.options)
            if server is not None and _serves(server, recovery.stop):
                with self._lock:
                    self._recoveries.pop(model_id, None)
                # After the restart's model_available, which the pipeline derives from the
                # engine's own report a moment after the engine said it serves.
                self.host.pipeline.wait_state(
                    lambda state: _serving(state.models.get(model_id)), CRASH_SETTLE_WAIT_S
                )
                self.events.always(
                    make_event(
                        EventId.MODEL_RECOVERY_COMPLETED,
                        scope=scope,
                        outcome=Outcome.SUCCESS,
                        duration_ms=round((time.monotonic_ns() - recovery.crashed_ns) / 1e6, 3),
                        summaries=summaries(attempt=attempt),
                    )
                )
                self._settle_demand(recovery.demand, server)
                return
            if recovery.stop.is_set():
                break
            delay_s = self.restarts.next_delay_s(model_id, time.monotonic())
        with self._lock:
            self._recoveries.pop(model_id, None)
        stopped = recovery.stop.is_set()
        current = self.server(model_id)
        if stopped and current is not None and current.accepting:
            # The operator's own load took over (or this restart's, still loading): whoever
            # waited for the model waits for that load.
            current.ready.add_done_callback(lambda _: self._settle_demand(recovery.demand, current))
            return
        if not stopped:
            self._recovery_failed(model_id, attempt)
        reason = ReasonCode.CANCELLATION if stopped else ReasonCode.CRASH_LOOP
        self._refuse_demand(
            recovery.demand,
            Rejection(503, reason, f"model '{model_id}' could not be restarted ({reason})"),
        )
        if current is not None and not current.accepting:
            current.fail_queued(reason)

    def _recovery_failed(self, model_id: LogicalId, attempts: int) -> None:
        self._await_crash_settled(model_id)  # the crash first: this ends what it began
        self.events.always(
            make_event(
                EventId.MODEL_RECOVERY_FAILED,
                scope=Scope(model_id=model_id),
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.CRASH_LOOP,
                summaries=summaries(attempt=attempts),
            )
        )

    def _await_crash_settled(self, model_id: LogicalId) -> None:
        """Until the runtime's state has the model neither serving nor loading (its crash, or
        the failed attempt before, applied), so the restart is a new load of it."""
        self.host.pipeline.wait_state(
            lambda state: not _serving_or_loading(state.models.get(model_id)),
            CRASH_SETTLE_WAIT_S,
        )

    def _restart(self, options: LoadOptions) -> ModelServer | None:
        """One restart: the crashed engine's load again. The model's server, or None when the
        load was refused before it started."""
        handle = self._load(options)
        if handle.problem is not None or handle.model_id is None:
            return None
        return self.server(handle.model_id)

    def _cancel_recovery(self, model_id: LogicalId) -> None:
        with self._lock:
            recovery = self._recoveries.get(model_id)
        if recovery is not None:
            recovery.stop.set()

    def save_session(self, session_id: str) -> bool:
        """Ask the engine of a live session to save its KV state now (on request); the outcome
        arrives as an event. False: no such live session, or persistence is off."""
        store = self.session_state
        model_id = self.sessions.model_of(session_id)
        server = None if model_id is None else self.server(model_id)
        if store is None or server is None or server.engine is None:
            return False
        files, budget = store.save_plan([LogicalId(session_id)])
        return server.engine.send(SaveSessions(files, budget))

    # -- models on demand -----------------------------------------------------------------------
    def demand(self, name: str) -> Demand | None:
        """The load a request for ``name`` waits on when the model does not serve yet: the load
        in progress, or a new one of the catalog's entry. The caller counts itself in
        ``waiting`` (done here) and calls :meth:`stop_waiting` when it stops. None: the model
        neither loads nor is known (a 404). Raises :class:`DemandRefused` when too many wait."""
        if not is_logical_id(name):
            return None
        model_id = LogicalId(name)
        watch: ModelServer | None = None
        start: threading.Thread | None = None
        known = self.catalog.find(name) is not None  # outside the lock: it may read a directory
        with self._lock:
            demand = self._demands.get(model_id)
            server = self._servers.get(model_id)
            if demand is None:
                if server is not None and server.accepting and not server.ready.done():
                    watch = server  # a load someone else started
                elif not known:
                    return None
                if self.max_queue <= 0:
                    raise DemandRefused(self._too_many(model_id, 0))
                demand = Demand(model_id)
                self._demands[model_id] = demand
                if watch is None:
                    start = threading.Thread(
                        target=self._load_on_demand,
                        args=(demand, server),
                        name=f"skippy-demand-{model_id}",
                        daemon=True,
                    )
            elif demand.waiting >= self.max_queue:
                raise DemandRefused(self._too_many(model_id, demand.waiting))
            demand.waiting += 1
        if watch is not None:
            ready_server = watch
            watch.ready.add_done_callback(lambda _: self._settle_demand(demand, ready_server))
        if start is not None:
            start.start()
        return demand

    @staticmethod
    def _too_many(model_id: LogicalId, waiting: int) -> Rejection:
        return Rejection(
            503,
            ReasonCode.RESERVATION_EXHAUSTED,
            f"{waiting} requests already wait for model '{model_id}' to load; retry later",
            retry_after_s=DEMAND_RETRY_AFTER_S,
        )

    def stop_waiting(self, demand: Demand) -> None:
        with self._lock:
            demand.waiting = max(0, demand.waiting - 1)

    def _load_on_demand(self, demand: Demand, previous: ModelServer | None) -> None:
        """The demand thread: wait out an unload of the same model, prepare an hf:// file,
        load, and settle the demand when the model serves or its load ends."""
        try:
            server = self._start_demanded_load(demand, previous)
        except DemandRefused as refused:
            self._refuse_demand(demand, refused.rejection)
            return
        except Exception:  # noqa: BLE001 - whatever fails, every waiting request gets an answer
            self._refuse_demand(
                demand,
                Rejection(
                    503, ReasonCode.INTERNAL_RUNTIME_FAILURE, "the model could not be loaded"
                ),
            )
            return
        server.ready.add_done_callback(lambda _: self._settle_demand(demand, server))

    def _start_demanded_load(self, demand: Demand, previous: ModelServer | None) -> ModelServer:
        model_id = demand.model_id
        if previous is not None and previous.unloading:
            previous.gone.wait(UNLOAD_WAIT_S)  # its unload (idle or asked) ends first
        entry = self.catalog.find(str(model_id))
        if entry is None:
            raise DemandRefused(
                Rejection(404, ReasonCode.MISSING_ARTIFACT, f"model '{model_id}' is not known")
            )
        handle = self.load(self.entry_options(entry))
        if handle.problem is not None or handle.model_id is None:
            why = handle.problem or "refused"
            failure = self._load_failure(model_id)
            raise DemandRefused(
                dataclasses.replace(
                    failure, message=f"model '{model_id}' could not be loaded: {why}"
                )
            )
        server = self.server(handle.model_id)
        if server is None:
            raise DemandRefused(self._load_failure(model_id))
        return server

    def entry_options(self, entry: Loadable, given: Mapping[str, Any] | None = None) -> LoadOptions:
        """The load of a catalog entry, with the options of ``given`` (JSON names) on top; an
        ``hf://`` file prepared first (:class:`DemandRefused` when it cannot be)."""
        options = entry.options
        if given:
            options = LoadOptions.from_json({**options.to_json(), **given})
        if options.model.startswith("hf://"):
            options = options.replace(model=self._prepare_from_hub(options.model))
        return options

    def _prepare_from_hub(self, reference: str) -> str:
        """The local file of an hf:// preset: from the hub's cache, or downloaded into it, with
        the pull's events in the runtime's stream."""
        from skippyctl.acquisition.errors import PreparationError

        try:
            prepared = self.pulls.prepare(reference)
        except TooManyPulls as error:
            raise DemandRefused(
                Rejection(503, ReasonCode.RESERVATION_EXHAUSTED, str(error), retry_after_s=5)
            ) from error
        except PreparationError as error:
            raise DemandRefused(
                Rejection(503, error.reason, f"the model could not be prepared: {error}")
            ) from error
        return str(prepared.path)

    def _settle_demand(self, demand: Demand, server: ModelServer) -> None:
        if server.ready.exception() is None:
            with self._lock:
                if self._demands.get(demand.model_id) is demand:
                    del self._demands[demand.model_id]
                waiting = demand.waiting
            server.expect_arrivals(waiting)
            demand.future.set_result(server)
            return
        # Off the thread that failed the load (an engine's exit report): the reason may take
        # the pipeline a moment to apply.
        threading.Thread(
            target=lambda: self._refuse_demand(demand, self._load_failure(demand.model_id)),
            name=f"skippy-demand-{demand.model_id}",
            daemon=True,
        ).start()

    def _load_failure(self, model_id: LogicalId) -> Rejection:
        """How a request that waited for a load that failed is answered: the load's reason
        (from the state its events made), as a 503."""
        deadline = time.monotonic() + 2.0
        reason = None
        while reason is None and time.monotonic() < deadline:
            view = self.host.pipeline.state.models.get(model_id)
            # Only a failed load's reason: an earlier unload's (idle, …) is not this one's.
            failed = view is not None and view.state in _FAILED_LOAD_STATES
            reason = view.reason_code if failed and view is not None else None
            if reason is None:
                time.sleep(0.02)  # the pipeline applies the load's terminal within milliseconds
        reason = reason or ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE
        return Rejection(503, reason, f"model '{model_id}' could not be loaded ({reason})")

    def _refuse_demand(self, demand: Demand, rejection: Rejection) -> None:
        with self._lock:
            if self._demands.get(demand.model_id) is demand:
                del self._demands[demand.model_id]
        if not demand.future.done():
            demand.future.set_exception(DemandRefused(rejection))

    # -- generation -----------------------------------------------------------------------------
    def generate(
        self,
        model: str,
        params: GenerationParams,
        session_key: str | None = None,
        received_mono_ns: int | None = None,
    ) -> tuple[RequestHandle, Rejection | None]:
        """A handle for a request to ``model``; ``received_mono_ns``: when it came, if it
        waited for its model to load first (the receipt's queue wait counts the load)."""
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
                self.events.fact(
                    EventId.SESSION_REQUESTED,
                    Scope(model_id=server.model_id, session_id=session_id),
                )
        handle = RequestHandle(
            request_id=request_id,
            model_id=server.model_id if server is not None else LogicalId("unknown"),
            session_id=session_id,
            params=params,
            received_mono_ns=received_mono_ns or time.monotonic_ns(),
            on_finished=self._record_receipt,
        )
        if server is None:
            # The requested name is never echoed into events: it may be anything a client sent.
            rejection = Rejection(404, ReasonCode.MISSING_ARTIFACT, "model not loaded")
            self.events.event(
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

    def _record_receipt(self, handle: RequestHandle, finished: Finished) -> None:
        self.receipts.record(receipt_of(handle, finished, time.monotonic_ns()))

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

    def resolve_stream(self, handle: RequestHandle, offer: StreamOffer | None) -> bool:
        """Say who writes the stream of `handle`, whose engine holds its text: the engine,
        through `offer`, or the host (None) (``ModelServer.resolve_stream``). False if it
        cannot be said (the caller keeps `offer`)."""
        server = self.server(handle.model_id)
        return server is not None and server.resolve_stream(handle, offer)

    def session_released(self, handle: RequestHandle) -> None:
        if handle.session_id is not None:
            self.sessions.release(handle.session_id)

    def _abandon(self, server: ModelServer, session_id: LogicalId, reason: str) -> None:
        if server.engine is not None:
            server.engine.send(DropSession(str(session_id), reason))
        self.events.event(
            make_event(
                EventId.SESSION_ABANDONED,
                scope=Scope(model_id=server.model_id, session_id=session_id),
                reason_code=eviction_reason(reason),
            )
        )

    # -- unload ---------------------------------------------------------------------------------
    def unload(
        self,
        model_id: str,
        force: bool = False,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        cause: ReasonCode | None = None,
    ) -> LogicalId | None:
        """Start an unload in the background; its events say how it went (``cause``: why the
        runtime unloads it on its own account, e.g. ``idle``; None: it was asked to). None: not
        loaded."""
        server = self.server(model_id)
        if server is None:
            return None
        self._cancel_recovery(server.model_id)
        return self._start_unload(server, force, drain_timeout_s, cause)

    def _start_unload(
        self,
        server: ModelServer,
        force: bool = False,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        cause: ReasonCode | None = None,
    ) -> LogicalId:
        server.unloading = True
        operation_id, _ = self._ids.next("unload")
        threading.Thread(
            target=self._unload,
            args=(server, operation_id, force, drain_timeout_s, cause),
            name=f"skippy-unload-{server.model_id}",
            daemon=True,
        ).start()
        return operation_id

    def _unload(
        self,
        server: ModelServer,
        operation_id: LogicalId,
        force: bool,
        drain_timeout_s: float,
        cause: ReasonCode | None = None,
    ) -> None:
        try:
            self._unload_steps(server, operation_id, force, drain_timeout_s, cause)
        finally:
            server.gone.set()

    def _unload_steps(
        self,
        server: ModelServer,
        operation_id: LogicalId,
        force: bool,
        drain_timeout_s: float,
        cause: ReasonCode | None,
    ) -> None:
        scope = Scope(model_id=server.model_id)
        submit = self.events.always  # lifecycle: submitted with serving events off too
        started = time.monotonic_ns()
        submit(
            make_event(
                EventId.UNLOAD_REQUESTED,
                operation_id=operation_id,
                scope=scope,
                reason_code=cause,
            )
        )
        submit(make_event(EventId.UNLOAD_STARTED, operation_id=operation_id, scope=scope))
        running, queued = server.counts()
        draining = self.sessions.sessions_of(server.model_id)
        submit(
            make_event(
                EventId.SESSION_DRAINING_STARTED,
                operation_id=operation_id,
                scope=scope,
                summaries=summaries(
                    active_sessions=running, draining_sessions=len(draining), queue_depth=queued
                ),
            )
        )
        for session_id in draining:  # each one closes once the drain is over (below)
            submit(
                make_event(
                    EventId.SESSION_DRAINING,
                    operation_id=operation_id,
                    scope=Scope(model_id=server.model_id, session_id=session_id),
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
        store = self.session_state
        closed = self.sessions.drop_model(server.model_id, park=store is not None)
        for entry in closed:
            submit(
                make_event(
                    EventId.SESSION_CLOSED,
                    scope=Scope(model_id=server.model_id, session_id=entry.session_id),
                )
            )
        save: tuple[SessionFile, ...] = ()
        budget = 0
        if store is not None and closed:
            save, budget = store.save_plan([entry.session_id for entry in closed])
        engine = server.engine
        try:
            if engine is not None:
                self.host.stop_engine(server.model_id, save, budget)
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
                reason_code=cause,
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
        # Not a serving event: it flows with serving events off too.
        self.events.always(
            make_event(
                EventId.MEMORY_OBSERVED,
                scope=Scope(device_id=LogicalId("host")),
                summaries=summaries(memory_free_bytes=free, memory_total_bytes=total),
            )
        )
        self._check_memory_pressure()

    def _check_memory_pressure(self) -> None:
        """``memory_pressure_crossed`` / ``_cleared`` for the host, with hysteresis over the
        memory available (MemAvailable, runtime/memory_pressure.py); a crossing while models
        load is ``model_memory_pressure`` for each of them too."""
        reading = self.read_host_memory()
        if reading is None:
            return
        change = self.memory_pressure.observe(reading.available_bytes, reading.total_bytes)
        if change is None:
            return
        crossed = change is PressureChange.CROSSED
        figures = summaries(
            memory_free_bytes=reading.available_bytes, memory_total_bytes=reading.total_bytes
        )
        if crossed:
            for server in self.servers():
                if server.accepting and not server.ready.done():  # loading now
                    self.events.always(
                        make_event(
                            EventId.MODEL_MEMORY_PRESSURE,
                            scope=Scope(model_id=server.model_id, device_id=LogicalId("host")),
                            summaries=figures,
                        )
                    )
        self.events.always(
            make_event(
                EventId.MEMORY_PRESSURE_CROSSED if crossed else EventId.MEMORY_PRESSURE_CLEARED,
                scope=Scope(device_id=LogicalId("host")),
                summaries=figures,
            )
        )

    def _housekeeping(self) -> None:
        next_memory = 0.0
        wait_s = HOUSEKEEPING_INTERVAL_S
        while not self._stop.wait(wait_s):
            if time.monotonic() >= next_memory:
                next_memory = time.monotonic() + MEMORY_OBSERVATION_INTERVAL_S
                self._observe_host_memory()
            elif any(s.accepting and not s.ready.done() for s in self.servers()):
                # A load takes its memory within seconds: watch pressure closely meanwhile.
                self._check_memory_pressure()
            now = time.monotonic_ns()
            wait_s = min(HOUSEKEEPING_INTERVAL_S, self.heartbeat_interval_s / 2)
            for server in self.servers():
                server.expire_queued(now)
                server.expire_running(now)
                server.check_engine(now)
                if server.claim_idle_expired(now):
                    self._start_unload(server, cause=ReasonCode.IDLE)
                    continue
                expiry = server.idle_expiry_ns()
                if expiry is not None:
                    wait_s = min(wait_s, max(0.005, (expiry - time.monotonic_ns()) / 1e9))
                deadline = server.next_deadline_ns()
                if deadline is not None:
                    # Wake at the next deadline, not up to an interval after it.
                    wait_s = min(wait_s, max(0.005, (deadline - time.monotonic_ns()) / 1e9))
            for entry in self.sessions.expired():
                owner = self.server(entry.model_id)
                if owner is not None:
                    self._abandon(owner, entry.session_id, "ttl")

    def _save_sessions_for_next_runtime(self) -> None:
        """Each serving model's engine writes its sessions' KV state (most recently used
        first, within the store's cap) as it stops; then the store lists them for the next
        runtime. A model whose engine cannot save is stopped by the host as usual."""
        store = self.session_state
        if store is None:
            return
        for server in self.servers():
            engine = server.engine
            if server.unloading or engine is None or not engine.serving:
                continue
            closed = self.sessions.drop_model(server.model_id, park=True)
            if not closed:
                continue
            files, budget = store.save_plan([entry.session_id for entry in closed])
            try:
                self.host.stop_engine(server.model_id, files, budget)
            except Exception:  # noqa: BLE001 - the rest still stop; host.shutdown ends this one
                continue
        # A directory that cannot take the manifest: the next runtime starts afresh.
        with contextlib.suppress(OSError):
            store.persist(self.sessions.parked())

    def shutdown(self) -> None:
        """An orderly stop: requests end (cancelled), each serving model's sessions are saved
        for the next runtime in this directory (with a session state store)."""
        self._stop.set()
        with self._lock:
            recoveries = list(self._recoveries.values())
        for recovery in recoveries:
            recovery.stop.set()
        for server in self.servers():
            server.drain(force=True, drain_timeout_s=0.5)
        self._save_sessions_for_next_runtime()
        if self._thread.is_alive():
            self._thread.join(2)


def _serving(view: ModelView | None) -> bool:
    return view is not None and view.state in SERVING_MODEL_STATES


def _serving_or_loading(view: ModelView | None) -> bool:
    return _serving(view) or (view is not None and view.state in LOADING_MODEL_STATES)


def _serves(server: ModelServer, stop: threading.Event) -> bool:
    """Wait until ``server`` serves (True) or its load fails or ``stop`` is set (False)."""
    while not stop.is_set():
        try:
            server.ready.result(timeout=0.2)
        except TimeoutError:
            continue
        except Exception:  # noqa: BLE001 - ModelNotServing: its load failed
            return False
        return True
    return False


def _holds(server: ModelServer) -> bool:
    """Whether a model takes its memory (and a place among ``--max-models``): loading,
    serving or unloading, until its engine is gone."""
    return not server.gone.is_set() and (server.accepting or server.unloading)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.0f} MiB"
