"""What a load asks for: one type, its limits and its validation.

:class:`LoadOptions` is the one shape of a load request, and every layer that carries one uses it
unchanged: ``skippyctl load`` builds its flags from the fields (``cli/load_flags.py``), the API
its ``LoadBody`` schema (``api/schemas.py``), the client posts :meth:`LoadOptions.to_json`, the
host checks :meth:`LoadOptions.problem` and sends the engine a resolved copy inside the ``Load``
command (``engine/protocol_commands.py``), and what a load asked for beyond the defaults is
stated in its ``model_load_requested`` event as ``settings`` (:func:`shown_settings`), so the
state document and ``ps`` show it.

Each field's :class:`Option` (its ``metadata``) says how it is asked for (the CLI flag; one help
text for ``--help`` and the OpenAPI description), its bounds, and how it is shown. A new option
is one field here; the CLI, the API, the client, the host, the engine protocol and ``ps`` pick it
up. The engine reads what it needs from the fields.

Defaults: a field whose default is a constant holds it (``spec_draft_tokens`` is 64); ``None``
means the runtime decides at load time (``ctx``, ``lanes``, ``threads``, …). JSON may say
``null`` for any option: the default.

Privacy: paths (``model``, ``draft``, ``chat_template``, a C plugin's file) and stage endpoints
never leave the host and its engine; :func:`shown_settings` shows counts or ids for them (the
chat template file is read by the host, and only its text goes on). ``plugin_config`` goes to
the plugins only: it may hold anything a plugin needs, so it is shown as its length.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeGuard, get_type_hints

from skippyctl.config.endpoints import (
    ENDPOINT_PATTERN,
    MAX_STAGES,
    EndpointError,
    parse_endpoints,
)
from skippyctl.events.envelope import InvalidLogicalId, LogicalId
from skippyctl.events.identity import model_id_for

INT32_MAX: Final = 2**31 - 1
MAX_DURATION_S: Final = 86_400.0
"""A day: the longest load timeout accepted (also keeps timers finite)."""
MAX_PATH_CHARS: Final = 4096
MAX_PLUGINS: Final = 16
MAX_PLUGIN_CONFIG_CHARS: Final = 4096
"""The longest ``--plugin-config`` (skippyctl.plugins.api has the same bound for its wire)."""
MAX_THREADS: Final = 1024
MAX_QUEUE: Final = 1_000_000
MAX_DRAFT_TOKENS: Final = 64
MAX_RUNAHEAD_TOKENS: Final = 256
DEFAULT_STAGE_LINK_P95_MS: Final = 50.0
MIN_PROPOSAL_DEADLINE_MS: Final = 1.0
"""The plugin contract's floor for a proposal deadline: a shorter one no plugin round trip meets."""
MAX_PROPOSAL_DEADLINE_MS: Final = 1000.0
PLUGIN_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A Python plugin's entry-point name (``skippyctl.plugins`` group)."""


class SpecMode(StrEnum):
    """How a model's requests speculate (``load --spec``)."""

    OFF = "off"
    AUTO = "auto"
    NGRAM = "ngram"
    PLUGIN = "plugin"
    DRAFT = "draft"


class FlashAttention(StrEnum):
    """Whether a model's contexts use llama.cpp's flash attention (``load --flash-attn``)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class RestartPolicy(StrEnum):
    """What the runtime does when a model's engine dies while serving (``load --restart``)."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


def is_choice(kind: object) -> TypeGuard[type[StrEnum]]:
    """Whether an option's kind is a set of named values (an enum of this module): taken as
    its text everywhere, its member once read."""
    return isinstance(kind, type) and issubclass(kind, StrEnum)


RUNAHEAD_MODES: Final = (SpecMode.PLUGIN, SpecMode.NGRAM)
"""The modes whose proposals may run ahead (``spec_runahead_tokens``): a draft model would pay a
decode for every token drafted past the window."""

ShownValue = int | float | bool | str
"""A setting as events and the state document show it: a number, a flag or a short token."""


