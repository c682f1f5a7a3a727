"""The typed event envelope shared by every producer and consumer.

Privacy by construction (ARCHITECTURE.md §7): an `Event` has no free-text field. Identities are
`LogicalId`s (a short token: no spaces, no slashes, so neither a prompt nor a path fits), numeric
summaries use a closed set of keys, states are enum values, and the human summary is rendered by
the projection from the catalog and these typed fields. Fields that do not apply are `None`
(absent on the wire), never 0 or "".
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.reasons import (
    Category,
    DeliveryClass,
    Outcome,
    Producer,
    ProgressUnit,
    ReasonCode,
    Severity,
)

SCHEMA_VERSION: Final = 1

_LOGICAL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=-]{0,63}")


class InvalidLogicalId(ValueError):
    """A value offered as an identity is not a short opaque token."""


class LogicalId(str):
    """An opaque identity token: 1–64 of `[A-Za-z0-9._:+=-]`, starting alphanumeric.

    Construction validates, so a prompt (spaces), a path (slashes) or a pointer-like blob longer
    than 64 characters cannot become an id.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> LogicalId:
        if not _LOGICAL_ID.fullmatch(value):
            raise InvalidLogicalId("identity must be 1-64 characters of [A-Za-z0-9._:+=-]")
        return super().__new__(cls, value)


