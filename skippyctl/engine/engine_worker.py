"""The engine worker process: owns llama.cpp for one model.

Run by the host's supervisor (``skippyctl/runtime/engine_supervisor.py``) as
`python -m skippyctl.engine.engine_worker --control-fd N [--ring-fd M --native-library PATH]
--serving-events on|off --debug-token-events on|off …` (``engine/options.py``): everything the
host decided about this engine arrives as arguments — the test fault injections too — and the
worker reads no configuration from its environment. With a ring, llama.cpp's progress and log
callbacks point straight at C functions of the native library (no Python on the callback path),
and the worker brackets each load in a native operation scope.
Without one (legacy mode) it only reports return values. Either way the authoritative result of
every llama.cpp call is sent on the control channel after the native scope has ended, so the host
drains every native fact of the operation before it sees the return.

llama.cpp may abort this process (GGML_ASSERT on a bad vocabulary); the supervisor reports that as
`process_crash`. GGML_NO_BACKTRACE is set by the supervisor so an abort does not run gdb.

Nothing the host forwards from a client may end this process: an unusable frame or command is
counted and answered with `ProtocolError` — or, when it names its request or load, with that
command's one terminal (`GenDone` failed with invalid_configuration, `LoadReturned` failed) —
and any exception while handling a command ends that command only: a `Generate` with its one
`GenDone` (failed, with a reason code), a `Load` with a failed `LoadReturned`/`ContextReturned`.
The main thread reads the channel and answers `Ping` with `Pong` without touching the decode
thread, so the host can tell a stuck process from a busy one.

Resources (``engine/protocol.py`` resource messages): a load reports ggml's backends and devices
first (`Backends`, with `CpuFallback` when GPU layers were asked for and no GPU exists), each
phase it passes (`LoadPhase`: weights loaded, allocating ctx, context ready), and where the
memory went (`MemoryAllocated`: llama.cpp's per-device weights/KV/compute figures, or totals).
A context whose KV cache (the geometry's estimate) goes in host memory and exceeds the memory
available — MemAvailable, capped by an RLIMIT_AS — is refused before llama.cpp is asked
(`AllocationRefused` and `ContextReturned` with `out_of_memory`); a NULL context is
`resource_allocation_failure`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, assert_never

from skippyctl.config.load_options import LoadOptions, SpecMode
from skippyctl.engine import options as engine_options
from skippyctl.engine.channel import ControlChannel, MalformedMessage, engine_side
from skippyctl.engine.geometry import available_memory_bytes, kv_bytes_per_token, plan_context
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol_commands import (
    Cancel,
    Command,
    DropSession,
    Generate,
    Load,
    Ping,
    SaveSessions,
    Shutdown,
)
from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    BufferReport,
    ContextBegun,
    ContextReturned,
    CpuFallback,
    DeviceReport,
    EngineMessage,
    GenDone,
    Hello,
    LoadBegun,
    LoadPhase,
    LoadPhaseName,
    LoadReturned,
    MemoryAllocated,
    PluginReported,
    Pong,
    ProtocolError,
    StateExported,
)
from skippyctl.engine.speculation import SPEC_OFF, SpecConfig
from skippyctl.events.reasons import ReasonCode

INITIAL_LINK_SAMPLES: Final = 3
"""Round trips to each stage right after a split model loaded (engine/links.py)."""
SAVE_TIMEOUT_S: Final = 60.0
"""The most a ``Shutdown`` waits for the decode thread to write session state files."""
CPU_DEVICE: Final = "CPU"
_GPU_KINDS: Final = frozenset({"gpu", "igpu"})
MAX_CONTEXT_TOKENS: Final = 2**32 - 1
"""``llama_context_params.n_ctx`` is a uint32_t."""
SPLIT_COUNT_KEY: Final = b"split.count"
"""The GGUF key llama.cpp's loader reads for the number of parts of a split set (a uint16)."""
SPLIT_COUNT_VALUE_BYTES: Final = 16
"""Room for a uint16's decimal text and its NUL (a longer value is refused, not truncated)."""


