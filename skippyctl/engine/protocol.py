"""The engine protocol: every message of the control channel as a frozen, slotted type.

Two tagged unions, one per direction:

- :data:`Command` (host → engine, tag key ``op``): :class:`Load`, :class:`Generate`,
  :class:`Cancel`, :class:`DropSession`, :class:`Ping`, :class:`Shutdown`,
  :class:`SaveSessions`.
- :data:`EngineMessage` (engine → host, tag key ``msg``): :class:`Hello`, :class:`Pong`,
  :class:`ProtocolError`, the load replies (:class:`LoadBegun`, :class:`LoadReturned`,
  :class:`ContextBegun`, :class:`ContextReturned`) and the serving messages
  (:data:`ServingMessage`: generation observations, :class:`GenDone`, :class:`Kv`,
  :class:`SessionChanged`).

:func:`encode` turns a message into the JSON payload of one frame; :func:`decode_command` and
:func:`decode_engine_message` are the same table-driven decoder for each direction. The types are
the single definition of the wire: a field's name is its key, its annotation says what a decoder
accepts (exact JSON types, enum values, nested records), and a field whose default is ``None`` is
absent from the payload while it is ``None``. Decoding is strict — an unknown tag, a missing,
unknown or ill-typed field, a message of the other direction — and raises
:class:`MalformedMessage`, never anything else; the error keeps the tag and the request or
operation id when the payload had them, so the receiver can end that one command. The wire format
is internal to one host and its engines (not a public contract); it changes with this module.

Privacy (ARCHITECTURE.md section 4): completion text travels only in :attr:`GenText.text`, prompt
text only in :class:`Generate`, a model path only in :class:`Load` — none of them ever reaches an
event. Every other message carries counts, durations and logical ids only; no token ids.

Serving messages (sent by ``engine/decode_core.py``; with serving events off only
:class:`GenText` and :class:`GenDone`):

- :class:`GenStarted` once a tokenized request got a lane (:class:`CacheResult` of its session).
- :class:`GenPrefillProgress` (tokens to prefill, reuse excluded) at most every 250 ms per
  request, none for a shorter prefill; :class:`GenPrefillDone` and :class:`GenFirstToken` (submit
  to first sampled token) are held back until the first token's text went out, and sent before
  :class:`GenDone` if the request ends first.
- :class:`GenText`: new completion text, whole UTF-8 characters only, stop strings held back and
  cut; at most one per committed token (one per request per decode step, unless the step
  committed proposed tokens too).
- :class:`GenProgress` at most every 500 ms per request; :class:`GenToken` only with debug token
  events, one per sampled token (its index and the ms since the previous one), never the token.
- :class:`GenDone`: exactly one per submitted request, with the request's figures.
- :class:`Kv`: ``initialized`` once; ``pressure_crossed``/``pressure_cleared`` with hysteresis
  over the cells the lanes can use; ``approaching_limit`` once per request with its lane's numbers.
- :class:`SessionChanged`: ``created`` (tokens 0), ``reused``/``trimmed`` (tokens kept),
  ``evicted`` (tokens it held; reason ``lane_needed``, ``pressure`` or the host's drop reason),
  ``restored`` (tokens read back from the session's state file).
- :class:`StateImported` / :class:`StateExported`: one per session file of ``Load.restore`` /
  ``Shutdown.save`` (``engine/kv_state.py``); counts, bytes and a duration, never a path.

A split model's engine also sends :class:`Link` (``engine/links.py``): the round-trip figures of
its connection to one stage, after each probe of it (a few right after the model loaded, before
``load_returned``; then at most one per stage per probe interval). It goes to the model's
topology on the host, not to the serving listener, and is sent with serving events off too.

Resource messages (:data:`ResourceMessage`, sent with serving events off too, never to the
serving listener): during a load :class:`Backends` (ggml's registry and devices) first, then
:class:`CpuFallback` when GPU layers were asked for and there is no GPU, :class:`LoadPhase` at
each phase the engine sees between its llama.cpp calls, :class:`AllocationRefused` when the
context cannot get its memory and :class:`MemoryAllocated` once it has — each before the
``load_returned`` / ``context_returned`` it precedes. While serving, :class:`ComputeFailed` for a
``llama_decode`` that failed. Device names are short registry names (``CPU``), never
descriptions or handles.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Union, cast, get_args, get_origin, get_type_hints

import orjson

from skippyctl.config.load_options import LoadOptions
from skippyctl.engine.text import ChatMessage
from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import CacheResult, GenerationOutcome, ReasonCode

Payload = dict[str, Any]


class MalformedMessage(ValueError):
    """A frame or payload the receiver cannot use (oversize, not JSON, not a known message).

    The whole frame was consumed: the channel is still in step. ``tag`` and ``correlation_id``
    (a request or operation id) are set when the payload had them, so the one command or request
    it belongs to can be ended."""

    def __init__(
        self, problem: str, tag: str | None = None, correlation_id: str | None = None
    ) -> None:
        super().__init__(problem)
        self.tag = tag
        self.correlation_id = correlation_id


class UnencodableMessage(ValueError):
    """A message JSON cannot carry (e.g. an integer beyond 64 bits); nothing was written."""


# ------------------------------------------------------------------------- host → engine


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling fields of a request as the host received them. Deliberately unvalidated
    here: the engine validates them into :class:`~skippyctl.engine.sampling.SamplingParams` and
    fails that one request when they are out of range."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One ggml RPC stage of a split load: where it listens and its ``tensor_split`` share.

    The endpoint is internal to the host and its engine (like a model path), never an event."""

    endpoint: str
    """``a.b.c.d:port``; the engine registers it with ``ggml_backend_rpc_add_server``."""
    split: float
    """This stage's proportion of ``llama_model_params.tensor_split`` (runtime/topology.py)."""


