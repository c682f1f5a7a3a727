"""The event catalog: every public event id with its category, delivery class, default severity
and a one-line description.

This module is the single source of truth for event names. Ids are a public contract (JSON, SSE,
`skippyctl events catalog`, `--event` filters): add new ids, never rename or remove one. The golden
test tests/events/test_catalog.py pins the whole table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from skippyctl.events.reasons import Category, DeliveryClass, Severity


class EventId(StrEnum):
    """Every event id, grouped by family in catalog order."""

    # native_runtime
    RUNTIME_RESOLUTION_STARTED = "runtime_resolution_started"
    RUNTIME_RESOLUTION_COMPLETED = "runtime_resolution_completed"
    RUNTIME_RESOLUTION_FAILED = "runtime_resolution_failed"
    NATIVE_LIBRARY_LOADED = "native_library_loaded"
    NATIVE_LIBRARY_REJECTED = "native_library_rejected"
    NATIVE_LIBRARY_UNAVAILABLE = "native_library_unavailable"
    ABI_FEATURE_COMPATIBILITY_ESTABLISHED = "abi_feature_compatibility_established"
    ABI_FEATURE_COMPATIBILITY_FAILED = "abi_feature_compatibility_failed"
    RUNTIME_INITIALIZED = "runtime_initialized"
    RUNTIME_STOPPING = "runtime_stopping"
    RUNTIME_STOPPED = "runtime_stopped"
    RUNTIME_CRASHED = "runtime_crashed"
    ENGINE_PROCESS_STARTED = "engine_process_started"
    ENGINE_PROCESS_EXITED = "engine_process_exited"
    ENGINE_PROCESS_CRASHED = "engine_process_crashed"

    # model_preparation
    MODEL_QUEUED = "model_queued"
    MODEL_RESOLUTION_STARTED = "model_resolution_started"
    MODEL_RESOLUTION_COMPLETED = "model_resolution_completed"
    MODEL_RESOLUTION_FAILED = "model_resolution_failed"
    MODEL_DOWNLOAD_STARTED = "model_download_started"
    MODEL_DOWNLOAD_PROGRESS = "model_download_progress"
    MODEL_DOWNLOAD_COMPLETED = "model_download_completed"
    MODEL_DOWNLOAD_FAILED = "model_download_failed"
    MODEL_DOWNLOAD_CANCELLED = "model_download_cancelled"
    MODEL_PREPARATION_STARTED = "model_preparation_started"
    MODEL_PREPARATION_CACHE_REUSED = "model_preparation_cache_reused"
    MODEL_PREPARATION_COMPLETED = "model_preparation_completed"
    MODEL_PREPARATION_FAILED = "model_preparation_failed"
    MODEL_PREPARATION_CANCELLED = "model_preparation_cancelled"

    # model_loading
    MODEL_LOAD_REQUESTED = "model_load_requested"
    MODEL_LOAD_STARTED = "model_load_started"
    MODEL_LOAD_PHASE_CHANGED = "model_load_phase_changed"
    MODEL_LOAD_PROGRESS = "model_load_progress"
    BACKEND_DEVICE_SELECTED = "backend_device_selected"
    MODEL_MEMORY_ALLOCATION_SUMMARY = "model_memory_allocation_summary"
    MODEL_MEMORY_PRESSURE = "model_memory_pressure"
    NATIVE_MODEL_LOAD_COMPLETED = "native_model_load_completed"
    MODEL_LOAD_FAILED = "model_load_failed"
    MODEL_LOAD_CANCELLED = "model_load_cancelled"

    # model_availability
    NATIVE_MODEL_LOADED = "native_model_loaded"
    SERVING_BACKEND_INITIALIZATION_STARTED = "serving_backend_initialization_started"
    SERVING_BACKEND_INITIALIZATION_COMPLETED = "serving_backend_initialization_completed"
    SERVING_BACKEND_INITIALIZATION_FAILED = "serving_backend_initialization_failed"
    MODEL_AVAILABLE = "model_available"
    MODEL_DEGRADED = "model_degraded"
    MODEL_UNAVAILABLE = "model_unavailable"
    MODEL_RECOVERY_STARTED = "model_recovery_started"
    MODEL_RECOVERY_COMPLETED = "model_recovery_completed"
    MODEL_RECOVERY_FAILED = "model_recovery_failed"
    MODEL_CAPACITY_CHANGED = "model_capacity_changed"
    MODEL_IDLE_TIMER_STARTED = "model_idle_timer_started"
    MODEL_IDLE_TIMER_CLEARED = "model_idle_timer_cleared"

    # model_unloading
    UNLOAD_REQUESTED = "unload_requested"
    UNLOAD_STARTED = "unload_started"
    SESSION_DRAINING_STARTED = "session_draining_started"
    SESSION_DRAINING_COMPLETED = "session_draining_completed"
    FORCED_UNLOAD = "forced_unload"
    UNLOAD_COMPLETED = "unload_completed"
    UNLOAD_FAILED = "unload_failed"

    # stage_topology
    STAGE_STARTING = "stage_starting"
    STAGE_LOADING = "stage_loading"
    STAGE_READY = "stage_ready"
    STAGE_DEGRADED = "stage_degraded"
    STAGE_UNAVAILABLE = "stage_unavailable"
    STAGE_STOPPING = "stage_stopping"
    STAGE_STOPPED = "stage_stopped"
    STAGE_FAILED = "stage_failed"
    TOPOLOGY_ASSEMBLING = "topology_assembling"
    TOPOLOGY_READY = "topology_ready"
    TOPOLOGY_DEGRADED = "topology_degraded"
    TOPOLOGY_UNAVAILABLE = "topology_unavailable"
    UPSTREAM_CONNECTION_ESTABLISHED = "upstream_connection_established"
    UPSTREAM_CONNECTION_LOST = "upstream_connection_lost"
    UPSTREAM_CONNECTION_RECOVERED = "upstream_connection_recovered"
    DOWNSTREAM_CONNECTION_ESTABLISHED = "downstream_connection_established"
    DOWNSTREAM_CONNECTION_LOST = "downstream_connection_lost"
    DOWNSTREAM_CONNECTION_RECOVERED = "downstream_connection_recovered"
    STAGE_LINK_OBSERVED = "stage_link_observed"

    # session
    SESSION_REQUESTED = "session_requested"
    SESSION_CREATED = "session_created"
    SESSION_ACTIVE = "session_active"
    SESSION_IDLE = "session_idle"
    SESSION_RESET = "session_reset"
    SESSION_TRIMMED = "session_trimmed"
    SESSION_RESTORED = "session_restored"
    SESSION_DRAINING = "session_draining"
    SESSION_CLOSED = "session_closed"
    SESSION_FAILED = "session_failed"
    SESSION_ABANDONED = "session_abandoned"

    # request
    REQUEST_RECEIVED = "request_received"
    REQUEST_QUEUED = "request_queued"
    REQUEST_ADMITTED = "request_admitted"
    REQUEST_REJECTED = "request_rejected"
    REQUEST_EXECUTION_STARTED = "request_execution_started"
    REQUEST_COMPLETED = "request_completed"
    REQUEST_CANCELLED = "request_cancelled"
    REQUEST_TIMED_OUT = "request_timed_out"
    REQUEST_FAILED = "request_failed"

    # prefill
    PROMPT_PROCESSING_STARTED = "prompt_processing_started"
    TOKENIZATION_COMPLETED = "tokenization_completed"
    TOKENIZATION_FAILED = "tokenization_failed"
    PREFILL_STARTED = "prefill_started"
    PREFILL_PROGRESS = "prefill_progress"
    PREFILL_COMPLETED = "prefill_completed"
    PREFILL_CANCELLED = "prefill_cancelled"
    PREFILL_FAILED = "prefill_failed"
    MEDIA_PREFILL_STARTED = "media_prefill_started"
    MEDIA_PREFILL_COMPLETED = "media_prefill_completed"
    MEDIA_PREFILL_FAILED = "media_prefill_failed"
    PROMPT_CACHE_RESTORE_HIT = "prompt_cache_restore_hit"
    PROMPT_CACHE_RESTORE_MISS = "prompt_cache_restore_miss"
    PROMPT_CACHE_RESTORE_PARTIAL = "prompt_cache_restore_partial"
    PROMPT_CACHE_RESTORE_ERROR = "prompt_cache_restore_error"

    # generation
    GENERATION_STARTED = "generation_started"
    FIRST_TOKEN_PRODUCED = "first_token_produced"
    GENERATION_PROGRESS = "generation_progress"
    STOP_CONDITION_REACHED = "stop_condition_reached"
    GENERATION_COMPLETED = "generation_completed"
    GENERATION_CANCELLED = "generation_cancelled"
    GENERATION_TIMED_OUT = "generation_timed_out"
    GENERATION_FAILED = "generation_failed"
    GENERATION_TOKEN_OBSERVED = "generation_token_observed"

    # kv_runtime_state
    KV_CACHE_INITIALIZATION_STARTED = "kv_cache_initialization_started"
    KV_CACHE_INITIALIZATION_COMPLETED = "kv_cache_initialization_completed"
    KV_CACHE_INITIALIZATION_FAILED = "kv_cache_initialization_failed"
    CACHE_LOOKUP_HIT = "cache_lookup_hit"
    CACHE_LOOKUP_MISS = "cache_lookup_miss"
    CACHE_STATE_RECORDED = "cache_state_recorded"
    CACHE_TRIMMED = "cache_trimmed"
    CACHE_RESET = "cache_reset"
    CACHE_PRESSURE_CROSSED = "cache_pressure_crossed"
    CACHE_PRESSURE_CLEARED = "cache_pressure_cleared"
    CONTEXT_CAPACITY_APPROACHING_LIMIT = "context_capacity_approaching_limit"
    CONTEXT_EXHAUSTED = "context_exhausted"
    CACHE_STATE_EXPORT_COMPLETED = "cache_state_export_completed"
    CACHE_STATE_EXPORT_FAILED = "cache_state_export_failed"
    CACHE_STATE_IMPORT_COMPLETED = "cache_state_import_completed"
    CACHE_STATE_IMPORT_FAILED = "cache_state_import_failed"

    # resource_health
    BACKEND_INITIALIZATION_STARTED = "backend_initialization_started"
    BACKEND_INITIALIZATION_COMPLETED = "backend_initialization_completed"
    BACKEND_INITIALIZATION_FAILED = "backend_initialization_failed"
    DEVICE_SELECTED = "device_selected"
    DEVICE_READY = "device_ready"
    DEVICE_DEGRADED = "device_degraded"
    DEVICE_UNAVAILABLE = "device_unavailable"
    DEVICE_RECOVERED = "device_recovered"
    DEVICE_LOST = "device_lost"
    DEVICE_RESET = "device_reset"
    RESOURCE_ALLOCATION_COMPLETED = "resource_allocation_completed"
    RESOURCE_ALLOCATION_FAILED = "resource_allocation_failed"
    MEMORY_PRESSURE_CROSSED = "memory_pressure_crossed"
    MEMORY_PRESSURE_CLEARED = "memory_pressure_cleared"
    MEMORY_OBSERVED = "memory_observed"
    OUT_OF_MEMORY_CONDITION = "out_of_memory_condition"
    BACKEND_FALLBACK_ACTIVATED = "backend_fallback_activated"
    CPU_FALLBACK_ACTIVATED = "cpu_fallback_activated"
    COMPUTE_FAILURE = "compute_failure"

    # diagnostic
    WARNING_RAISED = "warning_raised"
    WARNING_CLEARED = "warning_cleared"
    RECOVERABLE_NATIVE_FAILURE = "recoverable_native_failure"
    FALLBACK_APPLIED = "fallback_applied"
    DEGRADED_OPERATION_ENTERED = "degraded_operation_entered"
    DEGRADED_OPERATION_EXITED = "degraded_operation_exited"
    FATAL_NATIVE_FAILURE = "fatal_native_failure"
    INVARIANT_PROTOCOL_VIOLATION = "invariant_protocol_violation"
    NATIVE_LOG_SUMMARY = "native_log_summary"

    # node_availability
    NODE_STARTING = "node_starting"
    NODE_ACCEPTING_REQUESTS = "node_accepting_requests"
    NODE_DEGRADED = "node_degraded"
    NODE_UNAVAILABLE = "node_unavailable"
    NODE_DRAINING = "node_draining"
    NODE_STOPPED = "node_stopped"
    AVAILABLE_MODEL_SET_CHANGED = "available_model_set_changed"
    NODE_CAPACITY_CHANGED = "node_capacity_changed"
    NODE_RESOURCE_PRESSURE_CHANGED = "node_resource_pressure_changed"

    # event_system_health
    INGRESS_QUEUE_PRESSURE = "ingress_queue_pressure"
    EVENTS_COALESCED = "events_coalesced"
    EVENTS_SAMPLED = "events_sampled"
    EVENTS_DROPPED_BY_CLASS = "events_dropped_by_class"
    SUBSCRIBER_LAGGING = "subscriber_lagging"
    SUBSCRIBER_DISCONNECTED = "subscriber_disconnected"
    REDUCER_ERROR = "reducer_error"
    TELEMETRY_EXPORTER_DEGRADED = "telemetry_exporter_degraded"
    TELEMETRY_EXPORTER_RECOVERED = "telemetry_exporter_recovered"
    EVENT_SCHEMA_INCOMPATIBILITY = "event_schema_incompatibility"
    UNKNOWN_NATIVE_EVENT_RECEIVED = "unknown_native_event_received"
    NATIVE_SEQUENCE_GAP_DETECTED = "native_sequence_gap_detected"
    RUNTIME_REPLAY_GAP = "runtime_replay_gap"

    # speculation (serving plugins and speculative decoding)
    SERVING_PLUGIN_LOADED = "serving_plugin_loaded"
    SERVING_PLUGIN_LOAD_FAILED = "serving_plugin_load_failed"
    SERVING_PLUGIN_FAILED = "serving_plugin_failed"
    SERVING_PLUGIN_RESTARTED = "serving_plugin_restarted"
    SERVING_PLUGIN_DISABLED = "serving_plugin_disabled"
    SPECULATION_SUMMARIZED = "speculation_summarized"
    SPECULATION_SWITCHED = "speculation_switched"
    SERVING_PLUGIN_OBSERVED = "serving_plugin_observed"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What the catalog says about one event id."""

    id: EventId
    category: Category
    delivery: DeliveryClass
    severity: Severity
    description: str