@dataclass(frozen=True, slots=True)
class Option:
    """How one load option is asked for, bounded and shown."""

    help: str
    """One text for ``load --help`` and the API's description (surfaces add the default)."""
    flag: str | None = None
    """The CLI flag; None: ``--`` and the field name with dashes."""
    cli: bool = True
    """False: the API takes it, ``skippyctl load`` does not."""
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    """An exclusive minimum (a value must be greater)."""
    max_items: int | None = None
    """A list option: at most this many values (and no duplicates)."""
    max_length: int | None = None
    """A text option (or each value of a list): at most this many characters."""
    pattern: str | None = None
    """A text option (or each value of a list) as a JSON Schema pattern, for the API's
    document; ``check`` is the rule itself."""
    check: Callable[[Any], str | None] | None = None
    """A rule beyond the bounds: what is wrong with a value, or None."""
    shown: Callable[[Any], ShownValue] | None = lambda value: value
    """What ``settings`` shows for a value that is not the default; None: never shown."""
    metavar: str | None = None


def _option(default: Any, **spec: Any) -> Any:
    return field(default=default, metadata={"option": Option(**spec)})


def _plugin_count(plugins: tuple[str, ...]) -> int:
    return len(plugins)


def _ttl_problem(ttl: float) -> str | None:
    return "must be -1 (never) or at least 0" if -1 < ttl < 0 else None


