"""The engine → host half of the engine protocol (``engine/protocol.py``): every message the
engine sends on the control channel, as a frozen, slotted type, and their unions
(:data:`EngineMessage`, tag key ``msg`` on the wire; :data:`ServingMessage`,
:data:`RequestObservation`, :data:`ResourceMessage`).

Privacy (ARCHITECTURE.md section 4): completion text travels only in :attr:`GenText.text`; every
other message carries counts, durations and logical ids only; no token ids.

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

from dataclasses import dataclass
from enum import StrEnum

from skippyctl.config.tool_call_format import ToolCallFormat
from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import CacheResult, GenerationOutcome, ReasonCode


class KvChange(StrEnum):
    INITIALIZED = "initialized"
    PRESSURE_CROSSED = "pressure_crossed"
    PRESSURE_CLEARED = "pressure_cleared"
    APPROACHING_LIMIT = "approaching_limit"
    RESET = "reset"
    """A lane's whole KV was emptied because it could no longer be trusted (a failed or
    aborted decode left part of a batch in it)."""


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
    # -- which chat template serves (jinja): facts about the template, never its text
    chat_template_source: str | None = None
    """``model`` (the GGUF's), ``override`` (``load --chat-template``) or ``builtin`` (ChatML)."""
    chat_template_sha256: str | None = None
    """The first 16 hex digits of the serving default template's SHA-256."""
    chat_template_tool_use: bool | None = None
    """The GGUF also carries ``tokenizer.chat_template.tool_use`` (for requests with tools)."""


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
    flash_attention: bool | None = None
    """Whether the context uses flash attention (``load --flash-attn``); None when llama.cpp
    chose (a GPU with 'auto')."""
    batch_invariant: bool | None = None
    """Whether a row decodes bit for bit the same whatever is beside it (``engine/kernels.py``:
    on the CPU, without flash attention, on the batch-invariant kernels)."""
    pooling: str | None = None
    """An embedding model's pooling (``mean``, ``cls``, ``last``, ``rank``: llama.cpp's, from the
    GGUF); None for a generative model. A pooling model serves embeddings, not generation."""
    # -- tool calls
    tool_call_format: ToolCallFormat | None = None
    """The tool-call form the model's chat template teaches (``config/tool_call_format.py``);
    None when it teaches none. The host reads chat replies for calls accordingly."""


@dataclass(frozen=True, slots=True)
class GenStarted:
    request_id: str
    lane: int
    session: str | None
    prompt_tokens: int
    reused_tokens: int
    cache: CacheResult


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One candidate at a position: its text's bytes and its log-probability."""

    piece: tuple[int, ...]
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability under the model's raw logits at its position (as
    llama-server computes it) and the most likely candidates there."""

    piece: tuple[int, ...]
    """The token's text as bytes (a token can end inside a UTF-8 character)."""
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class GenText:
    request_id: str
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    """For a request that asked for them: the tokens whose text is ``text`` (or that were held
    back until now), in order; None (omitted on the wire) otherwise."""
    framed: bool | None = None
    """True: ``text`` is the rest of a chunk the engine wrote to the client's connection
    itself (``AttachStream``) and the socket did not take, each byte as one Latin-1 character,
    for the host to write as it is before anything else; the engine writes no more after it.
    None (omitted on the wire) otherwise."""


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
class GenSpecSwitched:
    """``--spec auto``: a request's lane started or stopped verifying its proposals."""

    request_id: str
    speculating: bool
    acceptance_pct: float
    """The lane's per-token acceptance estimate when it switched."""
    lanes: int
    """Lanes decoding in the step it switched in."""


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
    detail: str | None = None
    """Why a chat was refused, for its requester only (a chat template's own message, which
    may quote the request): like completion text, never in an event."""
    wrote_stream: bool | None = None
    """True when the engine wrote the request's text to the client's connection itself
    (``AttachStream``); None (omitted on the wire) otherwise."""
    session_tokens: int | None = None
    """A session's request: the tokens its session holds in KV once it ended (its lane's
    sequence); None (omitted on the wire) for a request without a session, or one whose
    session was dropped while it ran."""

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
    """Only with ``evicted``: a short snake_case word (``lane_needed``, ``pressure`` or the
    host's ``DropSession`` reason)."""
    idle_ms: float | None = None
    """Only with ``evicted``: how long the session's lane had been idle."""


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
    DRAFT_LOADED = "draft loaded"
    """``llama_model_load_from_file`` returned the ``--draft`` model (before the contexts: its
    KV counts in the context plan and the memory check)."""


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
class DeviceMemory:
    """A device the model serves on crossed its low-memory mark (``low``: below it now) or came
    back above its recovery mark; ggml's own free and total figures for it."""

    device: str
    memory_free_bytes: int
    memory_total_bytes: int
    low: bool


