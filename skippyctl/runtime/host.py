"""The runtime host: owns the pipeline, the native library status and one engine per model.

`RuntimeHost.start()` resolves the native event library once — the one its settings choose
(``RuntimeSettings.native_library``/``native_disabled``) — and says what it found as events
(`native_library_loaded` + `abi_feature_compatibility_established`, or `native_library_unavailable`
/ `abi_feature_compatibility_failed` — legacy mode, state from return values only; and one
`abi_feature_compatibility_failed` with that family's `feature_bits` for each announced family
whose symbols are missing, which is off alone while the rest of the native path serves).
`load_model` validates the request, pre-checks the artifact and starts an engine through the
supervisor (``runtime/engine_supervisor.py``), telling it the host's
:class:`~skippyctl.engine.options.EngineOptions` as spawn arguments; every outcome arrives as
events through the pipeline, ending in exactly one terminal for the operation.

Invariants:

- Once `model_load_requested` is submitted, the operation ends in exactly one terminal whatever
  raises on the way (a path the OS refuses, an engine that cannot be spawned): the host settles it
  as `model_load_failed` with a reason code and the model id is free to load again.
- A load that fails or is cancelled leaves no engine behind: the engine is retired (stopped,
  reaped, its ring closed) as soon as its load ends without a serving context.
- A split load (``stages``/``local_stages``) gets a :class:`~skippyctl.runtime.topology.Topology`
  before its engine: local stages started, every stage probed, the layers planned; a refusal
  settles the load with the topology's reason and no engine is started. The topology (and the
  local stages it started) belongs to the model's engine: closed when the engine is discarded,
  stopped for an unload, replaced by a new load, or at shutdown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from skippyctl.acquisition.artifacts import check_artifact
from skippyctl.config.endpoints import parse_endpoints
from skippyctl.config.load_options import FlashAttention, LoadOptions, SpecMode, shown_settings
from skippyctl.config.runtime_settings import EngineStderr, RuntimeSettings
from skippyctl.engine.chat_template import read_template_file as read_chat_template
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol_commands import Load, SessionFile, Shutdown
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, make_event, settings, summaries
from skippyctl.events.identity import OperationIds, model_id_for
from skippyctl.events.reasons import DegradedMode, Outcome, ReasonCode
from skippyctl.pipeline.authority import OperationBound, OperationRejected
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.pipeline.reconcile import HOST_ENGINE_KEY
from skippyctl.pipeline.warnings import degraded_operation
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    SETTLED_MODEL_STATES,
    RuntimeView,
)
from skippyctl.runtime.engine_seams import EngineListener
from skippyctl.runtime.engine_supervisor import EngineHello, EngineProcess, LoadCommand
from skippyctl.runtime.topology import Assembled, Topology, TopologyRefused

ENGINE_HELLO_TIMEOUT_S: Final = 60.0
REJECTION_SETTLE_S: Final = 2.0
"""How long a refused load's answer waits for the state to show the refusal (the pipeline
applies it within milliseconds; a stalled pipeline must not hold the answer longer)."""
SAVE_STOP_TIMEOUT_S: Final = 90.0
"""How long an unload that saves session state waits for its engine to exit (the engine gives
the save 60 s, engine/engine_worker.py)."""
Admission = Callable[[LogicalId], tuple[str, ReasonCode] | None]
"""Model id → None (the load may start), or why not: a message for people and the reason."""
RestorePlan = Callable[[LogicalId], tuple[tuple[SessionFile, ...], int]]
"""Model id → the session state files its load restores and the largest file size to read."""


@dataclass(frozen=True, slots=True)
class LoadHandle:
    operation_id: LogicalId
    model_id: LogicalId | None
    problem: str | None = None
    """A message for people when the host refused the load before any engine work."""
    already_available: bool = False
    """The model already serves: nothing was started and no events follow."""


@dataclass(frozen=True, slots=True)
class NativeStatus:
    library: Any | None
    problem_event: EventId | None
    detail: str | None


def _settled(state: RuntimeView, model_id: LogicalId, operation_id: LogicalId) -> bool:
    model = state.models.get(model_id)
    return (
        model is not None
        and model.operation_id == operation_id
        and model.state in SETTLED_MODEL_STATES
    )


def llama_cpp_importable() -> bool:
    """Whether the engine's llama.cpp binding can be found (without importing it here: the host
    process never loads llama.cpp)."""
    import importlib.util

    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def resolve_native(settings: RuntimeSettings) -> NativeStatus:
    from skippyctl.native.library import (
        NativeAbiIncompatible,
        NativeLibraryUnavailable,
        open_native_library,
    )

    try:
        library = open_native_library(settings.native_library, settings.native_disabled)
    except NativeLibraryUnavailable as error:
        return NativeStatus(None, EventId.NATIVE_LIBRARY_UNAVAILABLE, str(error))
    except NativeAbiIncompatible as error:
        return NativeStatus(None, EventId.ABI_FEATURE_COMPATIBILITY_FAILED, str(error))
    return NativeStatus(library, None, None)


class RuntimeHost:
    def __init__(
        self,
        pipeline: Pipeline | None = None,
        options: EngineOptions | None = None,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.pipeline = pipeline or Pipeline()
        self.settings = settings or RuntimeSettings()
        """The process's settings (read once at its start; the defaults when not given)."""
        self.options = options or EngineOptions.from_settings(
            self.settings, debug_token_events=self.settings.debug_token_events
        )
        """What every engine this host starts is told (spawn arguments, decided once)."""
        self.default_plugins: tuple[str, ...] = ()
        self.memory_budget_bytes: int | None = None
        """The runtime's memory budget for its models (the scheduler keeps it), stated in
        ``runtime_initialized``."""
        """Serving plugins every model gets before its own (``runtime serve --plugin``)."""
        self.native = NativeStatus(None, None, None)
        self._ids = OperationIds()
        self._engines: dict[LogicalId, EngineProcess] = {}
        self._lost_stages: set[LogicalId] = set()
        """Stages a split model's engine lost (runtime/topology.py): the next load that reaches
        one again reports its connection recovered."""
        self._operations: dict[LogicalId, EngineProcess] = {}
        self._timers: list[threading.Timer] = []
        self._assembling: dict[LogicalId, Topology] = {}
        """Split loads whose topology is being assembled (no engine yet), for ``cancel``."""
        self._lock = threading.Lock()

    def start(self) -> RuntimeHost:
        self.pipeline.start()
        self.pipeline.submit(make_event(EventId.RUNTIME_RESOLUTION_STARTED))
        llama_found = llama_cpp_importable()
        self.native = resolve_native(self.settings)
        if llama_found:
            # llama.cpp is what serves; the native event library is optional (legacy without).
            self.pipeline.submit(
                make_event(EventId.RUNTIME_RESOLUTION_COMPLETED, outcome=Outcome.SUCCESS)
            )
        else:
            self.pipeline.submit(
                make_event(
                    EventId.RUNTIME_RESOLUTION_FAILED,
                    outcome=Outcome.FAILURE,
                    reason_code=ReasonCode.MISSING_ARTIFACT,
                )
            )
        if self.native.library is not None:
            features = int(self.native.library.features)
            abi = int(self.native.library.abi_version)
            self.pipeline.submit(
                make_event(
                    EventId.NATIVE_LIBRARY_LOADED,
                    summaries=summaries(abi_version=abi, feature_bits=features),
                )
            )
            self.pipeline.submit(
                make_event(
                    EventId.ABI_FEATURE_COMPATIBILITY_ESTABLISHED,
                    outcome=Outcome.SUCCESS,
                    summaries=summaries(abi_version=abi, feature_bits=features),
                )
            )
            for family in self.native.library.disabled_families:
                # An announced family with a missing symbol is off alone; the rest serves.
                self.pipeline.submit(
                    make_event(
                        EventId.ABI_FEATURE_COMPATIBILITY_FAILED,
                        outcome=Outcome.FAILURE,
                        reason_code=ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
                        summaries=summaries(abi_version=abi, feature_bits=int(family)),
                    )
                )
        elif self.native.problem_event is not None:
            incompatible = self.native.problem_event is EventId.ABI_FEATURE_COMPATIBILITY_FAILED
            reason = (
                ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                if incompatible
                else ReasonCode.UNSUPPORTED_CAPABILITY
            )
            if incompatible:  # found, but refused: the host runs without it (legacy mode)
                self.pipeline.submit(
                    make_event(
                        EventId.NATIVE_LIBRARY_REJECTED,
                        outcome=Outcome.FAILURE,
                        reason_code=reason,
                    )
                )
            self.pipeline.submit(
                make_event(self.native.problem_event, outcome=Outcome.FAILURE, reason_code=reason)
            )
            # Engines run without a shared-memory ring for this process's life: say so once.
            self.pipeline.submit(degraded_operation(True, DegradedMode.LEGACY_INGRESS, reason))
        self.pipeline.submit(
            make_event(
                EventId.RUNTIME_INITIALIZED,
                outcome=Outcome.SUCCESS,
                summaries=summaries(memory_limit_bytes=self.memory_budget_bytes),
            )
        )
        return self

    # -- loading --------------------------------------------------------------------------------
    def load_model(
        self,
        options: LoadOptions,
        listener: EngineListener | None = None,
        restore: RestorePlan | None = None,
        admit: Admission | None = None,
    ) -> LoadHandle:
        """Start loading; the outcome arrives as events ending in one terminal for the
        returned operation. `listener` receives the engine's serving messages from the start;
        `restore` names the session state files the engine restores once it serves; `admit`
        is asked, once the model's id is known and before anything starts, whether the load
        may go ahead (it may make room first): its refusal fails the load with its reason."""
        operation_id, native_operation = self._ids.next("load")
        topology_id = LogicalId(f"topology-{native_operation}") if options.split else None
        model_id: LogicalId | None = None
        try:
            problem = options.problem()
            plugin_less = not (self.default_plugins or options.plugins)
            if problem is None and options.spec is SpecMode.PLUGIN and plugin_less:
                problem = "--spec plugin needs a serving plugin (--plugin)"
            if problem is None:
                model_id = model_id_for(options.model, options.alias)
        except Exception as error:  # noqa: BLE001 - refused below, with its own terminal
            problem = f"invalid load request ({type(error).__name__})"
        if problem is None:
            assert model_id is not None
            current = self.pipeline.state.models.get(model_id)
            if current is not None and current.state in SERVING_MODEL_STATES:
                # Idempotent: loading what already serves is a success, not a new operation.
                return LoadHandle(
                    current.operation_id or operation_id, model_id, already_available=True
                )
            if current is not None and current.state not in SETTLED_MODEL_STATES:
                problem = f"model {model_id} is already {current.state.value}; wait or unload it"
        refused = ReasonCode.INVALID_CONFIGURATION
        if problem is None and admit is not None:
            assert model_id is not None
            refusal = admit(model_id)
            if refusal is not None:
                problem, refused = refusal
        self.pipeline.submit(
            make_event(
                EventId.MODEL_LOAD_REQUESTED,
                operation_id=operation_id,
                scope=Scope(model_id=model_id, topology_id=topology_id),
                summaries=summaries(context_tokens=options.ctx, lanes=options.lanes),
                settings=settings(shown_settings(options)),
            )
        )
        if problem is not None:
            self._reject(operation_id, native_operation, model_id, refused)
            return LoadHandle(operation_id, model_id, problem)
        assert model_id is not None
        started: list[EngineProcess] = []
        topology = (
            None
            if topology_id is None
            else Topology(
                topology_id,
                model_id,
                operation_id,
                self.pipeline.submit,
                parse_endpoints(options.stages),
                options.local_stages,
                options.local_stage_mem_mib,
                replan=options.replan,
                lost_stages=self._lost_stages,
                link_p95_threshold_ms=options.stage_link_p95_ms,
            )
        )
        try:
            return self._start_load(
                options,
                listener,
                operation_id,
                native_operation,
                model_id,
                started,
                topology,
                restore,
            )
        except Exception as error:  # noqa: BLE001 - whatever raised, the operation must settle
            # A ValueError/TypeError here is the request's doing (e.g. a path the OS refuses);
            # anything else is the host's (e.g. no process could be spawned).
            invalid = isinstance(error, ValueError | TypeError)
            reason = (
                ReasonCode.INVALID_CONFIGURATION if invalid else ReasonCode.INTERNAL_RUNTIME_FAILURE
            )
            for engine in started:
                self._discard_engine(engine)
            if topology is not None:
                topology.close()
            self._reject(operation_id, native_operation, model_id, reason)
            what = "invalid model path" if invalid else "the engine could not be started"
            return LoadHandle(operation_id, model_id, f"{what} ({type(error).__name__})")

    def _start_load(
        self,
        options: LoadOptions,
        listener: EngineListener | None,
        operation_id: LogicalId,
        native_operation: int,
        model_id: LogicalId,
        started: list[EngineProcess],
        topology: Topology | None = None,
        restore: RestorePlan | None = None,
    ) -> LoadHandle:
        path = Path(options.model).expanduser()
        artifact_problem = check_artifact(path)
        if artifact_problem is not None:
            self._reject(operation_id, native_operation, model_id, artifact_problem.reason)
            return LoadHandle(operation_id, model_id, artifact_problem.message)
        resolved = str(path.resolve())
        draft_path: str | None = None
        if options.draft is not None:
            draft = Path(options.draft).expanduser()
            draft_problem = check_artifact(draft)
            if draft_problem is not None:
                self._reject(operation_id, native_operation, model_id, draft_problem.reason)
                return LoadHandle(operation_id, model_id, f"--draft: {draft_problem.message}")
            draft_path = str(draft.resolve())
        template_text: str | None = None
        if options.chat_template is not None:
            template_text, template_problem = read_chat_template(options.chat_template)
            if template_problem is not None:
                self._reject(
                    operation_id, native_operation, model_id, ReasonCode.INVALID_CONFIGURATION
                )
                return LoadHandle(operation_id, model_id, f"--chat-template: {template_problem}")
        assembled = Assembled((), options.gpu_layers)
        if topology is not None:
            # Before any engine exists: stages started and probed, the plan made (or refused).
            # The assembly counts against the load's timeout and can be cancelled (``cancel``).
            self._start_timeout(options, operation_id)
            with self._lock:
                self._assembling[operation_id] = topology
            try:
                assembled = topology.assemble(path)
            except TopologyRefused as refused:
                with self._lock:
                    self._assembling.pop(operation_id, None)
                topology.close()
                self._reject(operation_id, native_operation, model_id, refused.reason)
                return LoadHandle(operation_id, model_id, refused.message)
        engine = EngineProcess(
            f"{model_id}-{native_operation}",
            model_id,
            self.pipeline,
            self.native.library,
            self._on_hello,
            listener,
            self._on_retire,
            # Without flash attention ('off', and 'auto' on the CPU) the engine computes on the
            # batch-invariant kernels (engine/kernels.py): its greedy texts then do not depend
            # on the batch. Mapped for 'auto' on a GPU too, where they serve what stays on
            # the CPU.
            replace(self.options, invariant_kernels=options.flash_attn is not FlashAttention.ON),
            topology,
            inherit_stderr=self.settings.engine_stderr is EngineStderr.INHERIT,
        )
        started.append(engine)
        with self._lock:
            previous = self._engines.get(model_id)
            self._engines[model_id] = engine
            self._operations[operation_id] = engine
            self._assembling.pop(operation_id, None)
        if previous is not None:
            previous.stop()
            previous.close_ring()
            if previous.topology is not None:
                previous.topology.close()
        _, serving_operation = self._ids.next("serve")
        files, max_bytes = restore(model_id) if restore is not None else ((), 0)
        engine.load(
            LoadCommand(
                model_id,
                Load(
                    operation_id=str(operation_id),
                    native_operation=native_operation,
                    serving_operation=serving_operation,
                    options=options.replace(
                        model=resolved,
                        draft=draft_path,
                        chat_template=None,
                        plugins=(*self.default_plugins, *options.plugins),
                        gpu_layers=assembled.gpu_layers,
                    ),
                    stage_plan=assembled.stages,
                    restore=files,
                    state_max_bytes=max_bytes if files else 0,
                    chat_template_text=template_text,
                ),
            )
        )
        if topology is None:
            self._start_timeout(options, operation_id)
        elif topology.cancel_reason is not None:
            # Cancelled after the assembly's last check, before the engine could be asked.
            self.cancel(operation_id, topology.cancel_reason)
        return LoadHandle(operation_id, model_id)

    def _start_timeout(self, options: LoadOptions, operation_id: LogicalId) -> None:
        """``--timeout``: the load is cancelled with ``timeout`` once it has run that long."""
        if options.timeout_s is None:
            return
        timer = threading.Timer(
            options.timeout_s, self.cancel, args=(operation_id, ReasonCode.TIMEOUT)
        )
        timer.name = f"skippy-timeout-{operation_id}"
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _on_retire(self, engine: EngineProcess) -> None:
        """The engine's load ended without a serving context (reader or cancel thread): stop
        and reap it off that thread."""
        threading.Thread(
            target=self._discard_engine, args=(engine,), name=f"skippy-retire-{engine.key}"
        ).start()

    def _discard_engine(self, engine: EngineProcess) -> None:
        with self._lock:
            if self._engines.get(engine.model_id) is engine:
                del self._engines[engine.model_id]
            for operation, owner in list(self._operations.items()):
                if owner is engine:
                    del self._operations[operation]
        engine.stop()
        engine.close_ring()
        if engine.topology is not None:
            engine.topology.close()

    def _reject(
        self,
        operation_id: LogicalId,
        native_operation: int,
        model_id: LogicalId | None,
        reason: ReasonCode,
    ) -> None:
        self.pipeline.submit_authority(
            OperationBound(
                HOST_ENGINE_KEY, operation_id, native_operation, model_id or LogicalId("unknown")
            )
        )
        self.pipeline.submit_authority(OperationRejected(operation_id, reason))
        if model_id is not None:
            # The refusal is answered once the state says so: a caller that reads /health or
            # `ps` right after the answer sees the model failed, not still requested.
            self.pipeline.wait_state(
                lambda state: _settled(state, model_id, operation_id), REJECTION_SETTLE_S
            )

    def cancel(self, operation_id: LogicalId, reason: ReasonCode = ReasonCode.CANCELLATION) -> None:
        """Cancel a load that is still under way; a load that already settled is left alone
        (a late timeout timer or Ctrl-C must not touch a model that now serves)."""
        with self._lock:
            engine = self._operations.get(operation_id)
            assembling = self._assembling.get(operation_id)
        if engine is None:
            if assembling is not None:
                assembling.cancel(reason)
            return
        view = self.pipeline.state.models.get(engine.model_id)
        if view is not None and (
            view.operation_id != operation_id or view.state not in LOADING_MODEL_STATES
        ):
            return
        engine.cancel(operation_id, reason)

    def _on_hello(self, engine: EngineProcess, hello: EngineHello) -> None:
        if self.native.library is not None and not hello.native:
            # The host has the library but this engine could not use it: say so, once per engine.
            self.pipeline.submit(
                make_event(
                    EventId.ABI_FEATURE_COMPATIBILITY_FAILED,
                    scope=Scope(model_id=engine.model_id),
                    outcome=Outcome.FAILURE,
                    reason_code=ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
                )
            )
        self.pipeline.submit(
            make_event(
                EventId.ENGINE_PROCESS_STARTED,
                scope=Scope(model_id=engine.model_id),
                summaries=summaries(feature_bits=hello.features),
            )
        )

    def stop_engine(
        self, model_id: LogicalId, save: tuple[SessionFile, ...] = (), save_budget_bytes: int = 0
    ) -> None:
        """Stop a model's engine in an orderly way (unload); no-op when there is none. With
        ``save`` the engine first writes those sessions' KV state files (its outcomes arrive
        at its listener before it exits)."""
        with self._lock:
            engine = self._engines.pop(model_id, None)
        if engine is not None:
            if save:
                engine.stop(SAVE_STOP_TIMEOUT_S, Shutdown(save, save_budget_bytes))
            else:
                engine.stop()
            engine.close_ring()
            if engine.topology is not None:
                engine.topology.close()

    def engine_pids(self) -> dict[str, int]:
        """Live engine processes by model id (for operators: `ps`, kill -9 drills)."""
        with self._lock:
            return {str(m): e.pid for m, e in self._engines.items() if not e.exited}

    def engine_for(self, model_id: LogicalId) -> EngineProcess | None:
        with self._lock:
            return self._engines.get(model_id)

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = 2.0) -> None:
        for timer in self._timers:
            timer.cancel()
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        self.pipeline.submit(make_event(EventId.RUNTIME_STOPPING))
        for engine in engines:
            engine.stop()
            engine.close_ring()
            if engine.topology is not None:
                engine.topology.close()
        self.pipeline.submit(make_event(EventId.RUNTIME_STOPPED, outcome=Outcome.SUCCESS))
        self.pipeline.shutdown(timeout_s)
