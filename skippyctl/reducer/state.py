"""Reduced current state: immutable, bounded views built only by the reducer.

Bounds (the reducer evicts, and counts, beyond them): models 64, stages 64, topologies 16,
sessions 512, in-flight requests 1024, devices 32, recent requests 64, recent events 128,
active warnings 64.
Derived quantities (queue depth, lanes in use, node availability) are computed from these views by
the functions at the bottom, never stored twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from skippyctl.events.envelope import Event, LogicalId, Progress, Setting
from skippyctl.events.reasons import ReasonCode

MAX_MODELS: Final = 64
MAX_STAGES: Final = 64
MAX_TOPOLOGIES: Final = 16
MAX_SESSIONS: Final = 512
MAX_REQUESTS: Final = 1024
MAX_DEVICES: Final = 32
MAX_RECENT_REQUESTS: Final = 64
MAX_RECENT_EVENTS: Final = 128
MAX_WARNINGS: Final = 64


class ModelState(StrEnum):
    """A model's availability; only the reducer moves it (see reducer.models for the table)."""

    REQUESTED = "requested"
    LOADING = "loading"
    INITIALIZING = "initializing"
    AVAILABLE = "available"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNLOADING = "unloading"
    UNLOADED = "unloaded"


SETTLED_MODEL_STATES: Final = frozenset(
    {ModelState.FAILED, ModelState.CANCELLED, ModelState.UNLOADED, ModelState.UNAVAILABLE}
)
LOADING_MODEL_STATES: Final = frozenset(
    {ModelState.REQUESTED, ModelState.LOADING, ModelState.INITIALIZING}
)
SERVING_MODEL_STATES: Final = frozenset({ModelState.AVAILABLE, ModelState.DEGRADED})


class NativeMode(StrEnum):
    UNKNOWN = "unknown"
    NATIVE = "native"
    LEGACY = "legacy"


class RuntimeState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class NodeState(StrEnum):
    STARTING = "starting"
    ACCEPTING = "accepting"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"
    DRAINING = "draining"
    STOPPED = "stopped"


