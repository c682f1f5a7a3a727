"""Declared request and response bodies of the HTTP API (pydantic), and how a body is read.

Every request body is validated by one of these models before a handler acts on it. Types are
strict (a string is never taken for a number, nor 1 for true); an integral float (`5.0`) is taken
for an integer, since JSON does not tell them apart. Unknown fields are accepted and ignored — what
OpenAI clients send that does not change the result — while parameters that would change the
result in a way the runtime cannot honour (`echo`, `best_of`, `suffix`, `n` != 1, non-text
content parts) are refused with a 400 naming them (`code:
unsupported_parameter`), never silently dropped. Numbers are bounded where the engine or
llama.cpp takes them as fixed-size integers.

The same models describe the OpenAPI document (`/openapi.json`), so schema-driven clients and
the schemathesis run in the test suite see exactly what is enforced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, TypeVar

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema
from starlette.requests import Request

from skippyctl.api.errors import (
    UNSUPPORTED_PARAMETER,
    ErrorBody,
    JsonResponse,
    error_response,
    model_field_names,
    validation_error_response,
)
from skippyctl.config.durations import MAX_TEXT as DURATION_MAX_TEXT
from skippyctl.config.durations import DurationError, parse_duration_s
from skippyctl.config.load_options import (
    MAX_DURATION_S,
    MAX_PATH_CHARS,
    OPTIONS,
    REQUIRED,
    OptionField,
)
from skippyctl.events.figures import FIGURES
from skippyctl.events.reasons import ReasonCode

INT32_MAX: Final = 2**31 - 1
MAX_SEED: Final = 0xFFFFFFFE
MAX_GRAMMAR_CHARS: Final = 1 << 20
"""A GBNF grammar's size bound (llama-server has none; a megabyte is far beyond any real one)."""
"""llama.cpp takes a 32-bit seed and reserves 0xFFFFFFFF for "random" (engine/sampling.py)."""
NO_NUL: Final = "^[^\\u0000]+$"