TERMINAL: Final = DeliveryClass.TERMINAL
STATE: Final = DeliveryClass.STATE_TRANSITION
PROGRESS: Final = DeliveryClass.PROGRESS
DIAG: Final = DeliveryClass.DIAGNOSTIC
DEBUG: Final = DeliveryClass.DEBUG

_Row = tuple[EventId, DeliveryClass, Severity, str]


def _family(category: Category, rows: tuple[_Row, ...]) -> tuple[EventSpec, ...]:
    return tuple(EventSpec(i, category, d, s, text) for i, d, s, text in rows)


_E = EventId
_S = Severity
_SPECS: Final[tuple[EventSpec, ...]] = (
    *_family(
        Category.NATIVE_RUNTIME,
        (
            (
                _E.RUNTIME_RESOLUTION_STARTED,
                STATE,
                _S.INFO,
                "The host started locating the llama.cpp runtime and the native event library.",
            ),
            (
                _E.RUNTIME_RESOLUTION_COMPLETED,
                TERMINAL,
                _S.INFO,
                "The llama.cpp runtime and native library were located.",
            ),
            (
                _E.RUNTIME_RESOLUTION_FAILED,
                TERMINAL,
                _S.ERROR,
                "The llama.cpp runtime could not be located.",
            ),
            (
                _E.NATIVE_LIBRARY_LOADED,
                STATE,
                _S.INFO,
                "The native event library was loaded and its ABI checked.",
            ),
            (
                _E.NATIVE_LIBRARY_REJECTED,
                TERMINAL,
                _S.ERROR,
                "The native event library was found but refused (wrong ABI or layout).",
            ),
            (
                _E.NATIVE_LIBRARY_UNAVAILABLE,
                STATE,
                _S.WARNING,
                "No native event library: running in legacy mode, state from return values only.",
            ),
            (
                _E.ABI_FEATURE_COMPATIBILITY_ESTABLISHED,
                STATE,
                _S.INFO,
                "Native ABI and feature bits are compatible; the listed families are expected.",
            ),
            (
                _E.ABI_FEATURE_COMPATIBILITY_FAILED,
                STATE,
                _S.WARNING,
                "Native ABI or feature set incompatible: that family (or all events) disabled.",
            ),
            (_E.RUNTIME_INITIALIZED, STATE, _S.INFO, "The runtime host finished starting."),
            (_E.RUNTIME_STOPPING, STATE, _S.INFO, "The runtime host began an orderly shutdown."),
            (_E.RUNTIME_STOPPED, TERMINAL, _S.INFO, "The runtime host stopped."),
            (
                _E.RUNTIME_CRASHED,
                TERMINAL,
                _S.FATAL,
                "The runtime host or an engine process ended abnormally.",
            ),
            (
                _E.ENGINE_PROCESS_STARTED,
                STATE,
                _S.INFO,
                "An engine worker process started for a model.",
            ),
            (
                _E.ENGINE_PROCESS_EXITED,
                TERMINAL,
                _S.INFO,
                "An engine worker process exited normally.",
            ),
            (
                _E.ENGINE_PROCESS_CRASHED,
                TERMINAL,
                _S.ERROR,
                "An engine worker process died (signal or abort); its operations were reconciled.",
            ),
        ),
    ),
    *_family(
        Category.MODEL_PREPARATION,
        (
            (_E.MODEL_QUEUED, STATE, _S.INFO, "A model was queued for preparation."),
            (
                _E.MODEL_RESOLUTION_STARTED,
                STATE,
                _S.DEBUG,
                "Resolving a model reference to a local artifact.",
            ),
            (
                _E.MODEL_RESOLUTION_COMPLETED,
                TERMINAL,
                _S.INFO,
                "A model reference resolved to a local artifact.",
            ),
            (
                _E.MODEL_RESOLUTION_FAILED,
                TERMINAL,
                _S.ERROR,
                "A model reference could not be resolved.",
            ),
            (_E.MODEL_DOWNLOAD_STARTED, STATE, _S.INFO, "A model download started."),
            (_E.MODEL_DOWNLOAD_PROGRESS, PROGRESS, _S.INFO, "Model download progress."),
            (_E.MODEL_DOWNLOAD_COMPLETED, TERMINAL, _S.INFO, "A model download completed."),
            (_E.MODEL_DOWNLOAD_FAILED, TERMINAL, _S.ERROR, "A model download failed."),
            (_E.MODEL_DOWNLOAD_CANCELLED, TERMINAL, _S.WARNING, "A model download was cancelled."),
            (
                _E.MODEL_PREPARATION_STARTED,
                STATE,
                _S.INFO,
                "Materialisation of a model package started.",
            ),
            (
                _E.MODEL_PREPARATION_CACHE_REUSED,
                TERMINAL,
                _S.INFO,
                "A prepared model was reused from the local cache.",
            ),
            (
                _E.MODEL_PREPARATION_COMPLETED,
                TERMINAL,
                _S.INFO,
                "A model package was materialised.",
            ),
            (_E.MODEL_PREPARATION_FAILED, TERMINAL, _S.ERROR, "Preparing a model package failed."),
            (
                _E.MODEL_PREPARATION_CANCELLED,
                TERMINAL,
                _S.WARNING,
                "Preparing a model package was cancelled.",
            ),
        ),
    ),
    *_family(
        Category.MODEL_LOADING,
        (
            (
                _E.MODEL_LOAD_REQUESTED,
                STATE,
                _S.INFO,
                "A load was requested (validated configuration, not started yet).",
            ),
            (_E.MODEL_LOAD_STARTED, STATE, _S.INFO, "The engine started opening the model."),
            (
                _E.MODEL_LOAD_PHASE_CHANGED,
                STATE,
                _S.INFO,
                "The load entered a coarse phase (metadata, tensors, tokenizer, auxiliaries).",
            ),
            (
                _E.MODEL_LOAD_PROGRESS,
                PROGRESS,
                _S.INFO,
                "Coarse load progress, 0..1000 steps, strictly increasing.",
            ),
            (
                _E.BACKEND_DEVICE_SELECTED,
                STATE,
                _S.INFO,
                "The device the model is placed on, with its memory.",
            ),
            (
                _E.MODEL_MEMORY_ALLOCATION_SUMMARY,
                STATE,
                _S.INFO,
                "Memory allocated for weights, context and compute buffers.",
            ),
            (_E.MODEL_MEMORY_PRESSURE, DIAG, _S.WARNING, "Memory pressure observed while loading."),
            (
                _E.NATIVE_MODEL_LOAD_COMPLETED,
                TERMINAL,
                _S.INFO,
                "llama.cpp returned a model (authoritative success).",
            ),
            (_E.MODEL_LOAD_FAILED, TERMINAL, _S.ERROR, "The load failed; reason_code says why."),
            (
                _E.MODEL_LOAD_CANCELLED,
                TERMINAL,
                _S.WARNING,
                "The load was cancelled before the model became available.",
            ),
        ),
    ),
    *_family(
        Category.MODEL_AVAILABILITY,
        (
            (
                _E.NATIVE_MODEL_LOADED,
                STATE,
                _S.INFO,
                "Reducer: weights are loaded; serving not ready yet.",
            ),
            (
                _E.SERVING_BACKEND_INITIALIZATION_STARTED,
                STATE,
                _S.INFO,
                "Creating the serving context (KV cache, lanes) for a loaded model.",
            ),
            (
                _E.SERVING_BACKEND_INITIALIZATION_COMPLETED,
                TERMINAL,
                _S.INFO,
                "The serving context is ready.",
            ),
            (
                _E.SERVING_BACKEND_INITIALIZATION_FAILED,
                TERMINAL,
                _S.ERROR,
                "Creating the serving context failed.",
            ),
            (
                _E.MODEL_AVAILABLE,
                STATE,
                _S.INFO,
                "Reducer: the model serves requests (every dependency ready).",
            ),
            (
                _E.MODEL_DEGRADED,
                STATE,
                _S.WARNING,
                "Reducer: the model serves with reduced capacity or health.",
            ),
            (_E.MODEL_UNAVAILABLE, STATE, _S.ERROR, "Reducer: the model cannot serve requests."),
            (
                _E.MODEL_RECOVERY_STARTED,
                STATE,
                _S.INFO,
                "Recovery of a degraded or unavailable model started.",
            ),
            (_E.MODEL_RECOVERY_COMPLETED, TERMINAL, _S.INFO, "A model recovered."),
            (_E.MODEL_RECOVERY_FAILED, TERMINAL, _S.ERROR, "Recovery of a model failed."),
            (
                _E.MODEL_CAPACITY_CHANGED,
                STATE,
                _S.INFO,
                "A model's lanes, context or queue capacity changed.",
            ),
            (
                _E.MODEL_IDLE_TIMER_STARTED,
                STATE,
                _S.INFO,
                "A model with an idle TTL is idle: it unloads after idle_ttl_ms unless a "
                "request comes.",
            ),
            (
                _E.MODEL_IDLE_TIMER_CLEARED,
                STATE,
                _S.DEBUG,
                "A request came for an idle model: its idle timer stopped.",
            ),
        ),
    ),
    *_family(
        Category.MODEL_UNLOADING,
        (
            (_E.UNLOAD_REQUESTED, STATE, _S.INFO, "An unload was requested."),
            (_E.UNLOAD_STARTED, STATE, _S.INFO, "The unload started."),
            (
                _E.SESSION_DRAINING_STARTED,
                STATE,
                _S.INFO,
                "Sessions of the model are draining before unload.",
            ),
            (
                _E.SESSION_DRAINING_COMPLETED,
                STATE,
                _S.INFO,
                "Session draining finished (or its deadline passed).",
            ),
            (
                _E.FORCED_UNLOAD,
                STATE,
                _S.WARNING,
                "The unload was forced; running requests were cancelled.",
            ),
            (
                _E.UNLOAD_COMPLETED,
                TERMINAL,
                _S.INFO,
                "The model was unloaded and its engine released.",
            ),
            (_E.UNLOAD_FAILED, TERMINAL, _S.ERROR, "The unload failed."),
        ),
    ),
    *_family(
        Category.STAGE_TOPOLOGY,
        (
            (_E.STAGE_STARTING, STATE, _S.INFO, "A stage process is starting."),
            (_E.STAGE_LOADING, STATE, _S.INFO, "A stage is loading its share of the model."),
            (_E.STAGE_READY, STATE, _S.INFO, "A stage is ready."),
            (_E.STAGE_DEGRADED, STATE, _S.WARNING, "A stage is degraded."),
            (_E.STAGE_UNAVAILABLE, STATE, _S.ERROR, "A stage is unavailable."),
            (_E.STAGE_STOPPING, STATE, _S.INFO, "A stage is stopping."),
            (_E.STAGE_STOPPED, TERMINAL, _S.INFO, "A stage stopped."),
            (_E.STAGE_FAILED, TERMINAL, _S.ERROR, "A stage failed."),
            (_E.TOPOLOGY_ASSEMBLING, STATE, _S.INFO, "A topology of stages is being assembled."),
            (
                _E.TOPOLOGY_READY,
                STATE,
                _S.INFO,
                "Every stage of a topology is ready and connected.",
            ),
            (
                _E.TOPOLOGY_DEGRADED,
                STATE,
                _S.WARNING,
                "A topology serves with a degraded stage or link.",
            ),
            (_E.TOPOLOGY_UNAVAILABLE, STATE, _S.ERROR, "A topology cannot serve."),
            (
                _E.UPSTREAM_CONNECTION_ESTABLISHED,
                STATE,
                _S.INFO,
                "A stage connected to its upstream stage.",
            ),
            (
                _E.UPSTREAM_CONNECTION_LOST,
                STATE,
                _S.WARNING,
                "A stage lost its upstream connection.",
            ),
            (
                _E.UPSTREAM_CONNECTION_RECOVERED,
                STATE,
                _S.INFO,
                "A stage's upstream connection recovered.",
            ),
            (
                _E.DOWNSTREAM_CONNECTION_ESTABLISHED,
                STATE,
                _S.INFO,
                "A stage connected to its downstream stage.",
            ),
            (
                _E.DOWNSTREAM_CONNECTION_LOST,
                STATE,
                _S.WARNING,
                "A stage lost its downstream connection.",
            ),
            (
                _E.DOWNSTREAM_CONNECTION_RECOVERED,
                STATE,
                _S.INFO,
                "A stage's downstream connection recovered.",
            ),
            (
                _E.STAGE_LINK_OBSERVED,
                PROGRESS,
                _S.INFO,
                "A link's latest round-trip figures (the engine's periodic probes).",
            ),
        ),
    ),
    *_family(
        Category.SESSION,
        (
            (_E.SESSION_REQUESTED, STATE, _S.DEBUG, "A client asked for a session."),
            (_E.SESSION_CREATED, STATE, _S.INFO, "A session was created and bound to a lane."),
            (_E.SESSION_ACTIVE, STATE, _S.DEBUG, "A session is serving a request."),
            (_E.SESSION_IDLE, STATE, _S.DEBUG, "A session is idle with its KV prefix warm."),
            (_E.SESSION_RESET, STATE, _S.INFO, "A session's KV state was reset."),
            (
                _E.SESSION_TRIMMED,
                STATE,
                _S.INFO,
                "A session's KV prefix was trimmed under pressure.",
            ),
            (_E.SESSION_RESTORED, STATE, _S.INFO, "A session's KV state was restored."),
            (_E.SESSION_DRAINING, STATE, _S.INFO, "A session is draining before unload."),
            (_E.SESSION_CLOSED, TERMINAL, _S.INFO, "A session was closed."),
            (_E.SESSION_FAILED, TERMINAL, _S.ERROR, "A session failed."),
            (
                _E.SESSION_ABANDONED,
                TERMINAL,
                _S.INFO,
                "A session was abandoned after its idle TTL or evicted.",
            ),
        ),
    ),
    *_family(
        Category.REQUEST,
        (
            (_E.REQUEST_RECEIVED, STATE, _S.DEBUG, "A request arrived (no body is recorded)."),
            (
                _E.REQUEST_QUEUED,
                STATE,
                _S.DEBUG,
                "A request waits in the admission queue (with depth).",
            ),
            (
                _E.REQUEST_ADMITTED,
                STATE,
                _S.DEBUG,
                "A request left the queue for a lane (with wait).",
            ),
            (
                _E.REQUEST_REJECTED,
                TERMINAL,
                _S.WARNING,
                "A request was refused (queue full, invalid, unauthorised).",
            ),
            (_E.REQUEST_EXECUTION_STARTED, STATE, _S.DEBUG, "A request started executing."),
            (_E.REQUEST_COMPLETED, TERMINAL, _S.INFO, "A request completed."),
            (
                _E.REQUEST_CANCELLED,
                TERMINAL,
                _S.INFO,
                "A request was cancelled (client went away or forced unload).",
            ),
            (_E.REQUEST_TIMED_OUT, TERMINAL, _S.WARNING, "A request hit its deadline."),
            (_E.REQUEST_FAILED, TERMINAL, _S.ERROR, "A request failed; reason_code says why."),
        ),
    ),
    *_family(
        Category.PREFILL,
        (
            (
                _E.PROMPT_PROCESSING_STARTED,
                STATE,
                _S.DEBUG,
                "Prompt processing started (templating, tokenization).",
            ),
            (
                _E.TOKENIZATION_COMPLETED,
                STATE,
                _S.DEBUG,
                "The prompt was tokenized (token count only).",
            ),
            (_E.TOKENIZATION_FAILED, TERMINAL, _S.ERROR, "The prompt could not be tokenized."),
            (_E.PREFILL_STARTED, STATE, _S.DEBUG, "Prefill of the prompt suffix started."),
            (
                _E.PREFILL_PROGRESS,
                PROGRESS,
                _S.DEBUG,
                "Aggregated prefill progress (tokens), not per chunk.",
            ),
            (_E.PREFILL_COMPLETED, STATE, _S.DEBUG, "Prefill finished (tokens, rate)."),
            (_E.PREFILL_CANCELLED, TERMINAL, _S.INFO, "Prefill was cancelled."),
            (_E.PREFILL_FAILED, TERMINAL, _S.ERROR, "Prefill failed."),
            (_E.MEDIA_PREFILL_STARTED, STATE, _S.DEBUG, "Prefill of media input started."),
            (_E.MEDIA_PREFILL_COMPLETED, STATE, _S.DEBUG, "Prefill of media input finished."),
            (_E.MEDIA_PREFILL_FAILED, TERMINAL, _S.ERROR, "Prefill of media input failed."),
            (
                _E.PROMPT_CACHE_RESTORE_HIT,
                STATE,
                _S.DEBUG,
                "The session's warm KV prefix covered the whole prompt prefix.",
            ),
            (_E.PROMPT_CACHE_RESTORE_MISS, STATE, _S.DEBUG, "No reusable KV prefix; full prefill."),
            (
                _E.PROMPT_CACHE_RESTORE_PARTIAL,
                STATE,
                _S.DEBUG,
                "Part of the KV prefix was reused (reused token count).",
            ),
            (
                _E.PROMPT_CACHE_RESTORE_ERROR,
                DIAG,
                _S.WARNING,
                "Restoring a KV prefix failed; fell back to full prefill.",
            ),
        ),
    ),
    *_family(
        Category.GENERATION,
        (
            (_E.GENERATION_STARTED, STATE, _S.DEBUG, "Decoding started for a request."),
            (
                _E.FIRST_TOKEN_PRODUCED,
                STATE,
                _S.INFO,
                "The first token was produced (time to first token).",
            ),
            (
                _E.GENERATION_PROGRESS,
                PROGRESS,
                _S.DEBUG,
                "Aggregated generation progress (tokens), rate-bounded.",
            ),
            (
                _E.STOP_CONDITION_REACHED,
                STATE,
                _S.DEBUG,
                "A stop condition ended generation (EOS, stop string, max tokens).",
            ),
            (
                _E.GENERATION_COMPLETED,
                TERMINAL,
                _S.INFO,
                "Generation completed (token counts, prefill and decode rates, stop reason).",
            ),
            (_E.GENERATION_CANCELLED, TERMINAL, _S.INFO, "Generation was cancelled."),
            (_E.GENERATION_TIMED_OUT, TERMINAL, _S.WARNING, "Generation hit its deadline."),
            (_E.GENERATION_FAILED, TERMINAL, _S.ERROR, "Generation failed."),
            (
                _E.GENERATION_TOKEN_OBSERVED,
                DEBUG,
                _S.TRACE,
                "Opt-in evidence: one decoded token (counts only in normal mode).",
            ),
        ),
    ),
    *_family(
        Category.KV_RUNTIME_STATE,
        (
            (_E.KV_CACHE_INITIALIZATION_STARTED, STATE, _S.DEBUG, "KV cache allocation started."),
            (
                _E.KV_CACHE_INITIALIZATION_COMPLETED,
                STATE,
                _S.INFO,
                "KV cache allocated (capacity in cells).",
            ),
            (_E.KV_CACHE_INITIALIZATION_FAILED, TERMINAL, _S.ERROR, "KV cache allocation failed."),
            (_E.CACHE_LOOKUP_HIT, DIAG, _S.DEBUG, "A cache lookup hit."),
            (_E.CACHE_LOOKUP_MISS, DIAG, _S.DEBUG, "A cache lookup missed."),
            (_E.CACHE_STATE_RECORDED, DIAG, _S.DEBUG, "KV state was recorded for reuse."),
            (_E.CACHE_TRIMMED, STATE, _S.INFO, "KV cells were trimmed or evicted."),
            (_E.CACHE_RESET, STATE, _S.INFO, "The KV cache was reset."),
            (
                _E.CACHE_PRESSURE_CROSSED,
                STATE,
                _S.WARNING,
                "KV use crossed the pressure threshold.",
            ),
            (
                _E.CACHE_PRESSURE_CLEARED,
                STATE,
                _S.INFO,
                "KV use fell back below the pressure threshold.",
            ),
            (
                _E.CONTEXT_CAPACITY_APPROACHING_LIMIT,
                STATE,
                _S.WARNING,
                "A sequence is close to the context limit.",
            ),
            (
                _E.CONTEXT_EXHAUSTED,
                TERMINAL,
                _S.ERROR,
                "A request needed more context than available.",
            ),
            (_E.CACHE_STATE_EXPORT_COMPLETED, TERMINAL, _S.INFO, "KV state export finished."),
            (_E.CACHE_STATE_EXPORT_FAILED, TERMINAL, _S.ERROR, "KV state export failed."),
            (_E.CACHE_STATE_IMPORT_COMPLETED, TERMINAL, _S.INFO, "KV state import finished."),
            (_E.CACHE_STATE_IMPORT_FAILED, TERMINAL, _S.ERROR, "KV state import failed."),
        ),
    ),
    *_family(
        Category.RESOURCE_HEALTH,
        (
            (
                _E.BACKEND_INITIALIZATION_STARTED,
                STATE,
                _S.DEBUG,
                "A compute backend began initialising.",
            ),
            (_E.BACKEND_INITIALIZATION_COMPLETED, STATE, _S.INFO, "A compute backend initialised."),
            (
                _E.BACKEND_INITIALIZATION_FAILED,
                TERMINAL,
                _S.ERROR,
                "A compute backend failed to initialise.",
            ),
            (_E.DEVICE_SELECTED, STATE, _S.INFO, "A device was selected for work."),
            (_E.DEVICE_READY, STATE, _S.INFO, "A device is ready."),
            (_E.DEVICE_DEGRADED, STATE, _S.WARNING, "A device is degraded."),
            (_E.DEVICE_UNAVAILABLE, STATE, _S.ERROR, "A device is unavailable."),
            (_E.DEVICE_RECOVERED, STATE, _S.INFO, "A device recovered."),
            (_E.DEVICE_LOST, STATE, _S.ERROR, "A device was lost."),
            (_E.DEVICE_RESET, STATE, _S.WARNING, "A device was reset."),
            (
                _E.RESOURCE_ALLOCATION_COMPLETED,
                STATE,
                _S.DEBUG,
                "A resource allocation succeeded (bytes).",
            ),
            (_E.RESOURCE_ALLOCATION_FAILED, TERMINAL, _S.ERROR, "A resource allocation failed."),
            (
                _E.MEMORY_PRESSURE_CROSSED,
                STATE,
                _S.WARNING,
                "Device or host memory crossed the pressure threshold.",
            ),
            (_E.MEMORY_PRESSURE_CLEARED, STATE, _S.INFO, "Memory pressure cleared."),
            (
                _E.MEMORY_OBSERVED,
                DIAG,
                _S.DEBUG,
                "A device or host memory observation from an API.",
            ),
            (
                _E.OUT_OF_MEMORY_CONDITION,
                TERMINAL,
                _S.ERROR,
                "An allocation failed for lack of memory.",
            ),
            (
                _E.BACKEND_FALLBACK_ACTIVATED,
                STATE,
                _S.WARNING,
                "Work fell back to another backend.",
            ),
            (_E.CPU_FALLBACK_ACTIVATED, STATE, _S.WARNING, "Work fell back to the CPU."),
            (_E.COMPUTE_FAILURE, TERMINAL, _S.ERROR, "A compute step failed."),
        ),
    ),
    *_family(
        Category.DIAGNOSTIC,
        (
            (
                _E.WARNING_RAISED,
                DIAG,
                _S.WARNING,
                "A structured warning was raised (stable code, scope).",
            ),
            (_E.WARNING_CLEARED, DIAG, _S.INFO, "A structured warning cleared."),
            (
                _E.RECOVERABLE_NATIVE_FAILURE,
                DIAG,
                _S.WARNING,
                "The native layer recovered from a failure.",
            ),
            (_E.FALLBACK_APPLIED, DIAG, _S.WARNING, "A fallback was applied."),
            (
                _E.DEGRADED_OPERATION_ENTERED,
                STATE,
                _S.WARNING,
                "Operation continues in a degraded mode.",
            ),
            (_E.DEGRADED_OPERATION_EXITED, STATE, _S.INFO, "Degraded operation ended."),
            (
                _E.FATAL_NATIVE_FAILURE,
                TERMINAL,
                _S.FATAL,
                "The native layer reported a fatal failure.",
            ),
            (
                _E.INVARIANT_PROTOCOL_VIOLATION,
                TERMINAL,
                _S.ERROR,
                "A protocol or invariant violation was detected.",
            ),
            (
                _E.NATIVE_LOG_SUMMARY,
                DIAG,
                _S.DEBUG,
                "Counts of native log messages by level (never their text).",
            ),
        ),
    ),
    *_family(
        Category.NODE_AVAILABILITY,
        (
            (_E.NODE_STARTING, STATE, _S.INFO, "Reducer: the node is starting."),
            (
                _E.NODE_ACCEPTING_REQUESTS,
                STATE,
                _S.INFO,
                "Reducer: the node accepts requests (at least one model available).",
            ),
            (
                _E.NODE_DEGRADED,
                STATE,
                _S.WARNING,
                "Reducer: the node serves with a degraded model or stage.",
            ),
            (_E.NODE_UNAVAILABLE, STATE, _S.WARNING, "Reducer: the node cannot serve any request."),
            (_E.NODE_DRAINING, STATE, _S.INFO, "Reducer: the node is draining."),
            (_E.NODE_STOPPED, STATE, _S.INFO, "Reducer: the node stopped."),
            (
                _E.AVAILABLE_MODEL_SET_CHANGED,
                STATE,
                _S.INFO,
                "Reducer: the set of available models changed.",
            ),
            (
                _E.NODE_CAPACITY_CHANGED,
                STATE,
                _S.DEBUG,
                "Reducer: request, lane or session capacity changed.",
            ),
            (
                _E.NODE_RESOURCE_PRESSURE_CHANGED,
                STATE,
                _S.WARNING,
                "Reducer: node-level resource pressure changed.",
            ),
        ),
    ),
    *_family(
        Category.EVENT_SYSTEM_HEALTH,
        (
            (
                _E.INGRESS_QUEUE_PRESSURE,
                DIAG,
                _S.WARNING,
                "An ingress lane passed its pressure threshold.",
            ),
            (
                _E.EVENTS_COALESCED,
                DIAG,
                _S.DEBUG,
                "Progress values or repeated level states were coalesced"
                " (count since the last report).",
            ),
            (_E.EVENTS_SAMPLED, DIAG, _S.DEBUG, "Diagnostics were sampled under pressure (count)."),
            (
                _E.EVENTS_DROPPED_BY_CLASS,
                DIAG,
                _S.WARNING,
                "Events were dropped (counts by delivery class).",
            ),
            (_E.SUBSCRIBER_LAGGING, DIAG, _S.WARNING, "A subscriber fell behind its bound."),
            (
                _E.SUBSCRIBER_DISCONNECTED,
                DIAG,
                _S.WARNING,
                "A subscriber was disconnected (lag or failure).",
            ),
            (
                _E.REDUCER_ERROR,
                DIAG,
                _S.WARNING,
                "The reducer rejected an invalid or duplicate transition (counted).",
            ),
            (
                _E.TELEMETRY_EXPORTER_DEGRADED,
                DIAG,
                _S.WARNING,
                "A telemetry exporter is failing or stalled.",
            ),
            (_E.TELEMETRY_EXPORTER_RECOVERED, DIAG, _S.INFO, "A telemetry exporter recovered."),
            (
                _E.EVENT_SCHEMA_INCOMPATIBILITY,
                DIAG,
                _S.WARNING,
                "A record with an unsupported schema was ignored.",
            ),
            (
                _E.UNKNOWN_NATIVE_EVENT_RECEIVED,
                DIAG,
                _S.DEBUG,
                "Native records of unknown kind or category were counted.",
            ),
            (
                _E.NATIVE_SEQUENCE_GAP_DETECTED,
                DIAG,
                _S.WARNING,
                "A gap in a native operation's sequence was recorded.",
            ),
            (
                _E.RUNTIME_REPLAY_GAP,
                DIAG,
                _S.WARNING,
                "A consumer resumed past the retained replay window.",
            ),
        ),
    ),
    *_family(
        Category.SPECULATION,
        (
            (
                _E.SERVING_PLUGIN_LOADED,
                STATE,
                _S.INFO,
                "A serving plugin started beside a model's engine (in its own process).",
            ),
            (
                _E.SERVING_PLUGIN_LOAD_FAILED,
                DIAG,
                _S.WARNING,
                "A serving plugin could not be loaded (not found, ABI mismatch): the model"
                " serves without it.",
            ),
            (
                _E.SERVING_PLUGIN_FAILED,
                DIAG,
                _S.WARNING,
                "A serving plugin failed (crashed, raised, error status, protocol error):"
                " counted; serving went on.",
            ),
            (
                _E.SERVING_PLUGIN_RESTARTED,
                DIAG,
                _S.INFO,
                "A serving plugin's process was started again after it died.",
            ),
            (
                _E.SERVING_PLUGIN_DISABLED,
                STATE,
                _S.WARNING,
                "A serving plugin was disabled after repeated failures; the model serves"
                " without it.",
            ),
            (
                _E.SPECULATION_SUMMARIZED,
                DIAG,
                _S.INFO,
                "A speculating request's figures: windows, proposed, accepted, rejected, late,"
                " discarded tokens.",
            ),
            (
                _E.SPECULATION_SWITCHED,
                DIAG,
                _S.INFO,
                "Spec auto: a request's lane started (on) or stopped (off) verifying its"
                " proposals.",
            ),
            (
                _E.SERVING_PLUGIN_OBSERVED,
                PROGRESS,
                _S.INFO,
                "A serving plugin's delivery counters: delivered, deferred, dropped, late,"
                " discarded.",
            ),
        ),
    ),
)

CATALOG: Final[Mapping[EventId, EventSpec]] = MappingProxyType({s.id: s for s in _SPECS})


def spec_of(event_id: EventId) -> EventSpec:
    """The catalog entry of an id (every EventId member has one; tested)."""
    return CATALOG[event_id]
