"""The host → engine half of the engine protocol (``engine/protocol.py``): every command the host
sends on the control channel, as a frozen, slotted type, and their union :data:`Command` (tag key
``op`` on the wire).

Privacy (ARCHITECTURE.md section 4): prompt text (a prompt, or a chat's messages, tools and
template variables) travels only in :class:`Generate`, a model path and a chat template's text
only in :class:`Load` (and session file paths only in :class:`SessionFile`) — none of them ever
reaches an event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skippyctl.config.load_options import LoadOptions
from skippyctl.engine.chat_template import ChatMessage


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
    # -- penalties and constrained output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    grammar: str | None = None
    """GBNF text (request text: never in an event)."""
    json_schema: str | None = None
    """JSON schema text; the engine turns it into a grammar as llama.cpp does."""
    json_schema_tags: tuple[str, str] | None = None
    """Literal text around the JSON (a Hermes tool call's tags); None: the JSON alone."""
    logprobs: int | None = None
    """Report each token's log-probability and this many top candidates (0..20); None: off."""


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
    chat_template_text: str | None = None
    """``load --chat-template``: the file's text as the host read and checked it (the options'
    ``chat_template`` path stays with the host)."""


@dataclass(frozen=True, slots=True)
class Generate:
    """One generation; exactly one of ``prompt`` / ``messages`` (checked by the engine)."""

    request_id: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    # -- chat template inputs (jinja): request text like the messages, never in an event
    tools: tuple[dict[str, Any], ...] | None = None
    """OpenAI tool definitions ({type: function, function: {...}}) for the template."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra template variables (e.g. ``enable_thinking``), over the standard ones."""
    # -- end chat template inputs
    session: str | None = None
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    sampling: Sampling = Sampling()
    timeout_s: float | None = None
    """Left of the request's deadline when it was sent; the engine keeps it from receipt."""
    hold_text: bool = False
    """Hold the text until the host says who writes the stream: the engine itself
    (``AttachStream``) or the host (``ReleaseText``). Ignored for a request that asked for
    log-probabilities (its text always goes to the host)."""


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str


@dataclass(frozen=True, slots=True)
class AttachStream:
    """Write the text of a request sent with ``hold_text`` to its client's connection yourself,
    the text held until now first: the connection's descriptor went ahead of this command on
    the engine's stream socket. Refused (the descriptor closed) for a request that is not
    holding its text: it has ended, or its text goes to the host. ``head`` and ``tail``: the SSE
    event around a chunk's text (its stream's id, model and creation time; no text)."""

    request_id: str
    head: str
    tail: str


@dataclass(frozen=True, slots=True)
class ReleaseText:
    """Send the text of a request sent with ``hold_text`` to the host (``GenText``), the text
    held until now first: the host writes its stream."""

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


@dataclass(frozen=True, slots=True)
class Tokenize:
    """Tokenize ``content`` with the model's vocabulary (reply: ``vocabulary_answer``), as
    llama-server's ``/tokenize``. Answered on the engine's command thread: llama.cpp's tokenizer
    reads the vocabulary only, so it never waits for a decode step."""

    request_id: str
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


@dataclass(frozen=True, slots=True)
class Detokenize:
    """The text of ``tokens`` (reply: ``vocabulary_answer``), as llama-server's ``/detokenize``."""

    request_id: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Embed:
    """Embed each input with an embedding model (reply: ``embedding_answer``), as llama-server's
    ``/v1/embeddings``: ``texts`` are tokenized with the model's special tokens (BOS/EOS as its
    vocabulary says), ``token_lists`` taken as given; one of the two is empty. Answered on the
    engine's command thread: an embedding model's decode thread never decodes (it serves no
    generation), so the context is this thread's."""

    request_id: str
    texts: tuple[str, ...] = ()
    token_lists: tuple[tuple[int, ...], ...] = ()


Command = (
    Load
    | Generate
    | Cancel
    | AttachStream
    | ReleaseText
    | DropSession
    | Ping
    | Shutdown
    | SaveSessions
    | Tokenize
    | Detokenize
    | Embed
)