@dataclass(frozen=True, slots=True)
class SessionFile:
    """A session's KV state file (``engine/kv_state.py``): the session's opaque id and where its
    file is. The path is internal to the host and its engine (like a model path), never an
    event; the file name carries the opaque id only."""

    session: str
    path: str


@dataclass(frozen=True, slots=True)
class Load:
    """Load a model and create its serving context (replies: load_begun, load_returned, then
    context_begun, context_returned when the model loaded)."""

    operation_id: str
    native_operation: int
    serving_operation: int
    """Native scope the engine keeps open while it serves (its abort callback watches it)."""
    options: LoadOptions
    """What the load asked for, resolved by the host: ``model`` (and ``draft``) an absolute
    path, ``plugins`` the host's own first, ``gpu_layers`` what the topology assembled (a split
    load offloads every layer). ``ctx``/``lanes``/``threads`` None: the engine sizes them
    (engine/geometry.py)."""
    stage_plan: tuple[StagePlan, ...] = ()
    """A split load: the model's layers go to these RPC stages (in order, layer split, every
    layer offloaded); empty: a load in this process."""
    restore: tuple[SessionFile, ...] = ()
    """Session states to restore into lanes once the context exists, before any request
    (most recently used first; one :class:`StateImported` each)."""
    state_max_bytes: int = 0
    """The largest state file the engine reads (the host's cap); 0 with nothing to restore."""


@dataclass(frozen=True, slots=True)
class Generate:
    """One generation; exactly one of ``prompt`` / ``messages`` (checked by the engine)."""

    request_id: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    session: str | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    sampling: Sampling = Sampling()
    timeout_s: float | None = None
    """Left of the request's deadline when it was sent; the engine keeps it from receipt."""


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str


@dataclass(frozen=True, slots=True)
class DropSession:
    session: str
    reason: str = "dropped"


