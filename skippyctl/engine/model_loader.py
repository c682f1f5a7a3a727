"""The engine's ``Load`` command: a model, its context, its draft and plugins, and what they cost.

:class:`ModelLoader` runs a load for the worker (``engine/engine_worker.py``) and reports it on
the control channel. Resources (``engine/protocol_messages.py`` resource messages): a load
reports ggml's backends and devices first (`Backends`, with `CpuFallback` when GPU layers were
asked for and no GPU exists), each phase it passes (`LoadPhase`: weights loaded, allocating ctx,
context ready), and where the memory went (`MemoryAllocated`: llama.cpp's per-device
weights/KV/compute figures, or totals). A context whose KV cache (the geometry's estimate) goes
in host memory and exceeds the memory available — MemAvailable, capped by an RLIMIT_AS — is
refused before llama.cpp is asked (`AllocationRefused` and `ContextReturned` with
`out_of_memory`); a NULL context is `resource_allocation_failure`. A load that raised ends with
exactly one failed reply.

With the native library's model-open family a load is bracketed in a native operation scope and
llama.cpp's progress callback points straight at C; a split model's layers go to RPC stages.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.config.load_options import FlashAttention, LoadOptions, SpecMode
from skippyctl.config.tool_call_format import tool_call_format
from skippyctl.engine.geometry import available_memory_bytes, kv_bytes_per_token, plan_context
from skippyctl.engine.kernels import batch_invariant
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol_commands import Load
from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    BufferReport,
    ComputeFailed,
    ContextBegun,
    ContextReturned,
    CpuFallback,
    DeviceReport,
    EngineMessage,
    LoadBegun,
    LoadPhase,
    LoadPhaseName,
    LoadReturned,
    MemoryAllocated,
    PluginCounters,
    PluginReported,
)
from skippyctl.engine.speculation import SPEC_OFF, SpecConfig
from skippyctl.engine.text import model_chat_template
from skippyctl.events.identity import model_id_for
from skippyctl.events.reasons import ReasonCode
from skippyctl.plugins.api import ActivationContext

INITIAL_LINK_SAMPLES: Final = 3
"""Round trips to each stage right after a split model loaded (engine/links.py)."""
CPU_DEVICE: Final = "CPU"
_GPU_KINDS: Final = frozenset({"gpu", "igpu"})
MAX_CONTEXT_TOKENS: Final = 2**32 - 1
"""``llama_context_params.n_ctx`` is a uint32_t."""
SPLIT_COUNT_KEY: Final = b"split.count"
"""The GGUF key llama.cpp's loader reads for the number of parts of a split set (a uint16)."""
SPLIT_COUNT_VALUE_BYTES: Final = 16
"""Room for a uint16's decimal text and its NUL (a longer value is refused, not truncated)."""


@dataclass(slots=True)
class LoadedModel:
    model: Any
    context: Any | None = None
    generation: Any | None = None  # BatchEngine once the context exists
    plugins: Any | None = None  # PluginLink (skippyctl.plugins.link) of its serving plugins
    draft: Any | None = None  # DraftModel (engine/draft.py) of --draft
    device_watch: Any | None = None  # DeviceWatch (engine/device_watch.py) while it serves
    fingerprint: bytes | None = None
    """The model file's (engine/kv_state.py); None when it could not be read."""
    pooling: str | None = None
    """An embedding model's pooling (engine/embeddings.py); None for a generative model."""