class SummaryKey(StrEnum):
    """The closed set of numeric summary keys (bounded cardinality, no free-form attributes)."""

    MEMORY_FREE_BYTES = "memory_free_bytes"
    MEMORY_TOTAL_BYTES = "memory_total_bytes"
    MEMORY_USED_BYTES = "memory_used_bytes"
    DEVICE_TYPE = "device_type"
    CONTEXT_TOKENS = "context_tokens"
    CONTEXT_TRAIN_TOKENS = "context_train_tokens"
    """The context a model was trained with (native_model_load_completed)."""
    CONTEXT_TOKENS_PER_LANE = "context_tokens_per_lane"
    PARAMETERS = "parameters"
    MODEL_SIZE_BYTES = "model_size_bytes"
    VOCAB_SIZE = "vocab_size"
    """Tokens in a model's vocabulary (native_model_load_completed)."""
    LAYERS = "layers"
    """A model's repeating layers (native_model_load_completed; a topology's stage events)."""
    FILES = "files"
    """GGUF files a load opened: a split set's parts, else 1 (native_model_load_completed)."""
    BATCH_TOKENS = "batch_tokens"
    """A context's n_batch: the most tokens one decode call takes
    (serving_backend_initialization_completed). Not ``batch_size``: a decode step's requests."""
    GPU_LAYERS = "gpu_layers"
    LANES = "lanes"
    LANES_IN_USE = "lanes_in_use"
    PROMPT_TOKENS = "prompt_tokens"
    GENERATED_TOKENS = "generated_tokens"
    REUSED_TOKENS = "reused_tokens"
    QUEUE_DEPTH = "queue_depth"
    QUEUE_CAPACITY = "queue_capacity"
    QUEUE_WAIT_MS = "queue_wait_ms"
    TIME_TO_FIRST_TOKEN_MS = "time_to_first_token_ms"
    PREFILL_TOKENS_PER_S = "prefill_tokens_per_s"
    DECODE_TOKENS_PER_S = "decode_tokens_per_s"
    BATCH_SIZE = "batch_size"
    SHARED_DECODE_STEPS = "shared_decode_steps"
    PREFILL_MS = "prefill_ms"
    DECODE_MS = "decode_ms"
    ACTIVE_SESSIONS = "active_sessions"
    DRAINING_SESSIONS = "draining_sessions"
    CANCELLED_REQUESTS = "cancelled_requests"
    KV_CELLS_USED = "kv_cells_used"
    KV_CELLS_TOTAL = "kv_cells_total"
    ATTEMPT = "attempt"
    EXIT_STATUS = "exit_status"
    EXIT_SIGNAL = "exit_signal"
    COUNT = "count"
    COALESCED = "coalesced"
    SAMPLED = "sampled"
    DROPPED_TERMINAL = "dropped_terminal"
    DROPPED_STATE = "dropped_state"
    DROPPED_PROGRESS = "dropped_progress"
    DROPPED_DIAGNOSTIC = "dropped_diagnostic"
    REJECTED = "rejected"
    LAGGING_SUBSCRIBERS = "lagging_subscribers"
    EXPECTED_SEQUENCE = "expected_sequence"
    RECEIVED_SEQUENCE = "received_sequence"
    NATIVE_KIND = "native_kind"
    NATIVE_CATEGORY = "native_category"
    LOG_MESSAGES_WARN = "log_messages_warn"
    LOG_MESSAGES_ERROR = "log_messages_error"
    FEATURE_BITS = "feature_bits"
    ABI_VERSION = "abi_version"
    PORT = "port"
    THREADS = "threads"
    FLASH_ATTENTION = "flash_attention"
    """1 when a serving context uses llama.cpp's flash attention, 0 when not; absent when
    llama.cpp chose (serving_backend_initialization_completed)."""
    BATCH_INVARIANT = "batch_invariant"
    """1 when a serving context decodes a row bit for bit the same whatever is beside it (other
    requests, a verify window), so greedy texts do not depend on them; 0 when not
    (serving_backend_initialization_completed; engine/kernels.py)."""
    MEMORY_LIMIT_BYTES = "memory_limit_bytes"
    STAGES = "stages"
    LAYER_START = "layer_start"
    LAYER_COUNT = "layer_count"
    PLANNED_BYTES = "planned_bytes"
    OFFERED_BYTES = "offered_bytes"
    LINK_RTT_MS = "link_rtt_ms"
    LINK_P95_MS = "link_p95_ms"
    LINK_JITTER_MS = "link_jitter_ms"
    LINK_P95_THRESHOLD_MS = "link_p95_threshold_ms"
    SPEC_WINDOWS = "spec_windows"
    SPEC_PROPOSED_TOKENS = "spec_proposed_tokens"
    SPEC_ACCEPTED_TOKENS = "spec_accepted_tokens"
    STATE_BYTES = "state_bytes"
    """Bytes of a session's KV state file (cache_state_export_* / cache_state_import_*)."""
    WEIGHTS_BYTES = "weights_bytes"
    """Model weights held on one device (model_memory_allocation_summary)."""
    KV_BYTES = "kv_bytes"
    """KV cache held on one device, or the KV cache a refused context would have needed."""
    COMPUTE_BYTES = "compute_bytes"
    """Compute (scratch) buffers held on one device."""
    REQUESTED_BYTES = "requested_bytes"
    """What a failed allocation asked for (resource_allocation_failed, out_of_memory_condition)."""
    RETURN_CODE = "return_code"
    """A llama.cpp call's return code (compute_failure: llama_decode's)."""
    SPEC_REJECTED_TOKENS = "spec_rejected_tokens"
    SPEC_LATE_QUERIES = "spec_late_queries"
    SPEC_DISCARDED_TOKENS = "spec_discarded_tokens"
    SPEC_ACCEPTANCE_PCT = "spec_acceptance_pct"
    """A lane's per-token acceptance estimate of its proposals (speculation_switched)."""
    ENGINE_WAIT_MS = "engine_wait_ms"
    """The engine's wait for a lane (events/figures.py); not ``queue_wait_ms``, the host's."""
    IDLE_TTL_MS = "idle_ttl_ms"
    """How long an idle model stays loaded before it unloads (model_idle_timer_started)."""
    RETRY_DELAY_MS = "retry_delay_ms"
    """How long the runtime waits before its next attempt (model_recovery_started: the
    engine's restart after its backoff)."""
    # A serving plugin's counters (serving_plugin_observed): messages delivered to its sidecar,
    # commits deferred to a later message and messages dropped (its queue was full), proposals
    # discarded late (discard reason deadline_exceeded) and for the contract's other discard
    # reasons, and its failures (crashes, raised exceptions or error statuses, protocol errors).
    PLUGIN_DELIVERED = "plugin_delivered"
    PLUGIN_DEFERRED = "plugin_deferred"
    PLUGIN_DROPPED = "plugin_dropped"
    PLUGIN_LATE = "plugin_late"
    PLUGIN_FAILURES = "plugin_failures"
    PLUGIN_DISCARDED_INVALID_TOKEN_COUNT = "plugin_discarded_invalid_token_count"
    PLUGIN_DISCARDED_INVALID_TOKEN_ID = "plugin_discarded_invalid_token_id"
    PLUGIN_DISCARDED_POSITION_MISMATCH = "plugin_discarded_position_mismatch"
    PLUGIN_DISCARDED_EXECUTION_FAILED = "plugin_discarded_execution_failed"


