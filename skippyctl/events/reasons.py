"""Wire-stable enumerations of the event contract.

Every value here is public: it appears verbatim in JSON records, SSE frames and exit-code tables.
Add members, never rename or remove them (ARCHITECTURE.md §5).
"""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    """The family an event id belongs to (reference categories)."""

    NATIVE_RUNTIME = "native_runtime"
    MODEL_PREPARATION = "model_preparation"
    MODEL_LOADING = "model_loading"
    MODEL_AVAILABILITY = "model_availability"
    MODEL_UNLOADING = "model_unloading"
    STAGE_TOPOLOGY = "stage_topology"
    SESSION = "session"
    REQUEST = "request"
    PREFILL = "prefill"
    GENERATION = "generation"
    KV_RUNTIME_STATE = "kv_runtime_state"
    RESOURCE_HEALTH = "resource_health"
    DIAGNOSTIC = "diagnostic"
    NODE_AVAILABILITY = "node_availability"
    EVENT_SYSTEM_HEALTH = "event_system_health"
    SPECULATION = "speculation"


class DeliveryClass(StrEnum):
    """How an event travels under pressure (spec: "Delivery, Backpressure, and Correctness")."""

    TERMINAL = "terminal"
    """Ends an operation; never silently lost (reserved capacity, synthetic terminal otherwise)."""
    STATE_TRANSITION = "state_transition"
    """Changes current state; shares the terminal reserve."""
    PROGRESS = "progress"
    """Latest value per operation wins; duplicates and regressions suppressed; droppable."""
    DIAGNOSTIC = "diagnostic"
    """Droppable, sampled under pressure, always counted."""
    DEBUG = "debug"
    """Opt-in evidence only (raw native log lines, per-token observations)."""


class Severity(StrEnum):
    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    FATAL = "fatal"


class Producer(StrEnum):
    """Who stated the fact: the native layer, the Python runtime, or the reconciler."""

    NATIVE = "native"
    RUNTIME = "runtime"
    RECONCILED = "reconciled"


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class GenerationOutcome(StrEnum):
    """How one generation ended: the suffix of its `generation_*` / `request_*` terminal event ids
    and the `outcome` a client's stream reports (a request refused before any lane is
    `rejected`, which no generation is)."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


class CacheResult(StrEnum):
    """What a request found of its prompt in its session's KV: `hit` (all but the last prompt
    token), `partial`, `miss` (a new session, or nothing reusable), `none` (no session). Each
    but `none` is the suffix of a `prompt_cache_restore_*` event id."""

    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    NONE = "none"


class ReasonCode(StrEnum):
    """Stable machine-readable reasons for terminal and warning events (the reference set)."""

    INVALID_CONFIGURATION = "invalid_configuration"
    UNSUPPORTED_CAPABILITY = "unsupported_capability"
    MISSING_ARTIFACT = "missing_artifact"
    ARTIFACT_IO_FAILURE = "artifact_io_failure"
    MODEL_FORMAT_OR_LOAD_FAILURE = "model_format_or_load_failure"
    BACKEND_INITIALIZATION_FAILURE = "backend_initialization_failure"
    DEVICE_UNAVAILABLE = "device_unavailable"
    RESOURCE_ALLOCATION_FAILURE = "resource_allocation_failure"
    OUT_OF_MEMORY = "out_of_memory"
    CONTEXT_EXHAUSTED = "context_exhausted"
    STAGE_UNAVAILABLE = "stage_unavailable"
    TIMEOUT = "timeout"
    CANCELLATION = "cancellation"
    PROCESS_CRASH = "process_crash"
    INCOMPATIBLE_ABI_OR_FEATURE_SET = "incompatible_abi_or_feature_set"
    INTERNAL_RUNTIME_FAILURE = "internal_runtime_failure"
    UNKNOWN_FAILURE = "unknown_failure"
    TERMINAL_NOT_DELIVERED = "terminal_not_delivered"
    RESERVATION_EXHAUSTED = "reservation_exhausted"
    IDLE = "idle"
    """An unload the runtime started because the model stayed idle past its TTL."""
    MAX_MODELS = "max_models"
    """An unload that made room for another model under ``--max-models`` (the least recently
    used idle, unpinned model), or a load refused because none could make room."""
    MEMORY_BUDGET = "memory_budget"
    """An unload that made room in the runtime's memory budget for another model (the least
    recently used idle, unpinned model)."""
    INSUFFICIENT_MEMORY = "insufficient_memory"
    """A load refused before any weight moved: its estimate does not fit the memory budget,
    and no idle, unpinned model could make room."""
    CRASH_LOOP = "crash_loop"
    """A model whose engine kept dying: the runtime restarted it as often as its restart
    policy allows within the policy's window and then stopped (``model_recovery_failed``;
    the model is failed until it is loaded again)."""


class ProgressUnit(StrEnum):
    """Units of `progress.current`/`progress.total` (mirrors the native progress_unit)."""

    NONE = "none"
    BYTES = "bytes"
    ITEMS = "items"
    TENSORS = "tensors"
    STEPS = "steps"
    TOKENS = "tokens"


class WarningCode(StrEnum):
    """What a structured warning is about: the `state.current` of `warning_raised` and the
    `state.previous` of its `warning_cleared` (the reason code says why; this says which
    condition, so a raise and its clear pair up by code and scope)."""

    KV_NEAR_FULL = "kv_near_full"
    """A model's KV cache crossed its pressure mark (`cache_pressure_crossed`)."""
    QUEUE_SATURATED = "queue_saturated"
    """A model's admission queue is full: requests are refused with 429 until it drains."""
    SUBSCRIBER_LAGGING = "subscriber_lagging"
    """An event subscriber (an SSE client, an exporter's intake) is behind half its bound."""
    EXPORTER_FAILING = "exporter_failing"
    """A telemetry exporter cannot deliver (dead endpoint, timeouts, HTTP errors)."""
    STAGE_LINK_DEGRADED = "stage_link_degraded"
    """A stage's link p95 is above `--stage-link-p95-ms` (`stage_degraded`)."""


class DegradedMode(StrEnum):
    """How the runtime runs degraded: the `state.current` of `degraded_operation_entered` and
    the `state.previous` of its `degraded_operation_exited`."""

    LEGACY_INGRESS = "legacy_ingress"
    """No usable native event library: engines run without a shared-memory ring (state from
    return values and Python producers only)."""
    TELEMETRY_EXPORT_DOWN = "telemetry_export_down"
    """The configured telemetry exporter cannot deliver; local state is unaffected."""


CLEARED_STATE = "cleared"
"""The `state.current` of `warning_cleared`."""
NORMAL_STATE = "normal"
"""The `state.current` of `degraded_operation_exited`."""