class ModelLoader:
    """Loads for one worker (see the module docstring). ``adapter`` is the native layer's
    engine adapter (None without a ring); ``load_events``: the model-open family is there, so
    loads report through the native hooks. ``emit`` sends one message, ``emit_many`` a decode
    step's messages in one write (how many could not be framed)."""

    def __init__(
        self,
        llama: Any,
        options: EngineOptions,
        *,
        adapter: Any | None,
        load_events: bool,
        emit: Callable[[EngineMessage], None],
        emit_many: Callable[[list[EngineMessage]], int],
    ) -> None:
        self._llama = llama
        self._options = options
        self._adapter = adapter
        self._load_events = load_events
        self._emit = emit
        self._emit_many = emit_many
        self._stage_arrays: tuple[Any, ...] = ()
        self._stage_devices: list[int] = []
        self._links: Any | None = None  # LinkProber of a split model (engine/links.py)
        self._backends: Any | None = None  # GgmlBackends (native/backends.py), once looked up
        self._backends_looked_up = False
        self._device = CPU_DEVICE
        self._plugin_operation: str | None = None
        """The load whose plugins are starting: their reports carry its operation id."""
        """The device the current load places its model on (a short registry name)."""

    def _arm_abort(self, context: Any, serving_operation: int) -> None:
        """Point llama_decode's abort callback at the native layer, inside a serving scope, so the
        host can stop a decode in flight (forced unload) through shared memory, not Python."""
        if self._adapter is None or serving_operation <= 0:
            return
        self._adapter.operation_begin(serving_operation, serving_operation)
        self._abort_callback = self._llama.ggml_abort_callback(self._adapter.abort_callback_address)
        self._llama.llama_set_abort_callback(context, self._abort_callback, self._adapter.user_data)

    def load(self, command: Load) -> LoadedModel | None:
        """Load the model, then its context. Exactly one failed reply ends a load that raised:
        `LoadReturned` if the model was not returned yet, else `ContextReturned`. The model
        once it loaded (whatever happened to its context), else None."""
        operation_id = command.operation_id
        loaded: LoadedModel | None = None
        owed: type[LoadReturned] | type[ContextReturned] | None = LoadReturned
        scope_open = False
        try:
            llama = self._llama
            native_operation = command.native_operation
            gpu_layers = command.options.gpu_layers
            path = os.fsencode(command.options.model)
            if b"\0" in path:
                raise ValueError("a model path cannot contain NUL")  # C would truncate it
            params = llama.llama_model_default_params()
            params.n_gpu_layers = gpu_layers
            if command.stage_plan:
                self._split_across_stages(params, command)
            adapter = self._adapter if self._load_events else None
            if adapter is not None:
                adapter.model_load_begin(native_operation, native_operation)
                scope_open = True
                params.progress_callback = llama.llama_progress_callback(
                    adapter.progress_callback_address
                )
                params.progress_callback_user_data = adapter.user_data
            self._emit(LoadBegun(operation_id))
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
                loaded = LoadedModel(model, fingerprint=_fingerprint(command.options.model))
                if command.stage_plan:
                    self._start_link_probes()
                self._emit(LoadPhase(operation_id, LoadPhaseName.WEIGHTS_LOADED))
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
                    **chat_template_facts(llama, model, command.chat_template_text),
                )
            else:
                reply = LoadReturned(operation_id, ok=False, duration_ms=duration_ms)
            owed = ContextReturned if ok else None
            self._emit(reply)
            if loaded is None:
                return None
            self._create_context(command, loaded)
        except Exception:  # noqa: BLE001 - a load that raised fails; the engine stays up
            if scope_open:
                self._end_load_scope(False)
            if owed is not None:
                self._emit(owed(operation_id, ok=False))
        return loaded

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
        self._emit(
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
            self._emit(CpuFallback(command.operation_id, command.options.gpu_layers, CPU_DEVICE))

    def _split_across_stages(self, params: Any, command: Load) -> None:
        """Point the model's layers at the RPC stages: one ``add_server`` per stage (ggml
        connects and says HELLO; it aborts this process when the stage is gone, which the host
        attributes), its first device, NULL-terminated, layer split with the host's
        proportions. The arrays stay referenced for as long as the model lives."""
        import ctypes

        from skippyctl.native.rpc import GgmlRpc

        llama = self._llama
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
        prober = LinkProber(measure, self._options.link_probe_interval_ms / 1000.0)
        for _ in range(INITIAL_LINK_SAMPLES - 1):
            prober.probe_all()
        for message in prober.probe_all():
            self._emit(message)
        self._links = prober

    def _end_load_scope(self, ok: bool) -> None:
        from skippyctl.native.abi import FailureCode, Status

        assert self._adapter is not None
        self._adapter.model_load_end(
            Status.OK if ok else Status.MODEL_ERROR,
            FailureCode.NONE if ok else FailureCode.MODEL_ERROR,
        )

    def _create_context(self, command: Load, loaded: LoadedModel) -> None:
        llama = self._llama
        model = loaded.model
        operation_id = command.operation_id
        self._emit(ContextBegun(operation_id))
        draft_model = self._open_draft(command, model)
        # The draft's KV cache holds every lane's context too: both count in the plan.
        per_token = _kv_bytes_per_token(llama, model) + (
            0 if draft_model is None else _kv_bytes_per_token(llama, draft_model)
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
            self._emit(
                AllocationRefused(
                    operation_id, self._device, kv_bytes, available, ReasonCode.OUT_OF_MEMORY
                )
            )
            self._emit(ContextReturned(operation_id, ok=False, reason=ReasonCode.OUT_OF_MEMORY))
            if draft_model is not None:
                llama.llama_model_free(draft_model)
            return
        if plan.context_tokens > MAX_CONTEXT_TOKENS:
            raise ValueError("a context beyond llama.cpp's n_ctx range")
        context_params = llama.llama_context_default_params()
        context_params.n_ctx = plan.context_tokens
        context_params.n_seq_max = plan.lanes
        context_params.n_threads = context_params.n_threads_batch = _threads(command.options)
        flash = flash_attention(command.options, on_host)
        context_params.flash_attn_type = _flash_attn_type(llama, flash)
        self._emit(LoadPhase(operation_id, LoadPhaseName.ALLOCATING))
        context = llama.llama_init_from_model(model, context_params)
        reply = ContextReturned(operation_id, ok=False)
        if not context:
            failed = self._context_failure(kv_bytes)
            self._emit(AllocationRefused(operation_id, self._device, kv_bytes, available, failed))
            reply = ContextReturned(operation_id, ok=False, reason=failed)
        if context:
            from skippyctl.engine.embeddings import pooling_name
            from skippyctl.engine.generation import BatchEngine

            loaded.context = context
            loaded.pooling = pooling_name(llama, context)
            if loaded.pooling is not None:
                # The GGUF says it is an embedding model: its outputs are pooled vectors.
                llama.llama_set_embeddings(context, True)
            self._arm_abort(context, command.serving_operation)
            lanes = int(llama.llama_n_seq_max(context))
            # Raises for a context it cannot serve (e.g. more lanes than its batch): the load
            # then fails with ContextReturned ok=false (see _load).
            speculation = speculation_of(command)
            loaded.draft = self._load_draft(command, draft_model, context, lanes, flash)
            activation = plugin_activation(
                command,
                n_vocab=_n_vocab(llama, model),
                n_ctx=int(llama.llama_n_ctx(context)),
                lanes=lanes,
            )
            # The plugins' reports while the load runs are part of it (their event carries its
            # operation id); cleared before its terminal (ContextReturned) below.
            self._plugin_operation = operation_id
            loaded.plugins = self._start_plugins(command, activation)
            loaded.generation = BatchEngine(
                _with_test_decode_delay(llama, self._options.test_decode_delay_ms),
                model,
                context,
                lanes=lanes,
                emit=self._emit,
                emit_many=self._emit_many,
                observations=self._options.serving_events,
                token_observations=self._options.debug_token_events,
                links=self._links,
                speculation=speculation,
                plugins=loaded.plugins,
                draft=loaded.draft,
                n_threads=_threads(command.options),
                chat_template=command.chat_template_text,
                plugin_activation=activation,
            )
            self._emit(self._memory_allocated(operation_id, model, context, kv_bytes, loaded.draft))
            # Before any request can use the context: the probe leaves its memory empty.
            invariant = (
                on_host
                and loaded.pooling is None
                and batch_invariant(llama, context, _n_vocab(llama, model), flash)
            )
            self._emit(LoadPhase(operation_id, LoadPhaseName.CONTEXT_READY))
            reply = ContextReturned(
                operation_id,
                ok=True,
                context_tokens=int(llama.llama_n_ctx(context)),
                lanes=lanes,
                context_tokens_per_lane=loaded.generation.context_tokens_per_lane(),
                batch_tokens=int(llama.llama_n_batch(context)),
                threads=int(llama.llama_n_threads(context)),
                flash_attention=flash,
                batch_invariant=invariant,
                pooling=loaded.pooling,
                # The template that renders a chat with tools: an override, else the GGUF's
                # `tool_use` variant, else its default.
                tool_call_format=tool_call_format(
                    command.chat_template_text
                    or model_chat_template(llama, model, "tool_use")
                    or model_chat_template(llama, model)
                ),
            )
        self._plugin_operation = None
        self._emit(reply)
        if loaded.generation is not None:
            if command.restore:
                # Queued ahead of every request: restored before the first one is admitted.
                loaded.generation.restore_sessions(
                    [(f.session, f.path) for f in command.restore],
                    command.state_max_bytes,
                    loaded.fingerprint or b"",
                )
            # Started after the reply, so the host sees the context before any kv message.
            loaded.generation.start()
            loaded.device_watch = self._watch_devices(command)

    def _watch_devices(self, command: Load) -> Any | None:
        """The serving model's device memory, watched (engine/device_watch.py); None for a
        split load (its stages report their own) or where ggml's devices cannot be read."""
        ggml = self._ggml()
        if ggml is None or command.stage_plan:
            return None
        from skippyctl.engine.device_watch import DeviceWatch, with_host_memory

        return DeviceWatch(
            with_host_memory(ggml.devices),
            {self._device},
            self._emit,
            self._options.device_low_free_pct,
        ).start()

    def _context_failure(self, kv_bytes: int) -> ReasonCode:
        """Why ``llama_init_from_model`` gave no context: ``out_of_memory`` when ggml's own
        allocator cannot give the KV cache's size on the model's device either (asked right
        after the failure), else ``resource_allocation_failure`` (llama.cpp says no more)."""
        ggml = self._ggml()
        try:
            fits = None if ggml is None else ggml.can_allocate(self._device, kv_bytes)
        except Exception:  # noqa: BLE001 - the diagnosis is optional; the failure stands
            fits = None
        if fits is False:
            return ReasonCode.OUT_OF_MEMORY
        return ReasonCode.RESOURCE_ALLOCATION_FAILURE

    def _memory_allocated(
        self,
        operation_id: str,
        model: Any,
        context: Any,
        kv_estimate_bytes: int,
        draft: Any | None = None,
    ) -> MemoryAllocated:
        """llama.cpp's per-device figures where they can be read (native/backends.py), else
        the weights' size and the KV estimate on the model's device, compute unknown. A
        ``--draft`` model's weights, KV and compute count on their devices too."""
        ggml = self._ggml()
        contexts = [context] if draft is None else [context, draft.context]
        try:
            breakdowns = [None if ggml is None else ggml.memory_breakdown(c) for c in contexts]
        except Exception:  # noqa: BLE001 - figures are optional; the load must not fail for them
            breakdowns = [None]
        if all(breakdowns):
            totals: dict[str, list[int]] = {}
            for breakdown in breakdowns:
                for b in breakdown or ():
                    sums = totals.setdefault(b.device, [0, 0, 0])
                    sums[0] += b.weights_bytes
                    sums[1] += b.kv_bytes
                    sums[2] += b.compute_bytes
            buffers = tuple(BufferReport(device, *sums) for device, sums in totals.items())
            return MemoryAllocated(operation_id, exact=True, buffers=buffers)
        weights = int(self._llama.llama_model_size(model))
        if draft is not None:
            weights += int(self._llama.llama_model_size(draft.model))
        estimate = BufferReport(self._device, weights, kv_estimate_bytes, 0)
        return MemoryAllocated(operation_id, exact=False, buffers=(estimate,))

    def _open_draft(self, command: Load, model: Any) -> Any | None:
        """The ``--draft`` model's weights (phase ``draft loaded``); None without one. Raises
        ValueError (the load then fails) for a draft that does not load or whose vocabulary is
        not the target's: its proposals would be other tokens."""
        draft_path = command.options.draft
        if draft_path is None:
            return None
        llama = self._llama
        params = llama.llama_model_default_params()
        params.n_gpu_layers = command.options.gpu_layers
        draft = llama.llama_model_load_from_file(os.fsencode(draft_path), params)
        if not draft:
            raise ValueError("the draft model did not load")
        vocab = int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(draft)))
        if vocab != int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))):
            llama.llama_model_free(draft)
            raise ValueError("the draft model's vocabulary is not the model's")
        self._emit(LoadPhase(command.operation_id, LoadPhaseName.DRAFT_LOADED))
        return draft

    def _load_draft(
        self, command: Load, draft: Any, context: Any, lanes: int, flash: bool | None
    ) -> Any | None:
        """The draft model's context, of the target's lanes, size and flash attention (None
        without a draft).
        Raises ValueError (the load then fails) when it cannot be created."""
        if draft is None:
            return None
        from skippyctl.engine.draft import DRAFT_BATCH_TOKENS, DraftModel

        llama = self._llama
        context_params = llama.llama_context_default_params()
        context_params.n_ctx = int(llama.llama_n_ctx(context))
        context_params.n_seq_max = lanes
        context_params.n_batch = context_params.n_ubatch = DRAFT_BATCH_TOKENS
        context_params.n_threads = context_params.n_threads_batch = _threads(command.options)
        context_params.flash_attn_type = _flash_attn_type(llama, flash)
        draft_context = llama.llama_init_from_model(draft, context_params)
        if not draft_context:
            llama.llama_model_free(draft)
            raise ValueError("the draft model's context could not be created")
        from skippyctl.engine.decode_core import DECODE_RETURN_REASONS

        def failed(return_code: int, requests: int) -> None:
            # The draft's own decode: the model serves on (no proposals this step).
            reason = DECODE_RETURN_REASONS.get(return_code, ReasonCode.UNKNOWN_FAILURE)
            self._emit(ComputeFailed(return_code, reason, requests))

        return DraftModel(llama, draft, draft_context, lanes, on_failure=failed)

    def _start_plugins(self, command: Load, activation: ActivationContext) -> Any | None:
        """The model's serving plugins, each in its own process (``skippyctl.plugins``),
        activated with ``activation``; None without any. A plugin that cannot load is reported
        and left out: it never fails the load."""
        options = command.options
        if not options.plugins:
            return None
        from skippyctl.plugins.link import PluginLink

        return PluginLink.start(
            options.plugins,
            n_vocab=activation.n_vocab,
            deadline_ms=options.spec_deadline_ms,
            on_report=self._plugin_report,
            activation=activation,
            on_counters=self._plugin_counters,
        )

    def _plugin_report(self, report: Any) -> None:
        # Called from the plugins' threads too: the channel's send is thread-safe.
        self._emit(
            PluginReported(
                report.plugin,
                report.kind,
                report.reason,
                report.failures,
                operation_id=self._plugin_operation,
            )
        )

    def _plugin_counters(self, plugin: str, counts: Mapping[str, int]) -> None:
        # From the link's counters thread: the channel's send is thread-safe.
        self._emit(PluginCounters(plugin, *(int(counts.get(name, 0)) for name in _COUNTERS)))


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
    headroom = max(0, soft - address_space_bytes())
    return headroom if available is None else min(available, headroom)