@dataclass(frozen=True, slots=True)
class Ping:
    """Answered with :class:`Pong` by the engine's main thread (never its decode thread)."""

    seq: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """End the engine. With ``save``, first write the KV state of each named session that holds
    a lane (most recently used first, while they fit in ``save_budget_bytes``; one
    :class:`StateExported` each), then exit."""

    save: tuple[SessionFile, ...] = ()
    save_budget_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SaveSessions:
    """Write the KV state of each named session while the model keeps serving (on request): as
    ``Shutdown.save``, one :class:`StateExported` per named session (``reason``
    ``invalid_configuration`` for one that holds no idle lane: busy, or no KV)."""

    save: tuple[SessionFile, ...]
    budget_bytes: int


Command = Load | Generate | Cancel | DropSession | Ping | Shutdown | SaveSessions


# ------------------------------------------------------------------------- engine → host


class KvChange(StrEnum):
    INITIALIZED = "initialized"
    PRESSURE_CROSSED = "pressure_crossed"
    PRESSURE_CLEARED = "pressure_cleared"
    APPROACHING_LIMIT = "approaching_limit"


class SessionChange(StrEnum):
    CREATED = "created"
    REUSED = "reused"
    TRIMMED = "trimmed"
    """Cached tokens beyond the common prefix were cut, or the lane was reset after a failure."""
    EVICTED = "evicted"
    RESTORED = "restored"
    """The session's KV was read back from its state file into the lane (tokens restored)."""


@dataclass(frozen=True, slots=True)
class Hello:
    pid: int
    native: bool
    native_problem: str | None
    features: int


@dataclass(frozen=True, slots=True)
class Pong:
    seq: int


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """The engine could not use a frame the host sent (it carries on); ``count`` so far."""

    count: int


@dataclass(frozen=True, slots=True)
class LoadBegun:
    operation_id: str


@dataclass(frozen=True, slots=True)
class LoadReturned:
    operation_id: str
    ok: bool
    duration_ms: float | None = None
    model_size_bytes: int | None = None
    parameters: int | None = None
    layers: int | None = None
    """``llama_model_n_layer``: the model's repeating layers."""
    context_train_tokens: int | None = None
    """``llama_model_n_ctx_train``: the context the model was trained with."""
    vocab_size: int | None = None
    """``llama_vocab_n_tokens`` of the model's vocabulary."""
    files: int | None = None
    """GGUF files llama.cpp opened: a split set's ``split.count``, else 1."""


@dataclass(frozen=True, slots=True)
class ContextBegun:
    operation_id: str


@dataclass(frozen=True, slots=True)
class ContextReturned:
    operation_id: str
    ok: bool
    context_tokens: int | None = None
    lanes: int | None = None
    context_tokens_per_lane: int | None = None
    reason: ReasonCode | None = None
    """Only when not ``ok`` and the engine knows why: ``out_of_memory`` (the KV cache it would
    need does not fit the memory available), ``resource_allocation_failure`` (llama.cpp
    returned no context)."""
    batch_tokens: int | None = None
    """``llama_n_batch``: the most tokens one ``llama_decode`` call takes."""
    threads: int | None = None
    """``llama_n_threads``: the threads that decode for the context."""


@dataclass(frozen=True, slots=True)
class GenStarted:
    request_id: str
    lane: int
    session: str | None
    prompt_tokens: int
    reused_tokens: int
    cache: CacheResult


@dataclass(frozen=True, slots=True)
class GenText:
    request_id: str
    text: str


@dataclass(frozen=True, slots=True)
class GenPrefillProgress:
    request_id: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class GenPrefillDone:
    request_id: str
    tokens: int
    ms: float


@dataclass(frozen=True, slots=True)
class GenFirstToken:
    request_id: str
    ttft_ms: float


@dataclass(frozen=True, slots=True)
class GenProgress:
    request_id: str
    generated: int


@dataclass(frozen=True, slots=True)
class GenToken:
    request_id: str
    index: int
    step_ms: float