def _endpoints_problem(endpoints: tuple[str, ...]) -> str | None:
    try:
        parse_endpoints(endpoints)
    except EndpointError as error:
        return str(error)
    return None


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """A load request. Construct freely; :meth:`problem` says whether it can be served."""

    model: str = field(
        metadata={
            "option": Option(
                "Path to a GGUF file (the first part of a split set); a relative path is "
                "resolved against the runtime's --model-root, and with a model root set the "
                "path must stay inside it.",
                max_length=MAX_PATH_CHARS,
                shown=None,
            )
        }
    )
    alias: str | None = _option(
        None, help="Model id to serve it under instead of the file's name.", shown=None
    )
    ctx: int | None = _option(
        None,
        help="Whole context in tokens, split evenly across the lanes (default: each lane gets "
        "the model's training context, at most 4096, within half the free memory).",
        minimum=1,
        maximum=INT32_MAX,
    )
    lanes: int | None = _option(
        None,
        help="Parallel sequences (lanes) for serving (default: 4; with ctx, as many of up to 4 "
        "as keep 1024 tokens each).",
        minimum=1,
        maximum=INT32_MAX,
    )
    gpu_layers: int = _option(
        0, help="Layers to offload to a GPU (-1: all).", minimum=-1, maximum=INT32_MAX
    )
    threads: int | None = _option(
        None,
        help="Threads that decode for this model (llama.cpp's n_threads and n_threads_batch; "
        "default: one per core).",
        minimum=1,
        maximum=MAX_THREADS,
    )
    timeout_s: float | None = _option(
        None,
        help="Give up (and cancel) after this many seconds.",
        flag="--timeout",
        minimum=0,
        maximum=MAX_DURATION_S,
    )
    max_queue: int | None = _option(
        None,
        help="Requests that may wait beyond the lanes (default: the runtime's --max-queue).",
        minimum=0,
        maximum=MAX_QUEUE,
    )
    stages: tuple[str, ...] = _option(
        (),
        help="A ggml RPC stage (`skippyctl stage serve`) as IPv4 HOST:PORT to split the model "
        f"across, in order; at most {MAX_STAGES} (GGML_RPC_MAX_SERVERS), no duplicates.",
        flag="--stage",
        max_items=MAX_STAGES,
        pattern=ENDPOINT_PATTERN,
        check=_endpoints_problem,
        shown=len,
        metavar="HOST:PORT",
    )
    local_stages: int = _option(
        0,
        help="Stage workers the runtime starts on loopback for this model (after the listed "
        "stages); they stop when it is unloaded or its load fails.",
        minimum=0,
        maximum=MAX_STAGES,
    )
    local_stage_mem_mib: int | None = _option(
        None,
        help="Memory (MiB) each local stage offers to the plan (as `stage serve --mem`; "
        "default: what its device reports free).",
        flag="--mem",
        minimum=1,
        maximum=INT32_MAX,
    )
    replan: bool = _option(
        False,
        help="When a listed stage cannot be reached, plan onto the stages that remain instead "
        "of failing (the lost one is still reported as stage_unavailable).",
    )
    stage_link_p95_ms: float = _option(
        DEFAULT_STAGE_LINK_P95_MS,
        help="A split load's stage whose link p95 round trip (measured by the engine about once "
        "a second) goes above this many ms is stage_degraded; ready again below 0.8 x it.",
        above=0,
        maximum=MAX_DURATION_S * 1000.0,
    )
    spec: SpecMode = _option(
        SpecMode.AUTO,
        help="Speculative decoding: 'auto' verifies each lane's n-gram proposals only while "
        "its recent acceptance pays for what verifying them costs at the current batch size "
        "(measured as it serves; a lane stops and starts again on its own); 'ngram' proposes "
        "the tokens that followed the latest earlier occurrence of the text's last tokens "
        "(prompt lookup, no extra model) and verifies them in the same decode step; 'plugin' "
        "verifies the serving plugins' proposals; 'draft' "
        "verifies the draft model's continuation; the text is what decoding without it gives "
        "either way. 'off': one token per step.",
    )
    flash_attn: FlashAttention = _option(
        FlashAttention.AUTO,
        help="llama.cpp's flash attention for the model's contexts: 'auto' is off where the KV "
        "cache is in host memory (the CPU) and llama.cpp's choice on a GPU. Off, the CPU "
        "computes on batch-invariant ggml kernels, where a row decodes the same whatever is "
        "beside it (the load measures it: 'batch_invariant' 1 in its events), and decodes "
        "faster (the real model: a step in 0.65x the time, a verify window 0.56-0.63x); long "
        "prompts prefill slower (2,000 tokens 1.18x) and the load takes about a second more. "
        "'on' is llama-server's default on a CPU: its greedy texts past 512 tokens of context "
        "can change with speculation and with the requests decoding beside it.",
    )
    spec_draft_tokens: int = _option(
        MAX_DRAFT_TOKENS,
        help="Most proposed tokens a lane verifies in one step (with 'auto' each window is as "
        "long as it pays, up to this; other modes start a lane at 4 and double while every "
        "proposal is accepted; a step verifies at most 256 over all lanes).",
        minimum=1,
        maximum=MAX_DRAFT_TOKENS,
    )
    plugins: tuple[str, ...] = _option(
        (),
        help="A serving plugin for this model (repeatable), after the runtime's own: a C "
        "plugin's absolute .so path on the runtime's machine, or a Python plugin's entry-point "
        "name (group skippyctl.plugins; built in: 'ngram'). Each runs in its own process beside "
        "the engine, sees every request's lifecycle and committed tokens, and with spec "
        "'plugin' proposes; a failing plugin is reported and disabled, never fails a request.",
        flag="--plugin",
        max_items=MAX_PLUGINS,
        max_length=MAX_PATH_CHARS,
        shown=_plugin_count,
        metavar="PLUGIN",
    )
    plugin_config: str | None = _option(
        None,
        help="Configuration for this model's serving plugins: one text, handed unchanged to "
        "every plugin (--plugin and the runtime's own) when it is activated for the model, "
        "with the model's id, lanes, context per lane, spec mode and proposal deadline; its "
        f"syntax is the plugins' own (e.g. KEY=VALUE pairs). At most {MAX_PLUGIN_CONFIG_CHARS} "
        "characters; shown as its length only.",
        max_length=MAX_PLUGIN_CONFIG_CHARS,
        shown=len,
        metavar="TEXT",
    )
    spec_deadline_ms: float = _option(
        8.0,
        help="How long a decode step waits for the plugins' proposals; a later answer is "
        "dropped and counted as late.",
        minimum=MIN_PROPOSAL_DEADLINE_MS,
        maximum=MAX_PROPOSAL_DEADLINE_MS,
    )
    draft: str | None = _option(
        None,
        help="A draft model on the runtime's machine (a smaller GGUF with the same vocabulary) "
        "whose greedy continuation each decoding lane verifies in the same step (implies spec "
        "'draft'); the text is what decoding without it gives.",
        max_length=MAX_PATH_CHARS,
        shown=model_id_for,
        metavar="DRAFT.gguf",
    )
    chat_template: str | None = _option(
        None,
        help="A Jinja chat template file on the runtime's machine that renders this model's "
        "chats instead of the GGUF's own tokenizer.chat_template (read, size-checked and "
        "parsed before any weights move).",
        max_length=MAX_PATH_CHARS,
        shown=None,
        metavar="FILE",
    )
    spec_runahead_tokens: int = _option(
        0,
        help="With spec 'plugin' or 'ngram': proposals a query may ask for past the window. "
        "They become the next window without a query when the window verifies whole, and are "
        "discarded unexecuted (counted in the receipt) when it does not; 0: one query a "
        "window.",
        minimum=0,
        maximum=MAX_RUNAHEAD_TOKENS,
    )

    ttl: float | None = _option(
        None,
        help="Seconds the model stays loaded with nothing to serve before the runtime unloads "
        "it (reason 'idle'); 0: as soon as its last request ends; -1: never (default: the "
        "runtime's --ttl). A request's keep_alive overrides it for the idle time after that "
        "request.",
        minimum=-1,
        maximum=MAX_DURATION_S,
        check=_ttl_problem,
        metavar="SECONDS",
    )
    restart: RestartPolicy = _option(
        RestartPolicy.ON_FAILURE,
        help="When the model's engine dies while serving: 'on-failure' starts it again with "
        "the same options (after 0.5 s, then 1 s, 2 s; requests waiting for it wait; more "
        "than 3 restarts within 60 s and the model is failed); 'never' leaves it unavailable "
        "until it is loaded again.",
    )
    pinned: bool = _option(
        False,
        help="Never unload the model on the runtime's own account: no idle TTL, never evicted "
        "to make room for another model (an explicit unload still unloads it).",
        flag="--pin",
    )

    def __post_init__(self) -> None:
        # A choice given as its text (the CLI's flag, a test) becomes its member, so every
        # reader can compare members; a text that names none stays for problem() to refuse.
        for spec in _CHOICES:
            value = getattr(self, spec.name)
            if not isinstance(value, spec.kind) and value in spec.choices:
                object.__setattr__(self, spec.name, spec.kind(value))
        if self.spec is SpecMode.AUTO and self.draft is not None:
            # A draft model is asked for by naming it: the default mode gives way to it.
            object.__setattr__(self, "spec", SpecMode.DRAFT)

    @property
    def split(self) -> bool:
        """Whether the model is split across stages."""
        return bool(self.stages) or self.local_stages > 0

    def problem(self) -> str | None:
        """Why these options cannot be served, in the CLI's flag names, or None. One rule for
        the CLI (before any runtime is reached), the API and the host (before anything
        starts). ``spec`` ``plugin`` without a plugin is the host's to refuse: it may have its
        own (``runtime serve --plugin``)."""
        for spec in OPTIONS:
            problem = spec.problem(getattr(self, spec.name))
            if problem is not None:
                return problem
        if self.alias is not None:
            try:
                LogicalId(self.alias)
            except InvalidLogicalId:
                return "--alias must be 1-64 characters of [A-Za-z0-9._:+=-]"
        return self._speculation_problem() or self._stage_problem()

    def _speculation_problem(self) -> str | None:
        if self.spec_runahead_tokens and self.spec not in RUNAHEAD_MODES:
            return "--spec-runahead-tokens runs proposals ahead: it needs --spec plugin or ngram"
        if (self.spec is SpecMode.DRAFT) != (self.draft is not None):
            return "--spec draft and --draft DRAFT.gguf go together"
        if self.draft is not None and not self.draft:
            return "--draft must name a GGUF file"
        for plugin in self.plugins:
            problem = plugin_problem(plugin)
            if problem is not None:
                return problem
        return None

    def _stage_problem(self) -> str | None:
        if len(self.stages) + self.local_stages > MAX_STAGES:
            return f"at most {MAX_STAGES} stages in all (GGML_RPC_MAX_SERVERS)"
        if self.local_stage_mem_mib is not None and self.local_stages == 0:
            return "--mem applies to local stages only (with --local-stages)"
        link_given = self.stage_link_p95_ms != DEFAULT_STAGE_LINK_P95_MS
        if link_given and not self.split:
            return "--stage-link-p95-ms applies to a split load only (with --stage/--local-stages)"
        if self.split and self.gpu_layers != 0:
            return "--gpu-layers does not apply to a split load (every layer goes to the stages)"
        if self.replan and not self.stages:
            return "--replan needs --stage"
        return None

    def to_json(self) -> dict[str, Any]:
        """The API body: ``model`` and every option that is not its default."""
        body: dict[str, Any] = {"model": self.model}
        for spec in OPTIONS:
            value = getattr(self, spec.name)
            if spec.name != "model" and value != spec.default:
                body[spec.name] = list(value) if isinstance(value, tuple) else value
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LoadOptions:
        """Options from a JSON object whose types were checked (the API's ``LoadBody``): a
        missing or ``null`` option is its default; lists become tuples. Unknown keys are
        ignored."""
        values: dict[str, Any] = {}
        for spec in OPTIONS:
            value = body.get(spec.name)
            if value is None:
                continue
            if spec.kind is tuple:
                value = tuple(value)
            elif is_choice(spec.kind):
                value = spec.kind(value)
            elif spec.kind is float:
                value = float(value)
            values[spec.name] = value
        return cls(**values)

    def replace(self, **changes: Any) -> LoadOptions:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class OptionField:
    """One field of :class:`LoadOptions` with its :class:`Option`: what the surfaces iterate."""

    name: str
    kind: type
    """The value's type without ``None``: ``int``, ``float``, ``bool``, ``str``, ``tuple`` (of
    ``str``) or a choice (:func:`is_choice`: ``SpecMode``, ``RestartPolicy``)."""
    optional: bool
    """None is a value (the runtime decides)."""
    default: Any
    """The field's default; :data:`REQUIRED` for ``model``."""
    option: Option

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def choices(self) -> tuple[str, ...]:
        """A choice option's values as text, in order (empty for any other kind)."""
        return tuple(member.value for member in self.kind) if is_choice(self.kind) else ()

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is outside this option's bounds (the flag named), or None."""
        option, flag = self.option, self.flag
        if value is None:
            return None if self.optional else f"{flag} is required"
        if is_choice(self.kind) and not isinstance(value, self.kind):
            return f"{flag} must be one of: " + ", ".join(self.choices)
        if self.kind is float and not math.isfinite(value):
            return f"{flag} must be a finite number"
        if self.kind in (int, float):
            low, high = option.minimum, option.maximum
            if option.above is not None and not value > option.above:
                return f"{flag} must be more than {option.above:g}"
            if (low is not None and value < low) or (high is not None and value > high):
                return f"{flag} must be {_span(low, high)}"
        if self.kind is str and (not value or "\x00" in value):
            return f"{flag} must not be empty or contain NUL characters"
        if self.kind is tuple:
            if option.max_items is not None and len(value) > option.max_items:
                return f"{flag}: at most {option.max_items} values"
            if any(not item or "\x00" in item for item in value):
                return f"{flag}: a value must not be empty or contain NUL characters"
            if len(set(value)) != len(value):
                return f"{flag}: a value is given twice"
        texts = value if self.kind is tuple else (value,) if self.kind is str else ()
        if option.max_length is not None and any(len(t) > option.max_length for t in texts):
            return f"{flag}: at most {option.max_length} characters"
        problem = None if option.check is None else option.check(value)
        return None if problem is None else f"{flag}: {problem}"