def address_space_bytes() -> int:
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


_COUNTERS: Final = tuple(f.name for f in dataclasses.fields(PluginCounters))[1:]
"""PluginCounters' counts in field order: the link's counters of the same names."""


def _n_vocab(llama: Any, model: Any) -> int:
    return int(llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model)))


def plugin_activation(command: Load, *, n_vocab: int, n_ctx: int, lanes: int) -> ActivationContext:
    """What the model's plugins are activated with: its id (the alias, else the file's basename:
    never a path), its geometry, the spec mode, the proposal deadline and ``--plugin-config``."""
    options = command.options
    return ActivationContext(
        model_id=str(model_id_for(options.model, options.alias)),
        n_vocab=n_vocab,
        n_ctx_per_lane=n_ctx // max(1, lanes),
        lanes=lanes,
        spec_mode=str(options.spec.value),
        proposal_deadline_ms=options.spec_deadline_ms,
        config=options.plugin_config or "",
    )


def speculation_of(command: Load) -> SpecConfig:
    """The speculation a load asks for (the host validated it; a value it could not have sent
    raises ValueError, which fails the context like any other context it cannot serve)."""
    options = command.options
    if options.spec is SpecMode.OFF:
        return SPEC_OFF
    return SpecConfig(options.spec, options.spec_draft_tokens, options.spec_runahead_tokens)