@dataclass(frozen=True, slots=True)
class GenDone:
    """The one terminal of a submitted request: how it ended and what the engine measured.

    ``figures`` (:class:`~skippyctl.events.figures.GenerationFigures`, a nested record on the
    wire) goes unchanged to the request's receipt, its terminal events and the serving plugins.
    A generation that fills its lane ends completed/length with reason ``context_exhausted``; a
    prompt longer than a lane fails with it before any decode."""

    request_id: str
    outcome: GenerationOutcome
    reason: ReasonCode | None
    stop_reason: StopReason
    figures: GenerationFigures

    @classmethod
    def refused(cls, request_id: str, reason: ReasonCode) -> GenDone:
        """The terminal of a request that never started (nothing counted, no time spent)."""
        return cls(
            request_id,
            GenerationOutcome.FAILED,
            reason,
            StopReason.ERROR,
            GenerationFigures(prefill_ms=0.0, decode_ms=0.0),
        )


@dataclass(frozen=True, slots=True)
class Kv:
    event: KvChange
    cells_used: int
    cells_total: int
    request_id: str | None = None
    """Only with ``approaching_limit``: the request whose lane it is."""


@dataclass(frozen=True, slots=True)
class SessionChanged:
    session: str
    event: SessionChange
    lane: int
    tokens: int
    reason: str | None = None
    """Only with ``evicted``: a short snake_case word."""


@dataclass(frozen=True, slots=True)
class Link:
    """Round trips of the engine's connection to stage ``stage`` (its index in the load's
    ``stages``), over the last ``samples`` probes (``engine/links.py``)."""

    stage: int
    rtt_ms: float
    """Median."""
    p95_ms: float
    jitter_ms: float
    """Mean absolute difference of consecutive round trips."""
    samples: int = 1
    last_ms: float | None = None
    """The probe that sent this message."""


@dataclass(frozen=True, slots=True)
class StateExported:
    """The outcome of writing one session's KV state file (``Shutdown.save``). ``tokens`` and
    ``size_bytes`` are what was written (or would have been); ``reason`` only when not ``ok``:
    ``reservation_exhausted`` (over the budget), ``artifact_io_failure`` (the write failed),
    ``internal_runtime_failure`` (llama.cpp gave no state)."""

    session: str
    ok: bool
    tokens: int
    size_bytes: int
    ms: float
    reason: ReasonCode | None = None


@dataclass(frozen=True, slots=True)
class StateImported:
    """The outcome of restoring one session's KV state file (``Load.restore``); ``reason`` only
    when not ``ok``: ``incompatible_abi_or_feature_set`` (another model or geometry, or
    llama.cpp refused it), ``artifact_io_failure`` (unreadable, truncated, altered),
    ``reservation_exhausted`` (no free lane)."""

    session: str
    ok: bool
    tokens: int
    size_bytes: int
    ms: float
    reason: ReasonCode | None = None


class LoadPhaseName(StrEnum):
    """The load phases the engine observes between its llama.cpp calls (at most 15 characters:
    the dashboard's phase column)."""

    WEIGHTS_LOADED = "weights loaded"
    """``llama_model_load_from_file`` returned a model."""
    ALLOCATING = "allocating ctx"
    """``llama_init_from_model`` is creating the context: KV cache and compute buffers."""
    CONTEXT_READY = "context ready"
    """The context exists, its buffers are allocated and its lanes are set up."""


@dataclass(frozen=True, slots=True)
class LoadPhase:
    """The load of ``operation_id`` entered ``phase``."""

    operation_id: str
    phase: LoadPhaseName


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """One compute device of the engine's ggml registry: its short registry name (``CPU``),
    kind (``cpu``, ``gpu`` …) and what it reports about its memory; ``selected`` when the load
    places work on it."""

    name: str
    kind: str
    memory_free_bytes: int
    memory_total_bytes: int
    selected: bool