def _integral(value: Any) -> Any:
    """JSON has one number type: `5.0` is the integer 5 (any other float stays a type error)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**63:
        return int(value)
    return value


# Bounds sit inside the integral-float conversion, so the JSON schema shows them as
# minimum/maximum (outside it, pydantic can only print them as raw `ge`/`le`).
Int32 = Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX), BeforeValidator(_integral)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), BeforeValidator(_integral)]
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_integral)]


def _duration(value: Any) -> Any:
    if not isinstance(value, int | float | str) or isinstance(value, bool):
        return value  # the float type refuses it with its own message
    try:
        return parse_duration_s(value)
    except DurationError as error:
        raise PydanticCustomError("duration", str(error)) from None


KeepAlive = Annotated[
    float,
    Field(ge=-1, le=MAX_DURATION_S),
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "maximum": MAX_DURATION_S},
                {"type": "string", "maxLength": DURATION_MAX_TEXT},
            ]
        }
    ),
]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("a text value must not contain a NUL byte")
    return value


def _checked(rule: Callable[[Any], str | None]) -> Callable[[Any], Any]:
    """A load option's own rule as a validator (its body value, a list as a tuple)."""

    def check(value: Any) -> Any:
        problem = rule(tuple(value) if isinstance(value, list) else value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return check


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("a value is given twice")
    return values


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def _unsupported(name: str, hint: str) -> PydanticCustomError:
    return PydanticCustomError(
        UNSUPPORTED_PARAMETER,
        "'{name}' is not supported by this runtime ({hint})",
        {"name": name, "hint": hint},
    )


# -- management API --------------------------------------------------------------------------------


def _load_option(spec: OptionField) -> tuple[Any, Any]:
    """The body field of one load option: its JSON type and bounds from the option table.
    ``null`` (or absent) is the option's default, which the schema states."""
    option = spec.option
    bounds: dict[str, Any] = {}
    if option.minimum is not None:
        bounds["ge"] = option.minimum
    if option.maximum is not None:
        bounds["le"] = option.maximum
    if option.above is not None:
        bounds["gt"] = option.above
    # The pattern documents what is accepted; the option's check enforces it (below).
    item: Any = Annotated[
        str,
        Field(
            min_length=1,
            max_length=option.max_length,
            json_schema_extra={"pattern": option.pattern or NO_NUL},
        ),
        AfterValidator(_no_nul),
    ]
    kinds: dict[type, Any] = {
        int: Annotated[int, Field(**bounds), BeforeValidator(_integral)],
        float: Annotated[float, Field(**bounds)],
        bool: bool,
        str: item,
        tuple: Annotated[
            list[item],
            Field(max_length=option.max_items, json_schema_extra={"uniqueItems": True}),
            AfterValidator(_unique),
        ],
    }
    kind = Literal[spec.choices] if spec.choices else kinds[spec.kind]
    if option.check is not None:
        kind = Annotated[kind, AfterValidator(_checked(option.check))]
    default = spec.default
    if isinstance(default, tuple):
        default = list(default)
    elif isinstance(default, StrEnum):
        default = default.value
    if default is REQUIRED:
        return kind, Field(description=option.help)
    return kind | None, Field(default=default, description=option.help)


_LOAD_FIELDS: Final[dict[str, Any]] = {spec.name: _load_option(spec) for spec in OPTIONS}
LoadBody: Final = create_model(
    "LoadBody",
    __base__=_Body,
    __doc__="`POST /api/runtime/models/load`: the load's options (skippyctl.config.load_options; "
    "`skippyctl load` takes the same). Out-of-range values are refused here (400); a "
    "combination that cannot be served is the host's `problem`, with a failed load operation.",
    **_LOAD_FIELDS,
)


class UnloadBody(_Body):
    """`POST /api/runtime/models/{model_id}/unload` (the body is optional)."""

    force: bool = Field(default=False, description="Cancel running requests instead of draining.")
    drain_timeout_s: float | None = Field(default=None, ge=0, le=MAX_DURATION_S)


class PullBody(_Body):
    """`POST /api/runtime/models/pull`."""

    ref: str = Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        pattern=NO_NUL,
        description="hf://ORG/REPO/FILE.gguf, ORG/REPO:QUANT, or a local GGUF path to check.",
    )
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=NO_NUL,
        description="Branch, tag or commit of a Hugging Face repo (default main).",
    )


class PullAccepted(BaseModel):
    operation_id: str = Field(description="The pull's operation: its events carry it.")


class LoadAccepted(BaseModel):
    operation_id: str
    model_id: str | None
    problem: str | None = Field(description="Why the host refused the load before any work.")
    already_available: bool


class LoadEstimate(BaseModel):
    model_id: str
    weights_bytes: int = Field(description="The GGUF's size (every part of a split set).")
    kv_bytes: int = Field(description="The KV cache of the context the load would get.")
    kv_bytes_per_lane: int | None
    compute_bytes: int = Field(description="One micro-batch's logits and activations.")
    total_bytes: int
    context_tokens: int | None
    lanes: int | None
    memory_budget_bytes: int | None = Field(description="The runtime's budget (null: none).")
    memory_budget_used_bytes: int = Field(description="What the loaded models' loads took.")


class UnloadAccepted(BaseModel):
    operation_id: str
    model_id: str


class CancelAccepted(BaseModel):
    operation_id: str
    cancel_requested: bool


def _figure_fields(speculative: bool) -> dict[str, Any]:
    """The receipt's figure fields (events/figures.py's table), typed and described from it."""
    return {
        f.receipt: (int if f.count else float | None, Field(description=f.help))
        for f in FIGURES
        if f.speculative is speculative
    }