@dataclass(slots=True)
class _Loaded:
    model: Any
    context: Any | None = None
    generation: Any | None = None  # BatchEngine once the context exists
    plugins: Any | None = None  # PluginLink (skippyctl.plugins.link) of its serving plugins
    draft: Any | None = None  # DraftModel (engine/draft.py) of --draft
    fingerprint: bytes | None = None
    """The model file's (engine/kv_state.py); None when it could not be read."""


class Worker:
    def __init__(
        self,
        channel: ControlChannel[EngineMessage, Command],
        ring_fd: int | None,
        capture_debug_log: bool,
        options: EngineOptions | None = None,
        native_library: str | None = None,
    ) -> None:
        self.channel = channel
        self.options = options or EngineOptions()
        self.adapter: Any | None = None
        self.native_problem: str | None = None
        self.features = 0
        """The native families this engine uses (the library's usable feature mask)."""
        self._load_events = False
        """The per-call model-open family is there: loads report through the native hooks."""
        self.loaded: _Loaded | None = None
        self.protocol_errors = 0
        self._stage_arrays: tuple[Any, ...] = ()
        self._stage_devices: list[int] = []
        self._links: Any | None = None  # LinkProber of a split model (engine/links.py)
        self._backends: Any | None = None  # GgmlBackends (native/backends.py), once looked up
        self._backends_looked_up = False
        self._device = CPU_DEVICE
        """The device the current load places its model on (a short registry name)."""
        import llama_cpp

        self.llama = llama_cpp
        llama_cpp.llama_backend_init()
        if ring_fd is not None:
            self._setup_native(ring_fd, capture_debug_log, native_library)

    def _setup_native(
        self, ring_fd: int, capture_debug_log: bool, native_library: str | None
    ) -> None:
        """Attach the host's ring, with the library the host checked (``native_library``; None:
        the one built in the package)."""
        try:
            # Only the engine-side modules: this runs in every engine start, inside the time
            # to model_available (the host's fact decoding in native.ingress is not needed here).
            from skippyctl.native.abi import FeatureBit
            from skippyctl.native.devices import resolve_ggml
            from skippyctl.native.library import (
                NativeAbiIncompatible,
                NativeLibraryUnavailable,
                load_native_library,
            )
            from skippyctl.native.region import EngineAdapter, IngressRegion

            library = load_native_library(None if native_library is None else Path(native_library))
            ring = IngressRegion.attach(ring_fd, library=library)
            self.adapter = EngineAdapter(ring, capture_debug_log=capture_debug_log)
            self.features = library.features
            self._load_events = library.has(FeatureBit.RUNTIME_EVENTS)
            resolve_ggml(library)  # UNSUPPORTED, not an error, without the device family
            log_counting = library.has(FeatureBit.DIAGNOSTIC_EVENTS)
        except (NativeLibraryUnavailable, NativeAbiIncompatible, OSError) as error:
            self.adapter = None
            self.native_problem = type(error).__name__
            return
        if self.options.test_progress_delay_us > 0:
            self.adapter.set_test_progress_delay_us(self.options.test_progress_delay_us)
        if log_counting:
            log_callback = self.llama.llama_log_callback(self.adapter.log_callback_address)
            self._log_callback = log_callback  # keep the function pointer object alive
            self.llama.llama_log_set(log_callback, self.adapter.user_data)

    def hello(self) -> None:
        self._send(Hello(os.getpid(), self.adapter is not None, self.native_problem, self.features))

    def serve(self) -> int:
        self.hello()
        while True:
            try:
                command = self.channel.receive()
            except MalformedMessage as error:
                # The frame was consumed whole: the channel is in step, carry on.
                self._malformed(error)
                continue
            if command is None:
                self._free()
                return 0
            try:
                serving = self._dispatch(command)
            except Exception:  # noqa: BLE001 - one command's failure must not end the engine
                self._command_failed(command)
                continue
            if not serving:
                self._free()
                return 0

    def _dispatch(self, command: Command) -> bool:
        """Handle one command; False when it ends the engine."""
        match command:
            case Ping():
                self._send(Pong(command.seq))
            case Load():
                self._load(command)
            case Generate():
                self._generate(command)
            case Cancel():
                if self._batch is not None:
                    self._batch.cancel(command.request_id)
            case DropSession():
                if self._batch is not None:
                    self._batch.drop_session(command.session, command.reason)
            case SaveSessions():
                self._save_now(command)
            case Shutdown():
                try:
                    self._save_sessions(command)
                except Exception:  # noqa: BLE001 - a failed save must not keep the engine up
                    self.protocol_errors += 1
                return False
            case _:
                assert_never(command)
        return True

    def _malformed(self, error: MalformedMessage) -> None:
        """An unusable frame or command. One that names its request or load gets that command's
        terminal (so nothing waits for it); anything else cannot be attributed (the host encodes
        every frame itself, so it is a bug) and is counted."""
        if error.tag == "generate" and error.correlation_id is not None:
            self._send(GenDone.refused(error.correlation_id, ReasonCode.INVALID_CONFIGURATION))
        elif error.tag == "load" and error.correlation_id is not None:
            self._send(LoadReturned(error.correlation_id, ok=False))
        else:
            self.protocol_errors += 1
            self._send(ProtocolError(self.protocol_errors))

    def _command_failed(self, command: Command) -> None:
        """The terminal of a command whose handling raised (never re-raises)."""
        try:
            if isinstance(command, Generate):
                self._send(GenDone.refused(command.request_id, ReasonCode.INTERNAL_RUNTIME_FAILURE))
        except Exception:  # noqa: BLE001 - the serve loop must go on whatever happens here
            self.protocol_errors += 1

    def _send(self, message: EngineMessage) -> None:
        # A host that went away is noticed by the serve loop (end of stream); nothing to do here.
        self.channel.send(message)

    def _send_many(self, messages: list[EngineMessage]) -> int:
        """One decode step's messages in one write; how many could not be framed."""
        _sent, unframable = self.channel.send_many(messages)
        return unframable

    def _arm_abort(self, context: Any, serving_operation: int) -> None:
        """Point llama_decode's abort callback at the native layer, inside a serving scope, so the
        host can stop a decode in flight (forced unload) through shared memory, not Python."""
        if self.adapter is None or serving_operation <= 0:
            return
        self.adapter.operation_begin(serving_operation, serving_operation)
        self._abort_callback = self.llama.ggml_abort_callback(self.adapter.abort_callback_address)
        self.llama.llama_set_abort_callback(context, self._abort_callback, self.adapter.user_data)

    @property
    def _batch(self) -> Any | None:
        return None if self.loaded is None else self.loaded.generation

    def _generate(self, command: Generate) -> None:
        from skippyctl.engine.generation import GenerateRequest
        from skippyctl.engine.sampling import SamplingParams

        try:
            if self._batch is None:
                raise ValueError("no model is loaded in this engine")
            sampling = command.sampling
            timeout = command.timeout_s
            request = GenerateRequest(
                request_id=command.request_id,
                prompt=command.prompt,
                messages=command.messages,
                session=command.session,
                max_tokens=command.max_tokens,
                stop=command.stop,
                # Validated here, not on the host: an out-of-range value fails this request.
                sampling=SamplingParams(
                    temperature=sampling.temperature,
                    top_k=sampling.top_k,
                    top_p=sampling.top_p,
                    min_p=sampling.min_p,
                    repeat_penalty=sampling.repeat_penalty,
                    seed=sampling.seed,
                    logit_bias=sampling.logit_bias,
                ),
                deadline_mono_s=None if timeout is None else time.monotonic() + timeout,
            )
        except Exception:  # noqa: BLE001 - any bad field refuses this request, never the engine
            self._send(GenDone.refused(command.request_id, ReasonCode.INVALID_CONFIGURATION))
            return
        self._batch.submit(request)

    def _load(self, command: Load) -> None:
        """Load the model, then its context. Exactly one failed reply ends a load that raised:
        `LoadReturned` if the model was not returned yet, else `ContextReturned`."""
        operation_id = command.operation_id
        owed: type[LoadReturned] | type[ContextReturned] | None = LoadReturned
        scope_open = False
        try:
            llama = self.llama
            native_operation = command.native_operation
            gpu_layers = command.options.gpu_layers
            path = os.fsencode(command.options.model)
            if b"\0" in path:
                raise ValueError("a model path cannot contain NUL")  # C would truncate it
            params = llama.llama_model_default_params()
            params.n_gpu_layers = gpu_layers
            if command.stage_plan:
                self._split_across_stages(params, command)
            adapter = self.adapter if self._load_events else None
            if adapter is not None:
                adapter.model_load_begin(native_operation, native_operation)
                scope_open = True
                params.progress_callback = llama.llama_progress_callback(
                    adapter.progress_callback_address
                )
                params.progress_callback_user_data = adapter.user_data
            self._send(LoadBegun(operation_id))
            self._report_backends(command)
            if adapter is not None:
                adapter.report_device(gpu_layers)
            started = time.perf_counter()
            model = llama.llama_model_load_from_file(path, params)
            duration_ms = round((time.perf_counter() - started) * 1000, 3)
            ok = bool(model)
            if adapter is not None:
                scope_open = False
                self._end_load_scope(ok)
            if ok:
                self.loaded = _Loaded(model, fingerprint=_fingerprint(command.options.model))
                if command.stage_plan:
                    self._start_link_probes()
                self._send(LoadPhase(operation_id, LoadPhaseName.WEIGHTS_LOADED))
                reply = LoadReturned(
                    operation_id,
                    ok=True,
                    duration_ms=duration_ms,
                    model_size_bytes=int(llama.llama_model_size(model)),
                    parameters=int(llama.llama_model_n_params(model)),
                    layers=int(llama.llama_model_n_layer(model)),
                    context_train_tokens=int(llama.llama_model_n_ctx_train(model)),
                    vocab_size=int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))),
                    files=_files_opened(llama, model),
                )
            else:
                reply = LoadReturned(operation_id, ok=False, duration_ms=duration_ms)
            owed = ContextReturned if ok else None
            self._send(reply)
            if not ok:
                return
            self._create_context(command, model)
        except Exception:  # noqa: BLE001 - a load that raised fails; the engine stays up
            if scope_open:
                self._end_load_scope(False)
            if owed is not None:
                self._send(owed(operation_id, ok=False))

    def _ggml(self) -> Any | None:
        """ggml's registry (native/backends.py), None where it cannot be read."""
        if not self._backends_looked_up:
            self._backends_looked_up = True
            from skippyctl.native.backends import BackendsUnavailable, GgmlBackends

            try:
                self._backends = GgmlBackends()
            except BackendsUnavailable:
                self._backends = None
        return self._backends

    def _report_backends(self, command: Load) -> None:
        """``Backends``: the registry and its devices (llama_backend_init ran at start), the one
        the model goes on selected; ``CpuFallback`` when GPU layers were asked for and there is
        no GPU. A split load's layers go to RPC stages, which their topology reports."""
        ggml = self._ggml()
        if ggml is None:
            return
        devices = ggml.devices()
        gpus = [d for d in devices if d.kind in _GPU_KINDS]
        wants_gpu = command.options.gpu_layers != 0 and not command.stage_plan
        chosen = gpus[0].name if wants_gpu and gpus else CPU_DEVICE
        self._device = chosen
        self._send(
            Backends(
                command.operation_id,
                ok=bool(devices),
                backends=len(ggml.backends()),
                devices=tuple(
                    DeviceReport(
                        d.name,
                        d.kind,
                        d.memory_free_bytes,
                        d.memory_total_bytes,
                        selected=d.name == chosen,
                    )
                    for d in devices
                ),
            )
        )
        if wants_gpu and not gpus:
            self._send(CpuFallback(command.operation_id, command.options.gpu_layers, CPU_DEVICE))

    def _split_across_stages(self, params: Any, command: Load) -> None:
        """Point the model's layers at the RPC stages: one ``add_server`` per stage (ggml
        connects and says HELLO; it aborts this process when the stage is gone, which the host
        attributes), its first device, NULL-terminated, layer split with the host's
        proportions. The arrays stay referenced for as long as the model lives."""
        import ctypes

        from skippyctl.native.rpc import GgmlRpc

        llama = self.llama
        rpc = GgmlRpc()
        devices: list[int] = []
        for stage in command.stage_plan:
            registry = rpc.add_server(stage.endpoint)
            found = [] if registry is None else rpc.registry_devices(registry)
            if not found:
                raise ValueError("a stage reports no device")
            devices.append(found[0])
        array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        split = (ctypes.c_float * int(llama.llama_max_devices()))()
        for index, stage in enumerate(command.stage_plan):
            split[index] = stage.split
        self._stage_arrays = (array, split)
        self._stage_devices = devices
        params.devices = ctypes.cast(array, ctypes.c_void_p)
        params.tensor_split = split
        params.split_mode = llama.LLAMA_SPLIT_MODE_LAYER

    def _start_link_probes(self) -> None:
        """A split model loaded: a few round trips to each stage right away (before
        ``load_returned``, so the host has figures when the stages are ready), then the decode
        thread probes on (engine/links.py). On the main thread: the decode thread does not exist
        yet, and ggml's dispatcher serialises calls on a connection anyway."""
        from skippyctl.engine.links import LinkProber
        from skippyctl.native.rpc import GgmlRpc

        rpc = GgmlRpc()
        measure = [
            (lambda device=device: rpc.device_memory(device)) for device in self._stage_devices
        ]
        prober = LinkProber(measure, self.options.link_probe_interval_ms / 1000.0)
        for _ in range(INITIAL_LINK_SAMPLES - 1):
            prober.probe_all()
        for message in prober.probe_all():
            self._send(message)
        self._links = prober

    def _end_load_scope(self, ok: bool) -> None:
        from skippyctl.native.abi import FailureCode, Status

        assert self.adapter is not None
        self.adapter.model_load_end(
            Status.OK if ok else Status.MODEL_ERROR,
            FailureCode.NONE if ok else FailureCode.MODEL_ERROR,
        )

    def _create_context(self, command: Load, model: Any) -> None:
        llama = self.llama
        assert self.loaded is not None
        operation_id = command.operation_id
        self._send(ContextBegun(operation_id))
        per_token = kv_bytes_per_token(
            layers=int(llama.llama_model_n_layer(model)),
            embedding=int(llama.llama_model_n_embd(model)),
            heads=int(llama.llama_model_n_head(model)),
            kv_heads=int(llama.llama_model_n_head_kv(model)),
        )
        available = _available_bytes()
        plan = plan_context(
            lanes=command.options.lanes,
            context_tokens=command.options.ctx,
            train_tokens=int(llama.llama_model_n_ctx_train(model)),
            kv_bytes_per_token=per_token,
            free_memory_bytes=available,
        )
        kv_bytes = per_token * plan.context_tokens
        on_host = not command.stage_plan and self._device == CPU_DEVICE
        if on_host and available is not None and kv_bytes > available:
            # Refused before llama.cpp is asked: it would try to allocate the whole KV cache
            # (and may be killed by the kernel for it rather than return NULL). Only for a KV
            # cache in host memory: a GPU's or a stage's is not what MemAvailable measures.
            self._send(
                AllocationRefused(
                    operation_id, self._device, kv_bytes, available, ReasonCode.OUT_OF_MEMORY
                )
            )
            self._send(ContextReturned(operation_id, ok=False, reason=ReasonCode.OUT_OF_MEMORY))
            return
        if plan.context_tokens > MAX_CONTEXT_TOKENS:
            raise ValueError("a context beyond llama.cpp's n_ctx range")
        context_params = llama.llama_context_default_params()
        context_params.n_ctx = plan.context_tokens
        context_params.n_seq_max = plan.lanes
        context_params.n_threads = context_params.n_threads_batch = _threads(command.options)
        self._send(LoadPhase(operation_id, LoadPhaseName.ALLOCATING))
        context = llama.llama_init_from_model(model, context_params)
        reply = ContextReturned(operation_id, ok=False)
        if not context:
            failed = ReasonCode.RESOURCE_ALLOCATION_FAILURE
            self._send(AllocationRefused(operation_id, self._device, kv_bytes, available, failed))
            reply = ContextReturned(operation_id, ok=False, reason=failed)
        if context:
            from skippyctl.engine.generation import BatchEngine

            self.loaded.context = context
            self._arm_abort(context, command.serving_operation)
            lanes = int(llama.llama_n_seq_max(context))
            # Raises for a context it cannot serve (e.g. more lanes than its batch): the load
            # then fails with ContextReturned ok=false (see _load).
            speculation = speculation_of(command)
            self.loaded.draft = self._load_draft(command, model, context, lanes)
            self.loaded.plugins = self._start_plugins(command, model)
            self.loaded.generation = BatchEngine(
                _with_test_decode_delay(llama, self.options.test_decode_delay_ms),
                model,
                context,
                lanes=lanes,
                emit=self._send,
                emit_many=self._send_many,
                observations=self.options.serving_events,
                token_observations=self.options.debug_token_events,
                links=self._links,
                speculation=speculation,
                plugins=self.loaded.plugins,
                draft=self.loaded.draft,
                n_threads=_threads(command.options),
            )
            self._send(self._memory_allocated(operation_id, model, context, kv_bytes))
            self._send(LoadPhase(operation_id, LoadPhaseName.CONTEXT_READY))
            reply = ContextReturned(
                operation_id,
                ok=True,
                context_tokens=int(llama.llama_n_ctx(context)),
                lanes=lanes,
                context_tokens_per_lane=self.loaded.generation.context_tokens_per_lane(),
                batch_tokens=int(llama.llama_n_batch(context)),
                threads=int(llama.llama_n_threads(context)),
            )
        self._send(reply)
        if self.loaded.generation is not None:
            if command.restore:
                # Queued ahead of every request: restored before the first one is admitted.
                self.loaded.generation.restore_sessions(
                    [(f.session, f.path) for f in command.restore],
                    command.state_max_bytes,
                    self.loaded.fingerprint or b"",
                )
            # Started after the reply, so the host sees the context before any kv message.
            self.loaded.generation.start()

    def _memory_allocated(
        self, operation_id: str, model: Any, context: Any, kv_estimate_bytes: int
    ) -> MemoryAllocated:
        """llama.cpp's per-device figures where they can be read (native/backends.py), else
        the weights' size and the KV estimate on the model's device, compute unknown."""
        ggml = self._ggml()
        try:
            breakdown = None if ggml is None else ggml.memory_breakdown(context)
        except Exception:  # noqa: BLE001 - figures are optional; the load must not fail for them
            breakdown = None
        if breakdown:
            buffers = tuple(
                BufferReport(b.device, b.weights_bytes, b.kv_bytes, b.compute_bytes)
                for b in breakdown
            )
            return MemoryAllocated(operation_id, exact=True, buffers=buffers)
        weights = int(self.llama.llama_model_size(model))
        estimate = BufferReport(self._device, weights, kv_estimate_bytes, 0)
        return MemoryAllocated(operation_id, exact=False, buffers=(estimate,))

    def _save_now(self, command: SaveSessions) -> None:
        """On request, while serving: queued on the decode thread, not waited for (this thread
        goes on answering pings); each named session gets its ``StateExported``."""
        batch = self._batch
        fingerprint = None if self.loaded is None else self.loaded.fingerprint
        files = {f.session: f.path for f in command.save}
        if batch is None or fingerprint is None:
            for session in files:
                self._send(
                    StateExported(session, False, 0, 0, 0.0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                )
            return
        batch.save_sessions(files, command.budget_bytes, fingerprint, 0.0, report_missing=True)

    def _save_sessions(self, command: Shutdown) -> None:
        """Before the engine ends: the named sessions' KV state files (engine/kv_state.py).
        Without a fingerprint of the model nothing could be matched on restore: nothing is
        written."""
        batch = self._batch
        if not command.save or batch is None or self.loaded is None:
            return
        fingerprint = self.loaded.fingerprint
        if fingerprint is None:
            return
        files = {f.session: f.path for f in command.save}
        batch.save_sessions(files, command.save_budget_bytes, fingerprint, SAVE_TIMEOUT_S)

    def _load_draft(self, command: Load, model: Any, context: Any, lanes: int) -> Any | None:
        """The ``--draft`` model with a context of the target's lanes and size; None without
        one. Raises ValueError (the load then fails) for a draft that does not load or whose
        vocabulary is not the target's: its proposals would be other tokens."""
        draft_path = command.options.draft
        if draft_path is None:
            return None
        from skippyctl.engine.draft import DRAFT_BATCH_TOKENS, DraftModel

        llama = self.llama
        params = llama.llama_model_default_params()
        params.n_gpu_layers = command.options.gpu_layers
        draft = llama.llama_model_load_from_file(os.fsencode(draft_path), params)
        if not draft:
            raise ValueError("the draft model did not load")
        vocab = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(draft)))
        if vocab != int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))):
            llama.llama_model_free(draft)
            raise ValueError("the draft model's vocabulary is not the model's")
        context_params = llama.llama_context_default_params()
        context_params.n_ctx = int(llama.llama_n_ctx(context))
        context_params.n_seq_max = lanes
        context_params.n_batch = context_params.n_ubatch = DRAFT_BATCH_TOKENS
        context_params.n_threads = context_params.n_threads_batch = _threads(command.options)
        draft_context = llama.llama_init_from_model(draft, context_params)
        if not draft_context:
            llama.llama_model_free(draft)
            raise ValueError("the draft model's context could not be created")
        return DraftModel(llama, draft, draft_context, lanes)

    def _start_plugins(self, command: Load, model: Any) -> Any | None:
        """The model's serving plugins, each in its own process (``skippyctl.plugins``); None
        without any. A plugin that cannot load is reported and left out: it never fails the
        load."""
        options = command.options
        if not options.plugins:
            return None
        from skippyctl.plugins.link import PluginLink

        llama = self.llama
        n_vocab = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model)))
        return PluginLink.start(
            options.plugins,
            n_vocab=n_vocab,
            deadline_ms=options.spec_deadline_ms,
            on_report=self._plugin_report,
        )

    def _plugin_report(self, report: Any) -> None:
        # Called from the plugins' threads too: the channel's send is thread-safe.
        self._send(PluginReported(report.plugin, report.kind, report.reason, report.failures))

    def _free(self) -> None:
        if self.loaded is None:
            return
        if self.loaded.generation is not None:
            self.loaded.generation.stop()
        if self.loaded.plugins is not None:
            self.loaded.plugins.close()  # after the decode thread: it calls into the link
        if self.loaded.draft is not None:
            self.loaded.draft.free()
        if self.loaded.context:
            self.llama.llama_free(self.loaded.context)
        self.llama.llama_model_free(self.loaded.model)
        self.loaded = None