def flash_attention(options: LoadOptions, on_host: bool) -> bool | None:
    """Whether the load's contexts use flash attention (``load --flash-attn``): 'auto' is off
    where the KV cache is in host memory and llama.cpp's choice elsewhere (None: not known
    here). On the CPU, without it, the engine computes on the batch-invariant kernels
    (engine/kernels.py): a greedy text does not depend on the batch, and a decode step and a
    verify window cost 0.56-0.65 of their time with flash attention; only long prompts
    prefill slower (1.18x at 2,000 tokens; docs/BENCHMARKS.md section 5)."""
    if options.flash_attn is FlashAttention.ON:
        return True
    if options.flash_attn is FlashAttention.OFF or on_host:
        return False
    return None


def _flash_attn_type(llama: Any, flash: bool | None) -> int:
    if flash is None:
        return int(llama.LLAMA_FLASH_ATTN_TYPE_AUTO)
    if flash:
        return int(llama.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    return int(llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)


def _threads(options: LoadOptions) -> int:
    """The load's decode threads: ``threads``, else one per core."""
    return options.threads if options.threads is not None else max(1, os.cpu_count() or 1)


def chat_template_facts(llama: Any, model: Any, override: str | None) -> dict[str, Any]:
    """Which chat template will serve (``LoadReturned.chat_template_*``): the rule of
    ``engine/request_intake.py``, stated as its source and a digest, never its text."""
    import hashlib

    from skippyctl.engine.chat_template import CHATML_TEMPLATE
    from skippyctl.engine.text import model_chat_template

    default = model_chat_template(llama, model)
    tool_use = model_chat_template(llama, model, "tool_use")
    if override is not None:
        source, text, has_tool_use = "override", override, False
    elif (default and default != "chatml") or tool_use:
        source = "model"
        text = default if default and default != "chatml" else (tool_use or "")
        has_tool_use = tool_use is not None
    else:
        source, text, has_tool_use = "builtin", CHATML_TEMPLATE, False
    return {
        "chat_template_source": source,
        "chat_template_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()[:16],
        "chat_template_tool_use": has_tool_use or None,
    }


def _kv_bytes_per_token(llama: Any, model: Any) -> int:
    """A model's KV cache bytes per token of context (every layer's f16 keys and values)."""
    return kv_bytes_per_token(
        layers=int(llama.llama_model_n_layer(model)),
        embedding=int(llama.llama_model_n_embd(model)),
        heads=int(llama.llama_model_n_head(model)),
        kv_heads=int(llama.llama_model_n_head_kv(model)),
    )