SpeculativeFiguresDocument: Final = create_model(
    "SpeculativeFiguresDocument",
    __doc__="A receipt's proposal figures and the model's speculation mode.",
    mode=(str, Field(description="The load's `--spec` (`off`: every count is 0).")),
    **_figure_fields(speculative=True),
)
ReceiptDocument: Final = create_model(
    "ReceiptDocument",
    __doc__="A request's generation receipt (runtime/receipts.py): opaque ids, how it ended, "
    "the host's timings and the engine's figures (events/figures.py), in ms where they are "
    "times (null where they do not apply).",
    request_id=(str, ...),
    model_id=(str, ...),
    session_id=(str | None, ...),
    outcome=(str, ...),
    reason_code=(str | None, ...),
    stop_reason=(str | None, ...),
    queue_ms=(float, Field(description="The host's queue: received → handed to the engine.")),
    total_ms=(float, Field(description="Received → the terminal.")),
    **_figure_fields(speculative=False),
    speculative=(SpeculativeFiguresDocument, ...),
    # -- tools
    tools=(
        int,
        Field(
            description="Tools the request offered the chat template (0 without tools or "
            "with `tool_choice: none`)."
        ),
    ),
    tool_calls=(int, Field(description="Tool calls parsed from the reply (a count).")),
    # -- sampling
    constraint=(
        str | None,
        Field(
            description="What constrained the reply: `grammar` (a GBNF grammar), `json_schema` "
            "(a JSON `response_format`), or null. Never the grammar or schema itself."
        ),
    ),
)


class SessionSaveAccepted(BaseModel):
    session_id: str
    save_requested: bool


class ShutdownAccepted(BaseModel):
    stopping: bool


class HealthDocument(BaseModel):
    status: Literal["ready", "degraded", "loading", "idle", "draining"]
    node: str
    models: dict[str, str]
    version: str
    process_instance_id: str


class LoadableModel(BaseModel):
    model_id: str
    source: Literal["preset", "models_dir", "hub_cache"] = Field(
        description="Where it comes from: a preset (`--presets`), a file of `--models-dir`, or "
        "a single-file GGUF of the local hub cache."
    )
    pinned: bool = Field(description="Never unloaded on the runtime's account once loaded.")
    idle_ttl_s: float | None = Field(
        default=None, description="Idle seconds before it unloads once loaded (absent: never)."
    )