@dataclass(frozen=True, slots=True)
class Backends:
    """ggml's backends as the engine found them when a load began (``llama_backend_init`` ran
    at engine start): ``backends`` registries, the devices it can use (RPC stages excluded:
    their topology reports them). ``ok`` is False when no device could be found."""

    operation_id: str
    ok: bool
    backends: int
    devices: tuple[DeviceReport, ...] = ()


@dataclass(frozen=True, slots=True)
class BufferReport:
    """Bytes held on one device once the context exists: weights, KV cache, compute."""

    device: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryAllocated:
    """Where a loaded model's memory went, per device. ``exact``: llama.cpp's own per-buffer
    figures (``native/backends.py``); otherwise weights are ``llama_model_size`` and KV the
    geometry's estimate, compute unknown (0), all on the model's device."""

    operation_id: str
    exact: bool
    buffers: tuple[BufferReport, ...]


@dataclass(frozen=True, slots=True)
class AllocationRefused:
    """A load's context could not get its memory: the engine's own pre-check (``requested``
    KV bytes over ``available``: ``out_of_memory``) or llama.cpp returning no context
    (``resource_allocation_failure``)."""

    operation_id: str
    device: str
    requested_bytes: int
    available_bytes: int | None
    reason: ReasonCode


@dataclass(frozen=True, slots=True)
class CpuFallback:
    """The load asked for ``gpu_layers`` offloaded layers and no GPU device exists: the model
    runs on the CPU."""

    operation_id: str
    gpu_layers: int
    device: str


@dataclass(frozen=True, slots=True)
class ComputeFailed:
    """``llama_decode`` returned ``return_code`` (not 0, not an abort) for a batch of
    ``requests`` requests; ``reason`` maps the code (``engine/decode_core.py``)."""

    return_code: int
    reason: ReasonCode
    requests: int


@dataclass(frozen=True, slots=True)
class PluginReported:
    """A serving plugin's health changed (``skippyctl.plugins.link.PluginReport``): ``kind``
    ``loaded`` / ``load_failed`` / ``failed`` / ``restarted`` / ``disabled``; ``reason`` a short
    word (``timeout``, ``crashed``, ``raised``, ``invalid_tokens`` …); ``plugin`` its short name
    (a basename or an entry-point name, never a path)."""

    plugin: str
    kind: str
    reason: str
    failures: int


ResourceMessage = (
    LoadPhase | Backends | MemoryAllocated | AllocationRefused | CpuFallback | ComputeFailed
)
"""What the engine observed about its load and its resources; the supervisor turns each into
events (``runtime/resource_events.py``), in order with the load's return values."""

RequestObservation = (
    GenStarted
    | GenText
    | GenPrefillProgress
    | GenPrefillDone
    | GenFirstToken
    | GenProgress
    | GenToken
)
"""What the engine says about one running request before its :class:`GenDone`."""
ServingMessage = RequestObservation | GenDone | Kv | SessionChanged | StateExported | StateImported
"""Everything the supervisor hands to the engine's listener (the scheduler)."""
EngineMessage = (
    Hello
    | Pong
    | ProtocolError
    | LoadBegun
    | LoadReturned
    | ContextBegun
    | ContextReturned
    | Link
    | PluginReported
    | ServingMessage
    | ResourceMessage
)
Message = Command | EngineMessage


# ------------------------------------------------------------------------- the codec


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    convert: Callable[[object], object]
    required: bool
    omit_if_none: bool


@dataclass(frozen=True, slots=True)
class _Spec:
    cls: type
    key: str
    """The tag key: ``op`` for commands, ``msg`` for engine messages."""
    tag: str
    fields: tuple[_Field, ...]
    names: tuple[str, ...]
    omit_if_none: tuple[str, ...]
    by_name: dict[str, _Field]