class StopReason(StrEnum):
    """Why generation stopped (closed vocabulary; the stop string itself is never recorded)."""

    EOS = "eos"
    STOP_STRING = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    ERROR = "error"


class BatchingMode(StrEnum):
    """How a request was decoded: sharing decode steps with other requests, or alone."""

    CONTINUOUS = "continuous"
    SINGLE = "single"


class SequenceEvidence(StrEnum):
    """What the adapter concluded from a native per-operation sequence number."""

    FIRST = "first"
    CONTIGUOUS = "contiguous"
    GAP = "gap"
    DUPLICATE_OR_OUT_OF_ORDER = "duplicate_or_out_of_order"


@dataclass(frozen=True, slots=True)
class Progress:
    current: int
    total: int | None
    unit: ProgressUnit


@dataclass(frozen=True, slots=True)
class StateChange:
    previous: str | None
    current: str


@dataclass(frozen=True, slots=True)
class NumericSummary:
    key: SummaryKey
    value: int | float


_SETTING_KEY: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_SETTINGS: Final = 32


class InvalidSetting(ValueError):
    """A setting whose key is not a short snake_case name or whose value is not a number, a flag
    or a short token."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One configuration value a component runs with (``model_load_requested``: a load's
    options beyond their defaults). Validated at construction like a `LogicalId`: the key is a
    snake_case name, a text value a short token — no path, prompt or endpoint fits."""

    key: str
    value: int | float | bool | str

    def __post_init__(self) -> None:
        if not _SETTING_KEY.fullmatch(self.key):
            raise InvalidSetting("a setting key is a snake_case name of 1-64 characters")
        if isinstance(self.value, str) and not _LOGICAL_ID.fullmatch(self.value):
            raise InvalidSetting("a setting's text is 1-64 characters of [A-Za-z0-9._:+=-]")
        if not isinstance(self.value, int | float | str):
            raise InvalidSetting("a setting's value is a number, a flag or a short token")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise InvalidSetting("a setting's number is finite")


def settings(pairs: tuple[tuple[str, int | float | bool | str], ...]) -> tuple[Setting, ...]:
    """Settings from (key, value) pairs (at most `MAX_SETTINGS`)."""
    if len(pairs) > MAX_SETTINGS:
        raise InvalidSetting(f"at most {MAX_SETTINGS} settings")
    return tuple(Setting(key, value) for key, value in pairs)


@dataclass(frozen=True, slots=True)
class NativeStamp:
    """Where a native fact came from: its own clock and per-operation sequence."""

    timestamp_ns: int
    sequence: int
    evidence: SequenceEvidence


@dataclass(frozen=True, slots=True)
class Scope:
    model_id: LogicalId | None = None
    topology_id: LogicalId | None = None
    stage_id: LogicalId | None = None
    stage_index: int | None = None
    session_id: LogicalId | None = None
    request_id: LogicalId | None = None
    device_id: LogicalId | None = None
    plugin_id: LogicalId | None = None
    """A serving plugin of the model: its short name (a basename or an entry-point name)."""