@dataclass(frozen=True, slots=True)
class ComputeFailed:
    """``llama_decode`` returned ``return_code`` (not 0) for a batch of ``requests``
    requests; ``reason`` maps the code (``engine/decode_core.py``): ``cancellation`` when the
    engine's abort callback stopped it (2), else the failure's. The engine goes on either way."""

    return_code: int
    reason: ReasonCode
    requests: int


@dataclass(frozen=True, slots=True)
class PluginReported:
    """A serving plugin's health changed
    (``skippyctl.plugins.sidecar_supervisor.PluginReport``): ``kind``
    ``loaded`` / ``load_failed`` / ``failed`` / ``restarted`` / ``disabled``; ``reason`` a short
    word (``crashed``, ``raised``, ``protocol_error``, ``activate_failed`` …); ``plugin`` its
    short name (a basename or an entry-point name, never a path)."""

    plugin: str
    kind: str
    reason: str
    failures: int
    operation_id: str | None = None
    """The load's operation, for a report made while the model loads (the plugin's ``loaded``
    or ``load_failed``): its event is part of that load. None once the load returned (an
    ended operation's events are not dispatched after its terminal)."""


@dataclass(frozen=True, slots=True)
class PluginCounters:
    """A serving plugin's delivery counters (``skippyctl.plugins.link``), sent when they
    changed, at most every couple of seconds: messages ``delivered`` to its sidecar,
    ``deferred`` commits (they went with a later message), messages ``dropped`` (its queue was
    full), proposals discarded ``late`` (deadline exceeded) and for the other discard reasons,
    and its ``failures``. Counts only."""

    plugin: str
    delivered: int
    deferred: int
    dropped: int
    late: int
    failures: int
    discarded_invalid_token_count: int
    discarded_invalid_token_id: int
    discarded_position_mismatch: int
    discarded_execution_failed: int


ResourceMessage = (
    LoadPhase
    | Backends
    | MemoryAllocated
    | AllocationRefused
    | CpuFallback
    | ComputeFailed
    | DeviceMemory
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
    | GenSpecSwitched
)
"""What the engine says about one running request before its :class:`GenDone`."""


@dataclass(frozen=True, slots=True)
class VocabularyAnswer:
    """The answer to a ``Tokenize`` or ``Detokenize`` (the caller's own text and tokens, so only
    to the caller: never an event). ``problem`` says why it failed (a fixed phrase)."""

    request_id: str
    tokens: tuple[int, ...] = ()
    pieces: tuple[tuple[int, ...], ...] | None = None
    """With ``with_pieces``: each token's text as bytes."""
    content: str | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingAnswer:
    """The answer to an ``Embed``: one pooled, L2-normalised vector per input, in order, and the
    tokens evaluated (the caller's own, so only to the caller: never an event). ``problem`` says
    why it failed (a fixed phrase, counts only) and ``reason`` its reason code."""

    request_id: str
    vectors: tuple[tuple[float, ...], ...] = ()
    prompt_tokens: int = 0
    problem: str | None = None
    reason: ReasonCode | None = None


ServingMessage = (
    RequestObservation
    | GenDone
    | Kv
    | SessionChanged
    | StateExported
    | StateImported
    | VocabularyAnswer
    | EmbeddingAnswer
)
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
    | PluginCounters
    | ServingMessage
    | ResourceMessage
)