class StateDocument(BaseModel):
    """The reduced state document (schema version 1; fields are only ever added)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int
    record: Literal["state"]
    node: str
    models: list[dict[str, Any]]
    engines: list[dict[str, Any]]
    loadable_models: list[LoadableModel] = Field(
        description="The models the runtime may load on demand (`--presets`, `--models-dir`, "
        "the local hub cache) that are neither loaded nor loading (a failed or unloaded model "
        "is listed again), in the order the runtime looks a name up: ids, never paths."
    )


class RecentEvents(BaseModel):
    events: list[dict[str, Any]] = Field(description="Event records, oldest first (at most 128).")


# -- OpenAI-compatible API -------------------------------------------------------------------------


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: numbers by value (0 == 0.0), booleans only as booleans."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    if isinstance(neutral, int | float):
        return isinstance(value, int | float) and value == neutral
    if isinstance(neutral, tuple):  # an empty JSON array (a tuple: metadata stays hashable)
        return isinstance(value, list) and tuple(value) == neutral
    return type(value) is type(neutral) and bool(value == neutral)


@dataclass(frozen=True, slots=True)
class Refused:
    """Field metadata for a parameter the runtime cannot honour: accepted only as null or
    `neutral` (a value with no effect); any other value is a 400 `unsupported_parameter`
    naming it. The JSON schema says exactly that (`const` neutral, or null)."""

    neutral: Any
    hint: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.with_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        del schema, handler
        neutral = list(self.neutral) if isinstance(self.neutral, tuple) else self.neutral
        return {"anyOf": [{"const": neutral}, {"type": "null"}]}

    def _check(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        if value is None or _same(value, self.neutral):
            return value
        raise _unsupported(str(info.field_name), self.hint)


class StreamOptions(_Body):
    include_usage: bool | None = Field(
        default=None,
        description="Send a last chunk with `choices: []` and the request's `usage`.",
    )


class TextPart(_Body):
    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str


class ToolCallFunction(_Body):
    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = Field(
        description="The call's arguments as JSON text (an object is taken as llama-server does)."
    )


class ToolCallBody(_Body):
    id: str | None = Field(default=None, max_length=256)
    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    # Before `content`, whose check reads it.
    tool_calls: Annotated[list[ToolCallBody], Field(max_length=128)] | None = None
    content: str | list[TextPart] | None = Field(
        default=None,
        validate_default=True,
        description="Text, text parts, or null (an assistant turn with tool_calls).",
    )
    name: str | None = Field(default=None, max_length=256)
    tool_call_id: str | None = Field(default=None, max_length=256)
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _content_or_tool_calls(cls, content: Any, info: ValidationInfo) -> Any:
        # llama-server's rule: a turn without text must at least call tools.
        if content is None and not info.data.get("tool_calls"):
            raise PydanticCustomError(
                "missing_content",
                "a message needs 'content' (or, from the assistant, 'tool_calls')",
            )
        return content


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="A JSON schema.")
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Body):
    name: str = Field(min_length=1)


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(_Body):
    name: str | None = Field(default=None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] = Field(
        default_factory=dict,
        alias="schema",
        description="The JSON schema the reply must satisfy (llama.cpp's JSON-schema grammar).",
    )
    strict: bool | None = None


class ResponseFormat(_Body):
    """`text` (no constraint), `json_object` (the reply is a JSON object) or `json_schema` (the
    reply satisfies `json_schema.schema`); both JSON forms constrain sampling with llama.cpp's
    grammar sampler."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(
        default=None, alias="schema", description="llama-server's form of a json_object schema."
    )

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object")
        return self

    def schema_text(self) -> str | None:
        """The JSON schema that constrains the reply (as JSON text); None for `text`."""
        if self.type == "json_schema":
            assert self.json_schema is not None
            return orjson.dumps(self.json_schema.schema_).decode()
        if self.type == "json_object":
            return orjson.dumps(self.schema_ or {"type": "object"}).decode()
        return None


StopString = Annotated[str, Field(min_length=1, max_length=256)]
TokenId = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]
LogitBias = Annotated[
    dict[TokenId, float],
    # pydantic says `patternProperties`, which lets other keys through; these are refused.
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]{1,9}$"},
            "additionalProperties": {"type": "number"},
        }
    ),
]


class _Generation(_Body):
    model: str = Field(min_length=1)
    max_tokens: MaxTokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=5)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Count | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0, le=10)
    seed: Seed | None = None
    logit_bias: LogitBias | None = Field(
        default=None, description="Token id (a decimal string) to an additive bias."
    )
    stop: StopString | Annotated[list[StopString], Field(max_length=8)] | None = None
    n: Annotated[Any, Refused(1, "only n=1")] = Field(
        default=None, description="Only 1 is supported."
    )
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="Session key (KV reuse).")
    timeout: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, description="Seconds.")
    keep_alive: KeepAlive | None = Field(
        default=None,
        description="How long the model stays loaded once idle after this request, as Ollama "
        "takes it: seconds, or text such as '5m' or '1h'; negative: forever; 0: unload when "
        "idle. Default: the model's TTL.",
    )
    # -- sampling: penalties and constrained output (llama.cpp's sampler chain)
    presence_penalty: float | None = Field(
        default=None,
        ge=-2,
        le=2,
        description="Subtracted once from a token's logit if it occurred.",
    )
    frequency_penalty: float | None = Field(
        default=None, ge=-2, le=2, description="Subtracted per occurrence of a token."
    )
    repeat_last_n: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="How many recent tokens the penalties look at (0 disables them; default 64).",
    )
    grammar: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_GRAMMAR_CHARS,
        description="A GBNF grammar (root rule `root`) the reply must match.",
    )
    response_format: ResponseFormat | None = Field(
        default=None,
        description="`text`, `json_object` or `json_schema` (constrained with a grammar).",
    )
    # -- end sampling