class StageState(StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class TopologyState(StrEnum):
    ASSEMBLING = "assembling"
    READY = "ready"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


class SessionState(StrEnum):
    REQUESTED = "requested"
    ACTIVE = "active"
    IDLE = "idle"
    DRAINING = "draining"


class RequestState(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    ADMITTED = "admitted"
    PREFILL = "prefill"
    DECODE = "decode"


class DeviceState(StrEnum):
    SELECTED = "selected"
    READY = "ready"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class KvView:
    cells_total: int | None = None
    cells_used: int | None = None
    pressure: bool = False
    approaching_limit: int = 0
    exhausted: int = 0


class PluginState(StrEnum):
    """A serving plugin of a model (reducer.plugins has the table)."""

    SERVING = "serving"
    LOAD_FAILED = "load_failed"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class PluginView:
    """One serving plugin of a model: its state (``serving_plugin_*``), its failures and
    restarts, and its delivery counters (the latest ``serving_plugin_observed``)."""

    plugin_id: LogicalId
    state: PluginState
    reason_code: ReasonCode | None = None
    failures: int = 0
    restarts: int = 0
    delivered: int = 0
    deferred: int = 0
    dropped: int = 0
    late: int = 0
    """Proposals discarded for a missed deadline (discard reason ``deadline_exceeded``)."""
    discarded_invalid_token_count: int = 0
    discarded_invalid_token_id: int = 0
    discarded_position_mismatch: int = 0
    discarded_execution_failed: int = 0


@dataclass(frozen=True, slots=True)
class ModelView:
    model_id: LogicalId
    state: ModelState
    operation_id: LogicalId | None = None
    topology_id: LogicalId | None = None
    progress: Progress | None = None
    device_id: LogicalId | None = None
    device_memory_free_bytes: int | None = None
    device_memory_total_bytes: int | None = None
    context_tokens: int | None = None
    lanes: int | None = None
    context_tokens_per_lane: int | None = None
    batch_invariant: bool | None = None
    """Whether the serving context decodes a row the same whatever is beside it (the load's
    ``batch_invariant`` summary)."""
    queue_capacity: int | None = None
    model_size_bytes: int | None = None
    parameters: int | None = None
    reason_code: ReasonCode | None = None
    requested_mono_ns: int | None = None
    load_duration_ms: float | None = None
    backend_ready: bool = False
    kv: KvView = field(default_factory=KvView)
    completed_requests: int = 0
    generated_tokens: int = 0
    decode_tokens_per_s: float | None = None
    spec_proposed_tokens: int = 0
    """Speculative decoding: tokens proposed and committed, over its ended requests
    (``generation_completed`` summaries)."""
    spec_accepted_tokens: int = 0
    updated_mono_ns: int = 0
    settings: tuple[Setting, ...] = ()
    """What its load asked for beyond the defaults (``model_load_requested``)."""
    chat_template: tuple[Setting, ...] = ()
    """Which chat template serves its chats (``source``, ``sha256``, ``tool_use``: the settings
    of its ``native_model_load_completed``)."""
    recovery_attempt: int | None = None
    """The engine restart under way (its number within the restart policy's window, from
    ``model_recovery_started``); None: no restart is under way."""
    restarts: int = 0
    """Engine restarts the runtime made of this model since it was last loaded by hand."""
    served_capacity: tuple[int | None, int | None] | None = None
    """(context tokens, lanes) the model served with before the restart under way: the
    restart plans its context again, and a different one is ``model_capacity_changed``."""
    idle_ttl_ms: float | None = None
    idle_expires_wall_ns: int | None = None
    """When an idle model unloads unless a request comes (``model_idle_timer_started``'s time
    plus its ``idle_ttl_ms``); None: in use, or no idle TTL."""
    plugins: tuple[PluginView, ...] = ()
    """Its serving plugins, by plugin id (reducer.plugins)."""


@dataclass(frozen=True, slots=True)
class StageView:
    stage_id: LogicalId
    state: StageState
    topology_id: LogicalId | None = None
    stage_index: int | None = None
    upstream_connected: bool | None = None
    downstream_connected: bool | None = None
    reason_code: ReasonCode | None = None
    layer_start: int | None = None
    """First of the model's layers planned onto this stage (its ``stage_loading``)."""
    layer_count: int | None = None
    planned_bytes: int | None = None
    """The plan's estimate of this stage's share of the weights."""
    offered_bytes: int | None = None
    """Memory the stage offered the plan (its ``--mem``, else its device's free memory)."""
    updated_mono_ns: int = 0
    link_rtt_ms: float | None = None
    """The engine's link to this stage: median round trip (ms) of the latest figures an event
    carried (summaries ``link_rtt_ms``/``link_p95_ms``/``link_jitter_ms``)."""
    link_p95_ms: float | None = None
    link_jitter_ms: float | None = None
    link_probes: int | None = None
    """How many probes of this link the latest ``stage_link_observed`` counted (its progress):
    the figures above are live while this grows."""


@dataclass(frozen=True, slots=True)
class TopologyView:
    topology_id: LogicalId
    state: TopologyState
    model_id: LogicalId | None = None
    stages: int | None = None
    """How many stages the plan uses (``topology_assembling``)."""
    layers: int | None = None
    planned_bytes: int | None = None
    offered_bytes: int | None = None
    reason_code: ReasonCode | None = None
    updated_mono_ns: int = 0


@dataclass(frozen=True, slots=True)
class SessionView:
    session_id: LogicalId
    state: SessionState
    model_id: LogicalId | None = None
    lane: int | None = None
    context_tokens: int | None = None
    """Tokens the session holds in its lane's KV (as of its last request's end, or its
    restore)."""
    reused_tokens: int | None = None
    """Prompt tokens its last request found in that KV (not prefilled again)."""
    trimmed: int = 0
    updated_mono_ns: int = 0
    spec_proposed_tokens: int = 0
    """Speculative decoding over the session's ended requests: proposed and committed tokens."""
    spec_accepted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: LogicalId
    state: RequestState
    model_id: LogicalId | None = None
    session_id: LogicalId | None = None
    queue_depth: int | None = None
    queue_wait_ms: float | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    time_to_first_token_ms: float | None = None
    received_mono_ns: int = 0
    updated_mono_ns: int = 0


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """A finished request, kept in the capped recent list."""

    request_id: LogicalId
    model_id: LogicalId | None
    event_id: str
    reason_code: ReasonCode | None
    duration_ms: float | None


@dataclass(frozen=True, slots=True)
class DeviceView:
    device_id: LogicalId
    state: DeviceState
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_pressure: bool = False
    out_of_memory: int = 0
    updated_mono_ns: int = 0


@dataclass(frozen=True, slots=True)
class EventSystemView:
    """Totals from the pipeline's (rate-limited) health reports."""

    dropped_terminal: int = 0
    dropped_state: int = 0
    dropped_progress: int = 0
    dropped_diagnostic: int = 0
    dropped_native: int = 0
    coalesced: int = 0
    sampled: int = 0
    unknown_native: int = 0
    sequence_gaps: int = 0
    lagging_subscribers: int = 0
    disconnected_subscribers: int = 0
    reducer_errors: int = 0
    exporter_degraded: bool = False
    replay_gaps: int = 0


@dataclass(frozen=True, slots=True)
class WarningView:
    """An active structured warning (`warning_raised` not yet cleared), keyed by its id."""

    warning_id: LogicalId
    code: str
    """A `WarningCode` value (kept as the wire string: unknown future codes are kept too)."""
    reason_code: ReasonCode | None
    model_id: LogicalId | None = None
    stage_id: LogicalId | None = None
    raised_wall_ns: int = 0


@dataclass(frozen=True, slots=True)
class ReducerCounters:
    rejected_transitions: int = 0
    duplicate_transitions: int = 0
    evicted_models: int = 0
    evicted_sessions: int = 0
    evicted_requests: int = 0
    evicted_stages: int = 0
    evicted_devices: int = 0
    evicted_recent: int = 0


def _frozen(mapping: dict[Any, Any] | None = None) -> Mapping[Any, Any]:
    return MappingProxyType(mapping or {})


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """Everything the reducer knows. Replace, never mutate (reducer.immutable.evolve)."""

    runtime: RuntimeState = RuntimeState.STARTING
    native_mode: NativeMode = NativeMode.UNKNOWN
    native_features: int | None = None
    node: NodeState = NodeState.STARTING
    node_lanes: int = 0
    """Lanes of the models that serve (the node's request capacity; ``node_capacity_changed``)."""
    node_pressure: bool = False
    """A serving model's KV or a device's memory is under pressure
    (``node_resource_pressure_changed``)."""
    models: Mapping[LogicalId, ModelView] = field(default_factory=_frozen)
    stages: Mapping[LogicalId, StageView] = field(default_factory=_frozen)
    topologies: Mapping[LogicalId, TopologyView] = field(default_factory=_frozen)
    sessions: Mapping[LogicalId, SessionView] = field(default_factory=_frozen)
    requests: Mapping[LogicalId, RequestView] = field(default_factory=_frozen)
    devices: Mapping[LogicalId, DeviceView] = field(default_factory=_frozen)
    recent_requests: tuple[RequestOutcome, ...] = ()
    recent_events: tuple[Event, ...] = ()
    event_system: EventSystemView = field(default_factory=EventSystemView)
    warnings: Mapping[LogicalId, WarningView] = field(default_factory=_frozen)
    degraded_modes: frozenset[str] = frozenset()
    """`DegradedMode` values entered and not exited."""
    counters: ReducerCounters = field(default_factory=ReducerCounters)


def queue_depth(state: RuntimeView, model_id: LogicalId) -> int:
    return sum(
        1
        for r in state.requests.values()
        if r.model_id == model_id and r.state in (RequestState.RECEIVED, RequestState.QUEUED)
    )


def lanes_in_use(state: RuntimeView, model_id: LogicalId) -> int:
    return sum(
        1
        for r in state.requests.values()
        if r.model_id == model_id
        and r.state in (RequestState.ADMITTED, RequestState.PREFILL, RequestState.DECODE)
    )


def topology_stages(state: RuntimeView, topology_id: LogicalId) -> tuple[StageView, ...]:
    """The stages the reducer knows in ``topology_id``, by stage index (then id)."""
    return tuple(
        sorted(
            (s for s in state.stages.values() if s.topology_id == topology_id),
            key=lambda s: (s.stage_index if s.stage_index is not None else 1 << 30, s.stage_id),
        )
    )


def available_models(state: RuntimeView) -> frozenset[LogicalId]:
    return frozenset(m.model_id for m in state.models.values() if m.state in SERVING_MODEL_STATES)