class _SlowDecode:
    """Test fault injection (`--test-decode-delay-ms`): every llama_decode takes at least
    this long, so tests can hold requests in flight on a model that decodes in microseconds."""

    def __init__(self, llama: Any, delay_s: float) -> None:
        self._llama = llama
        self._delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llama, name)

    def llama_decode(self, *args: Any) -> Any:
        time.sleep(self._delay_s)
        return self._llama.llama_decode(*args)


def _files_opened(llama: Any, model: Any) -> int | None:
    """How many GGUF files llama.cpp opened for ``model``: its loader opens as many parts as the
    first file's ``split.count`` metadata says (not as its name says), 1 when the key is absent.
    llama.h gives metadata values only as text (``llama_model_meta_val_str``), so the value is
    read back as the integer it is; None for a value that is not a positive count."""
    value = ctypes.create_string_buffer(SPLIT_COUNT_VALUE_BYTES)
    length = int(llama.llama_model_meta_val_str(model, SPLIT_COUNT_KEY, value, len(value)))
    if length < 0:
        return 1
    if length >= len(value):  # snprintf's length: the text did not fit, and no count is that long
        return None
    try:
        count = int(value.value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return count if count > 0 else None


def _available_bytes() -> int | None:
    """Memory a context may take: the kernel's MemAvailable, capped by what an address-space
    limit (RLIMIT_AS) still leaves this process; None when neither can be read."""
    import resource

    available = available_memory_bytes()
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return available
    if soft == resource.RLIM_INFINITY:
        return available
    headroom = max(0, soft - _address_space_bytes())
    return headroom if available is None else min(available, headroom)


def _address_space_bytes() -> int:
    """This process's virtual size (/proc/self/statm, first field in pages); 0 if unreadable."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _fingerprint(path: str) -> bytes | None:
    from skippyctl.engine.kv_state import model_fingerprint

    try:
        return model_fingerprint(path)
    except OSError:
        return None


def _with_test_decode_delay(llama: Any, delay_ms: float) -> Any:
    return _SlowDecode(llama, delay_ms / 1000) if delay_ms > 0 else llama


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skippyctl-engine", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--ring-fd", type=int)
    parser.add_argument("--native-library")
    engine_options.add_arguments(parser)
    args = parser.parse_args(argv)
    options = engine_options.from_arguments(args)
    channel = engine_side(socket.socket(fileno=args.control_fd))
    worker = Worker(channel, args.ring_fd, options.capture_debug_log, options, args.native_library)
    # After llama.cpp and the native library are mapped.
    _test_address_space_limit(options.test_address_space_limit_mib)
    return worker.serve()


def _test_address_space_limit(limit_mib: int | None) -> None:
    """Test fault injection (``--test-address-space-limit-mib``, the host's
    SKIPPY_TEST_ENGINE_AS_LIMIT_MB): run this engine under an address-space limit (RLIMIT_AS) of
    that many MiB above what it maps once llama.cpp is loaded, so a context that fits the
    machine but not the limit is refused for memory."""
    if limit_mib is None:
        return
    import resource

    limit = _address_space_bytes() + limit_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


def speculation_of(command: Load) -> SpecConfig:
    """The speculation a load asks for (the host validated it; a value it could not have sent
    raises ValueError, which fails the context like any other context it cannot serve)."""
    options = command.options
    if options.spec is SpecMode.OFF:
        return SPEC_OFF
    return SpecConfig(options.spec, options.spec_draft_tokens, options.spec_runahead_tokens)


def _threads(options: LoadOptions) -> int:
    """The load's decode threads: ``threads``, else one per core."""
    return options.threads if options.threads is not None else max(1, os.cpu_count() or 1)


if __name__ == "__main__":
    sys.exit(main())