class CompletionBody(_Generation):
    """`POST /v1/completions`."""

    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] = Field(
        description="One prompt (a string, or a list of exactly one string)."
    )
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description="Return each token's log-probability and this many most likely "
        "candidates (OpenAI's legacy `logprobs` object).",
    )
    echo: Annotated[Any, Refused(False, "omit it or set it to false")] = Field(
        default=None, description="Refused unless null or false."
    )
    best_of: Annotated[Any, Refused(1, "only best_of=1")] = Field(
        default=None, description="Refused unless null or 1."
    )
    suffix: Annotated[Any, Refused("", "omit it")] = Field(
        default=None, description="Refused unless null or empty."
    )

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatCompletionBody(_Generation):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = Field(
        default=None, description="Return each token's log-probability (`choices[].logprobs`)."
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description="With `logprobs`: this many most likely candidates per token.",
    )
    # -- chat template inputs (jinja)
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = Field(
        default=None,
        description="Functions the model may call, passed to the model's chat template.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="Extra variables for the model's chat template (e.g. enable_thinking).",
    )
    # -- end chat template inputs
    functions: Annotated[Any, Refused((), "function calling is not supported")] = Field(
        default=None, description="Refused unless empty."
    )
    # -- tool calls (api/tool_calls.py parses the reply)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None,
        description="`auto` (the default): the reply is read for tool calls; `none`: no tools "
        "reach the template and the reply is not read for calls; `required` or "
        "`{type: function, function: {name}}`: the reply is one call (of any tool, or of the "
        "named one), forced by a grammar from the tools' parameter schemas in the form the "
        "model's chat template teaches.",
    )
    parallel_tool_calls: bool | None = Field(
        default=None,
        description="false: at most one tool call is taken from the reply (the first).",
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    state: Literal["loaded", "loading", "loadable"] = Field(
        description="`loaded`: it serves; `loading`: its load runs (requests wait for it); "
        "`loadable`: a preset or a file of the models directory, loaded by its first request."
    )
    source: Literal["preset", "models_dir", "hub_cache"] | None = Field(
        default=None, description="Where a model the runtime may load on demand comes from."
    )
    pinned: bool = Field(default=False, description="Never unloaded on the runtime's account.")
    idle_ttl_s: float | None = Field(
        default=None, description="Idle seconds before it unloads (absent: never)."
    )
    idle_expires_at: str | None = Field(
        default=None,
        description="When the idle model unloads unless a request comes (RFC 3339, UTC).",
    )


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CalledFunction(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as JSON text.")


class ToolCallDocument(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="Null when the reply was only tool calls.")
    tool_calls: list[ToolCallDocument] | None = Field(
        default=None, description="Present when tool calls were parsed from the reply."
    )


class TopLogprobDocument(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobDocument(TopLogprobDocument):
    top_logprobs: list[TopLogprobDocument]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobDocument] | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


# -- the vocabulary (llama-server's /tokenize and /detokenize)
MAX_DETOKENIZE_TOKENS: Final = 1_000_000


class TokenizeBody(_Body):
    """`POST /tokenize`."""

    content: str
    model: str | None = Field(
        default=None, min_length=1, description="Which model; may be omitted when one serves."
    )
    add_special: bool = Field(default=False, description="Add BOS (and EOS) as the model does.")
    parse_special: bool = Field(
        default=True, description="Read special-token text (`<|im_start|>`) as those tokens."
    )
    with_pieces: bool = Field(
        default=False, description="Return `{id, piece}` per token instead of bare ids."
    )


class DetokenizeBody(_Body):
    """`POST /detokenize`."""

    tokens: Annotated[
        list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(max_length=MAX_DETOKENIZE_TOKENS)
    ]
    model: str | None = Field(
        default=None, min_length=1, description="Which model; may be omitted when one serves."
    )


MAX_EMBEDDING_INPUTS: Final = 2048
"""OpenAI's limit on the inputs of one embeddings request."""
InputTokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class EmbeddingBody(_Body):
    """`POST /v1/embeddings` (OpenAI's shape; llama-server's `content` is not taken)."""

    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
        | Annotated[list[InputTokenId], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[InputTokenId], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS),
        ]
    ) = Field(
        description="A text, a list of texts, a list of token ids, or a list of token-id lists."
    )
    model: str | None = Field(
        default=None, min_length=1, description="Which model; may be omitted when one serves."
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="`float`: JSON numbers; `base64`: the float32 little-endian bytes, base64.",
    )
    dimensions: Annotated[Any, Refused(None, "the model's own size only")] = Field(
        default=None, description="Not supported: vectors have the model's size."
    )
    user: str | None = Field(default=None, description="Accepted and ignored.")


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embeddings(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int] = Field(
        description="The token's text, or its bytes when they are not UTF-8 on their own."
    )