REQUIRED: Final = dataclasses.MISSING


def _span(low: float | None, high: float | None) -> str:
    if low is None:
        return f"at most {high:g}"
    if high is None:
        return f"at least {low:g}"
    return f"{low:g}-{high:g}"


def _fields() -> tuple[OptionField, ...]:
    hints = get_type_hints(LoadOptions)
    found = []
    for f in dataclasses.fields(LoadOptions):
        hint = hints[f.name]
        args = getattr(hint, "__args__", ())
        optional = type(None) in args
        kind = next((a for a in args if a is not type(None)), hint) if optional else hint
        kind = getattr(kind, "__origin__", kind)  # tuple[str, ...] → tuple
        found.append(OptionField(f.name, kind, optional, f.default, f.metadata["option"]))
    return tuple(found)


OPTIONS: Final[tuple[OptionField, ...]] = _fields()
"""Every field of :class:`LoadOptions`, in order, with its option."""
_CHOICES: Final = tuple(spec for spec in OPTIONS if is_choice(spec.kind))


def plugin_problem(spec: str) -> str | None:
    """Why a ``--plugin`` value cannot name a plugin, or None. The message names a file by its
    basename only."""
    if not spec or len(spec) > MAX_PATH_CHARS or "\x00" in spec:
        return "--plugin must be a plugin's .so file or an entry-point name"
    if spec.endswith(".so"):
        path = Path(spec)
        if not path.is_absolute():
            return f"--plugin {path.name}: give the plugin's file as an absolute path"
        if not path.is_file():
            return f"--plugin {path.name}: no such file"
        return None
    if not PLUGIN_NAME.fullmatch(spec):
        return "--plugin: an entry-point name is 1-64 characters of [A-Za-z0-9._-]"
    return None


def shown_settings(options: LoadOptions) -> tuple[tuple[str, ShownValue], ...]:
    """What ``model_load_requested`` states about ``options``: each shown option whose value is
    not its default, as a number, a flag or a short token (never a path or an endpoint)."""
    shown: list[tuple[str, ShownValue]] = []
    for spec in OPTIONS:
        value = getattr(options, spec.name)
        if spec.option.shown is None or value is None or value == spec.default:
            continue
        shown.append((spec.name, spec.option.shown(value)))
    return tuple(shown)