def _exact(kind: type) -> Callable[[object], object]:
    def convert(value: object) -> object:
        # bool is an int subclass, and an int is not a str: only the exact JSON type passes.
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}")
        return value

    return convert


def _float(value: object) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise TypeError("expected a number")


def _enum(kind: type[StrEnum]) -> Callable[[object], object]:
    def convert(value: object) -> object:
        if type(value) is not str:
            raise TypeError(f"expected a {kind.__name__} value")
        return kind(value)  # ValueError for a value outside the enum

    return convert


def _optional(inner: Callable[[object], object]) -> Callable[[object], object]:
    return lambda value: None if value is None else inner(value)


def _array(value: object) -> list[object]:
    if type(value) is not list:
        raise TypeError("expected an array")
    return value


def _converter(hint: object) -> Callable[[object], object]:
    """The decoder of one annotated field; TypeError at import for a type the wire cannot take."""
    if hint is float:
        return _float
    if hint in (str, int, bool):
        assert isinstance(hint, type)
        return _exact(hint)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _record(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return _optional(_converter(inner))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        return lambda value: tuple(item(v) for v in _array(value))
    if origin is tuple and Ellipsis not in args:
        items = tuple(_converter(a) for a in args)

        def fixed(value: object) -> tuple[object, ...]:
            values = _array(value)
            if len(values) != len(items):
                raise TypeError(f"expected {len(items)} items")
            return tuple(c(v) for c, v in zip(items, values, strict=True))

        return fixed
    raise TypeError(f"no wire form for {hint!r}")


def _fields_of(cls: type) -> tuple[_Field, ...]:
    hints = get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append(
            _Field(f.name, _converter(hints[f.name]), required, not required and f.default is None)
        )
    return tuple(fields)


def _build(cls: type, fields: tuple[_Field, ...], payload: dict[str, object]) -> object:
    values = {}
    for f in fields:
        if f.name in payload:
            values[f.name] = f.convert(payload[f.name])
        elif f.required:
            raise KeyError(f.name)
    return cls(**values)


def _record(cls: type) -> Callable[[object], object]:
    """A nested record (ChatMessage, Sampling): a JSON object with exactly its fields."""
    fields = _fields_of(cls)
    names = {f.name for f in fields}

    def convert(value: object) -> object:
        if type(value) is not dict:
            raise TypeError(f"expected a {cls.__name__} object")
        if not value.keys() <= names:
            raise TypeError(f"unknown {cls.__name__} field")
        return _build(cls, fields, value)

    return convert


def _spec(key: str, tag: str, cls: type) -> _Spec:
    fields = _fields_of(cls)
    return _Spec(
        cls,
        key,
        tag,
        fields,
        tuple(f.name for f in fields),
        tuple(f.name for f in fields if f.omit_if_none),
        {f.name: f for f in fields},
    )


_COMMANDS: Final = {
    s.tag: s
    for s in (
        _spec("op", "load", Load),
        _spec("op", "generate", Generate),
        _spec("op", "cancel", Cancel),
        _spec("op", "drop_session", DropSession),
        _spec("op", "ping", Ping),
        _spec("op", "shutdown", Shutdown),
        _spec("op", "save_sessions", SaveSessions),
    )
}
_ENGINE_MESSAGES: Final = {
    s.tag: s
    for s in (
        _spec("msg", "hello", Hello),
        _spec("msg", "pong", Pong),
        _spec("msg", "protocol_error", ProtocolError),
        _spec("msg", "load_begun", LoadBegun),
        _spec("msg", "load_returned", LoadReturned),
        _spec("msg", "context_begun", ContextBegun),
        _spec("msg", "context_returned", ContextReturned),
        _spec("msg", "gen_started", GenStarted),
        _spec("msg", "gen_text", GenText),
        _spec("msg", "gen_prefill_progress", GenPrefillProgress),
        _spec("msg", "gen_prefill_done", GenPrefillDone),
        _spec("msg", "gen_first_token", GenFirstToken),
        _spec("msg", "gen_progress", GenProgress),
        _spec("msg", "gen_token", GenToken),
        _spec("msg", "gen_done", GenDone),
        _spec("msg", "kv", Kv),
        _spec("msg", "session", SessionChanged),
        _spec("msg", "link", Link),
        _spec("msg", "state_exported", StateExported),
        _spec("msg", "state_imported", StateImported),
        _spec("msg", "load_phase", LoadPhase),
        _spec("msg", "backends", Backends),
        _spec("msg", "memory_allocated", MemoryAllocated),
        _spec("msg", "allocation_refused", AllocationRefused),
        _spec("msg", "cpu_fallback", CpuFallback),
        _spec("msg", "compute_failed", ComputeFailed),
        _spec("msg", "plugin_reported", PluginReported),
    )
}
_BY_TYPE: Final[dict[type, _Spec]] = {
    s.cls: s for s in (*_COMMANDS.values(), *_ENGINE_MESSAGES.values())
}
_CORRELATION_FIELDS: Final = ("request_id", "operation_id")
TAGS: Final[Mapping[type, str]] = MappingProxyType(
    {cls: spec.tag for cls, spec in _BY_TYPE.items()}
)
"""Each message type's wire tag (the value of its ``op`` or ``msg`` key)."""


def tag_of(message: Message) -> str:
    """The wire tag of ``message`` (``"gen_done"``, ``"load"`` …)."""
    return _BY_TYPE[type(message)].tag


def encode(message: Message) -> bytes:
    """The JSON payload of one frame for ``message``. :class:`UnencodableMessage` for a value
    JSON cannot carry (an integer beyond 64 bits); nothing else raises for a well-typed message."""
    spec = _BY_TYPE[type(message)]
    payload: Payload = {spec.key: spec.tag}
    for name in spec.names:
        payload[name] = getattr(message, name)
    for name in spec.omit_if_none:
        if payload[name] is None:
            del payload[name]
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError as error:
        raise UnencodableMessage(str(error)) from error


def decode_command(payload: bytes) -> Command:
    """The command in one frame's payload; :class:`MalformedMessage` for anything else."""
    # _decode built one of _COMMANDS' classes: exactly the members of Command.
    return cast(Command, _decode(payload, "op", _COMMANDS))


def decode_engine_message(payload: bytes) -> EngineMessage:
    """The engine message in one frame's payload; :class:`MalformedMessage` for anything else."""
    # _decode built one of _ENGINE_MESSAGES' classes: exactly the members of EngineMessage.
    return cast(EngineMessage, _decode(payload, "msg", _ENGINE_MESSAGES))


def _decode(payload: bytes, key: str, specs: dict[str, _Spec]) -> object:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as error:
        raise MalformedMessage("control frame is not JSON") from error
    if type(value) is not dict:
        raise MalformedMessage("control message is not an object")
    tag = value.pop(key, None)  # a fresh dict: what is left are the fields
    spec = specs.get(tag) if type(tag) is str else None
    if spec is None:
        raise MalformedMessage(f"unknown control message {key}")
    try:
        if len(value) == len(spec.fields):
            # Every field present (what the encoder sends on the per-token path): nothing to
            # default, and a field the type lacks would take a known one's place and fail its
            # lookup (KeyError).
            return spec.cls(*[f.convert(value[f.name]) for f in spec.fields])
        if not value.keys() <= spec.by_name.keys():
            raise KeyError("unknown field")
        return _build(spec.cls, spec.fields, value)
    except (KeyError, TypeError, ValueError) as error:
        # A fixed phrase: never echo the payload (it may hold prompt text).
        correlation = None
        for name in _CORRELATION_FIELDS:
            if name in spec.by_name and type(candidate := value.get(name)) is str:
                correlation = candidate
        raise MalformedMessage(f"ill-formed {spec.tag} message", spec.tag, correlation) from error