class Tokenized(BaseModel):
    tokens: list[int] | list[TokenPiece]


class Detokenized(BaseModel):
    content: str


REQUEST_MODELS: Final[tuple[type[BaseModel], ...]] = (
    LoadBody,
    PullBody,
    UnloadBody,
    CompletionBody,
    ChatCompletionBody,
    TokenizeBody,
    DetokenizeBody,
    EmbeddingBody,
)
FIELD_NAMES: Final = model_field_names(REQUEST_MODELS)
"""Names that may appear as an error's `param` (union tags and dict keys never do)."""


# -- reading a body --------------------------------------------------------------------------------


M = TypeVar("M", bound=BaseModel)


async def read_body(
    request: Request, model: type[M], *, allow_empty: bool = False
) -> M | JsonResponse:
    """The request body validated as `model`, or the 400 to answer with.

    Any content type is read as JSON (clients such as `curl -d` send form types for JSON); the
    body size is already bounded by the edge middleware."""
    raw = await request.body()
    if not raw.strip() and allow_empty:
        raw = b"{}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return error_response(
            "request body is not valid JSON (UTF-8)",
            400,
            code="invalid_json",
            reason=ReasonCode.INVALID_CONFIGURATION,
        )
    if not isinstance(data, dict):
        return error_response(
            "request body must be a JSON object",
            400,
            code="invalid_type",
            reason=ReasonCode.INVALID_CONFIGURATION,
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        return validation_error_response(list(error.errors()), FIELD_NAMES)


# -- OpenAPI ---------------------------------------------------------------------------------------

JSON: Final = "application/json"
SSE: Final = "text/event-stream"


def sse_event(names: list[str] | None = None) -> dict[str, Any]:
    """The schema of one server-sent event (for `text/event-stream`, `schema` describes each
    event, as OpenAPI 3.2's `itemSchema` does): its `data` is one JSON document, or `[DONE]`."""
    event: dict[str, Any] = {"type": "string"}
    if names:
        event["enum"] = names
    return {
        "type": "object",
        "properties": {
            "event": event,
            "data": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
        "required": ["data"],
    }


def json_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` declaring a JSON request body of `model` (its schema is added to the
    document's components by `openapi_with_request_models`)."""
    return {
        "requestBody": {
            "required": required,
            "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these error statuses, each an `ErrorBody`."""
    described = {
        400: "Invalid input (the `param` names it)",
        401: "Missing or wrong bearer token",
        404: "Unknown model or endpoint",
        413: "Request body larger than the limit",
        429: "Queue full or too many reconnects (see Retry-After)",
        499: "The client went away",
        503: "The model is not serving (loading, crashed, unloading) or the runtime is draining",
        504: "The request's timeout passed",
    }
    return {
        status: {"model": ErrorBody, "description": described.get(status, "Error")}
        for status in statuses
    }


def add_request_models(document: dict[str, Any]) -> dict[str, Any]:
    """Put every request model's schema (and the models it nests) into `components.schemas`."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in REQUEST_MODELS:
        schema = model.model_json_schema(
            ref_template="#/components/schemas/{model}", mode="validation"
        )
        for name, nested in schema.pop("$defs", {}).items():
            schemas.setdefault(name, nested)
        schemas[model.__name__] = schema
    return document