NO_SCOPE: Final = Scope()


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One runtime domain event (the middle layer of the spec: typed, backend-neutral)."""

    id: EventId
    producer: Producer
    severity: Severity
    wall_ns: int
    mono_ns: int
    operation_id: LogicalId | None = None
    parent_operation_id: LogicalId | None = None
    scope: Scope = NO_SCOPE
    native: NativeStamp | None = None
    state: StateChange | None = None
    progress: Progress | None = None
    outcome: Outcome | None = None
    reason_code: ReasonCode | None = None
    duration_ms: float | None = None
    stop_reason: StopReason | None = None
    batching: BatchingMode | None = None
    summaries: tuple[NumericSummary, ...] = field(default=())
    settings: tuple[Setting, ...] = field(default=())

    @property
    def category(self) -> Category:
        return spec_of(self.id).category

    @property
    def delivery(self) -> DeliveryClass:
        return spec_of(self.id).delivery

    def summary_value(self, key: SummaryKey) -> int | float | None:
        for item in self.summaries:
            if item.key is key:
                return item.value
        return None


def make_event(
    event_id: EventId,
    producer: Producer = Producer.RUNTIME,
    *,
    severity: Severity | None = None,
    operation_id: LogicalId | None = None,
    parent_operation_id: LogicalId | None = None,
    scope: Scope = NO_SCOPE,
    native: NativeStamp | None = None,
    state: StateChange | None = None,
    progress: Progress | None = None,
    outcome: Outcome | None = None,
    reason_code: ReasonCode | None = None,
    duration_ms: float | None = None,
    stop_reason: StopReason | None = None,
    batching: BatchingMode | None = None,
    summaries: tuple[NumericSummary, ...] = (),
    settings: tuple[Setting, ...] = (),
    wall_ns: int | None = None,
    mono_ns: int | None = None,
) -> Event:
    """Build an event stamped now, with the catalog's default severity unless one is given.

    Equal to `Event(...)` with the same fields; built without `Event.__init__`, whose keyword
    parsing and frozen-field assignment cost as much again on every event the pipeline makes
    (`Event` has no `__post_init__`; checked at import, with every field set). Each field is
    set through its slot's descriptor, which skips `object.__setattr__`'s lookup of the name
    (the pipeline makes one event per native fact).
    """
    event = _new_event(Event)
    _set_id(event, event_id)
    _set_producer(event, producer)
    _set_severity(event, severity if severity is not None else spec_of(event_id).severity)
    _set_wall_ns(event, wall_ns if wall_ns is not None else time.time_ns())
    _set_mono_ns(event, mono_ns if mono_ns is not None else time.monotonic_ns())
    _set_operation_id(event, operation_id)
    _set_parent_operation_id(event, parent_operation_id)
    _set_scope(event, scope)
    _set_native(event, native)
    _set_state(event, state)
    _set_progress(event, progress)
    _set_outcome(event, outcome)
    _set_reason_code(event, reason_code)
    _set_duration_ms(event, duration_ms)
    _set_stop_reason(event, stop_reason)
    _set_batching(event, batching)
    _set_summaries(event, summaries)
    _set_settings(event, settings)
    return event


def _slot_setter(name: str) -> Callable[[Event, object], None]:
    """The setter of `Event`'s slot `name` (its member descriptor's `__set__`)."""
    setter: Callable[[Event, object], None] = vars(Event)[name].__set__
    return setter


_new_event: Final = object.__new__
_set_id: Final = _slot_setter("id")
_set_producer: Final = _slot_setter("producer")
_set_severity: Final = _slot_setter("severity")
_set_wall_ns: Final = _slot_setter("wall_ns")
_set_mono_ns: Final = _slot_setter("mono_ns")
_set_operation_id: Final = _slot_setter("operation_id")
_set_parent_operation_id: Final = _slot_setter("parent_operation_id")
_set_scope: Final = _slot_setter("scope")
_set_native: Final = _slot_setter("native")
_set_state: Final = _slot_setter("state")
_set_progress: Final = _slot_setter("progress")
_set_outcome: Final = _slot_setter("outcome")
_set_reason_code: Final = _slot_setter("reason_code")
_set_duration_ms: Final = _slot_setter("duration_ms")
_set_stop_reason: Final = _slot_setter("stop_reason")
_set_batching: Final = _slot_setter("batching")
_set_summaries: Final = _slot_setter("summaries")
_set_settings: Final = _slot_setter("settings")


def _check_make_event_sets_every_field() -> None:
    """At import: a field added to `Event` that `make_event` does not set fails here, not as
    an AttributeError on some consumer's first read of it."""
    probe = make_event(EventId.RUNTIME_INITIALIZED, wall_ns=0, mono_ns=0)
    missing = [f.name for f in dataclasses.fields(Event) if not hasattr(probe, f.name)]
    if missing or hasattr(Event, "__post_init__"):
        raise TypeError(f"make_event does not build Event as Event() would: {missing}")


_check_make_event_sets_every_field()


def summaries(**values: int | float | None) -> tuple[NumericSummary, ...]:
    """Numeric summaries from keyword arguments named after `SummaryKey` values; None is skipped."""
    return tuple(
        NumericSummary(SummaryKey(key), value) for key, value in values.items() if value is not None
    )
