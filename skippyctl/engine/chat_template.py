"""A chat as the model's authors meant it: the GGUF's own Jinja chat template, rendered the way
llama-server renders it with ``--jinja``.

Contract and invariants:

- :class:`ChatMessage` / :class:`ToolCall` are the messages of a chat as a client sent them
  (OpenAI's shape, already checked by the API): plain data that travels in the Generate command.
  ``tools`` and ``chat_template_kwargs`` travel beside them as JSON-compatible data.
- :class:`ChatTemplate` compiles one template text in a sandbox
  (``jinja2.sandbox.ImmutableSandboxedEnvironment``, ``trim_blocks``/``lstrip_blocks`` and the
  ``loopcontrols`` extension, ``tojson`` as transformers defines it, globals ``raise_exception``
  and ``strftime_now``) and renders a chat with llama-server's inputs (llama.cpp
  ``common/chat.cpp``): the messages normalised as ``common_chat_msg::to_json_oaicompat`` does
  (content ``""`` when absent; text parts joined with newlines unless the template reads content
  as a list; tool call arguments parsed into objects when the template reads them as objects),
  ``developer`` mapped to ``system``, a system message merged into the next one for a template
  that ignores the system role, ``bos_token``/``eos_token`` (the vocabulary's token texts),
  ``enable_thinking`` (true), ``datetime``/``date_string``, ``tools`` only when the request has
  some, ``add_generation_prompt`` only when true, then the request's ``chat_template_kwargs``
  over them. A leading BOS text is cut from the render when the tokenizer adds BOS itself (and a
  trailing EOS text when it adds EOS), as llama-server does.
- Every failure is a :class:`ChatTemplateError` with a message fit for the client (a template
  that does not parse, raises, loops past :data:`MAX_LOOP_ITERATIONS`, builds text past
  :data:`MAX_RENDER_CHARS`, reaches for what the sandbox forbids, or renders no text) — never
  anything else, and never a hang: loops, operators, calls and output are bounded.
- ``jinja2`` is imported on first use, inside this module's functions, so importing this module
  (as the host's protocol does) costs nothing at CLI start-up.

Nothing here logs or emits anything: a chat is request text.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import jinja2

MAX_TEMPLATE_BYTES: Final = 1 << 20
"""The largest template text accepted (real templates are a few KiB; the largest known ~30 KiB)."""
MAX_RENDER_CHARS: Final = 4 << 20
"""The most text a render (or any string it builds on the way) may reach."""
MAX_LOOP_ITERATIONS: Final = 1_000_000
"""The most ``for`` iterations one render may run, all loops together."""

CHATML_TEMPLATE: Final = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
"""llama.cpp's ChatML as Jinja (``CHATML_TEMPLATE_SRC`` in common/chat.cpp): what serves a model
whose GGUF carries no chat template."""

_LIST_BUILDING: Final = frozenset({"append", "extend", "insert", "pop"})
_ITERATE: Final = "skippy_budgeted_iteration"
"""The hidden global every ``for`` loop's sequence goes through (see :func:`_budget_loops`)."""


class ChatTemplateError(ValueError):
    """The chat could not be rendered; the message says why (it may quote the template)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an assistant message; ``arguments`` is JSON text as the client sent it."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat turn as the client sent it.

    ``content`` is text or ``None`` (an assistant turn that only calls tools); ``parts`` are the
    texts of a content given as a list of text parts (then ``content`` is ``None``)."""

    role: str
    content: str | None = None
    parts: tuple[str, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    """What a template does with its inputs, found by rendering probe chats (llama.cpp's
    ``jinja::caps_get`` asks the same questions of its own engine)."""

    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_system_role: bool = True
    supports_object_arguments: bool = False
    supports_thinking: bool = False
    """The template opens a reasoning block (``<think>``) when ``enable_thinking`` is true:
    llama-server's default for ``enable_thinking`` (else false)."""


class _Budget:
    """One render's allowance of loop iterations."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_LOOP_ITERATIONS

    def iterate(self, sequence: Any) -> Iterator[Any]:
        for item in sequence:
            self.left -= 1
            if self.left < 0:
                raise ChatTemplateError(
                    f"the chat template ran more than {MAX_LOOP_ITERATIONS} loop iterations"
                )
            yield item


def _check_size(value: Any) -> Any:
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_RENDER_CHARS:
        raise ChatTemplateError(f"the chat template built a value over {MAX_RENDER_CHARS} long")
    return value


def _check_arguments(args: Iterable[Any]) -> None:
    # A count argument (center(width), ljust, indent, zfill, a repetition) is where one call
    # allocates without bound: refuse the call before it runs.
    for value in args:
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_RENDER_CHARS:
            raise ChatTemplateError(f"the chat template asked for a size over {MAX_RENDER_CHARS}")


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    """transformers' ``tojson``: no ASCII escaping, and no HTML escaping (unlike Jinja's own);
    a lazy sequence (``map``, ``select``) serialises as the list it yields."""
    _check_arguments((indent,))
    if _WATCH:
        _note_watched(value)
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(value: Any) -> Any:
    import jinja2

    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _concatenates_null(left: Any, right: Any) -> bool:
    import jinja2

    def null(value: Any) -> bool:
        return value is None or isinstance(value, jinja2.Undefined)

    return (null(left) and isinstance(right, str)) or (null(right) and isinstance(left, str))


def _lenient_undefined(jinja2: Any) -> type:
    """Undefined as llama.cpp's engine treats it: a member of it is undefined too, nothing is
    ``in`` it, and it adds to text as nothing; other operations still fail."""

    class _Undefined(jinja2.ChainableUndefined):  # type: ignore[misc]  # jinja2's own class
        __slots__ = ()

        def __contains__(self, item: Any) -> bool:
            return False

    return _Undefined


def _plain_text(value: Any) -> str:
    return str(value)


def _raise_exception(message: Any) -> None:
    raise ChatTemplateError(f"the chat template refused the chat: {message}")


_today: datetime.datetime | None = None
"""The day templates read as today when a test pins it (:func:`pin_today`); None: the clock."""


def pin_today(day: datetime.date | None) -> None:
    """Templates read ``day`` (at noon) as now in this process; None: the clock again. Test
    fault injection only (``SKIPPY_TEST_TEMPLATE_DATE``): goldens made on one day compare."""
    global _today
    _today = None if day is None else datetime.datetime(day.year, day.month, day.day, 12)


def _now() -> datetime.datetime:
    return _today if _today is not None else datetime.datetime.now()


def _strftime_now(format_: str) -> str:
    return _now().strftime(format_)


def _environment() -> jinja2.Environment:
    """The sandbox every template compiles and renders in (built once)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is not None:
        return _ENVIRONMENT
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox

    class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        # Arithmetic that repeats or grows a value is checked; `~` joins are checked by
        # _budget_loops' rewrite, calls and filters here.
        intercepted_binops = frozenset({"*", "**", "+"})

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            # Templates build lists with append/extend (Kimi, …), which llama.cpp allows; every
            # list a render sees is its own copy, and loops bound how far one can grow.
            if isinstance(obj, list) and attr in _LIST_BUILDING:
                return jinja2.sandbox.SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
            return bool(super().is_safe_attribute(obj, attr, value))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+" and _concatenates_null(left, right):
                # llama.cpp's engine: null or undefined + text is the text (Cohere's templates
                # add a parameter's missing description).
                return "".join(v for v in (left, right) if isinstance(v, str))
            if operator == "**":
                _check_arguments((right,))
            if operator == "*":
                for count, other in ((right, left), (left, right)):
                    if isinstance(count, int) and isinstance(other, str | list | tuple):
                        _check_arguments((count * max(len(other), 1),))
            return _check_size(super().call_binop(context, operator, left, right))

        def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _check_arguments(args)
            _check_arguments(kwargs.values())
            return _check_size(super().call(__context, __obj, *args, **kwargs))

    class _Generation(jinja2.ext.Extension):
        """transformers' ``{% generation %}…{% endgeneration %}``: marks the assistant's
        text for training masks; rendering it is rendering its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    environment = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _Generation],
        undefined=_lenient_undefined(jinja2),
        keep_trailing_newline=False,
    )
    for name, function in list(environment.filters.items()):
        environment.filters[name] = _bounded_filter(function)
    environment.filters["tojson"] = _tojson
    environment.filters[_BOUNDED_STRING] = _check_size
    # No autoescaping here, so `|safe`'s only effect would be Markup's: escaping whatever is
    # added to it (functionary's `"…"|safe + t | tojson` would come out as &#34;). llama.cpp's
    # engine renders the plain text.
    environment.filters["safe"] = _plain_text
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    _ENVIRONMENT = environment
    return environment


_ENVIRONMENT: jinja2.Environment | None = None


def _bounded_filter(function: Any) -> Any:
    import functools

    passes_context = hasattr(function, "jinja_pass_arg")

    @functools.wraps(function)  # keeps ``jinja_pass_arg``: Jinja still passes what it asked for
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_arguments(args[1:] if passes_context else args)
        _check_arguments(kwargs.values())
        return _check_size(function(*args, **kwargs))

    return bounded


def _budget_loops(tree: Any) -> Any:
    """Route every ``for`` loop's sequence through the render's :class:`_Budget`, and every
    ``~`` join through a size check: the sandbox bounds ``range`` but not loops over lists."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    for name in tree.find_all(nodes.Name):
        if name.name == _ITERATE:
            raise ChatTemplateError(f"the chat template may not use the name {_ITERATE}")

    class _Bound(NodeTransformer):
        def visit_For(self, node: nodes.For) -> nodes.Node:
            self.generic_visit(node)
            node.iter = nodes.Call(
                nodes.Name(_ITERATE, "load"), [node.iter], [], None, None
            ).set_lineno(node.lineno)
            return node

        def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
            self.generic_visit(node)
            return nodes.Filter(node, _BOUNDED_STRING, [], [], None, None).set_lineno(node.lineno)

    return _Bound().visit(tree)


_BOUNDED_STRING: Final = "skippy_bounded_string"


class ChatTemplate:
    """One compiled chat template, its capabilities, and the vocabulary texts it renders with."""

    __slots__ = ("_template", "add_bos", "add_eos", "bos_token", "caps", "eos_token", "source")

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        """Compile ``source``; :class:`ChatTemplateError` when it is too large or not Jinja."""
        if len(source.encode("utf-8", errors="replace")) > MAX_TEMPLATE_BYTES:
            raise ChatTemplateError(f"the chat template is larger than {MAX_TEMPLATE_BYTES} bytes")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._template = _compile(source)
        self.caps = self._probe_caps()

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of ``messages``; :class:`ChatTemplateError` for any failure.

        A chat that ends with an assistant message is that message to continue (llama-server's
        ``prefill_assistant``): the chat before it, the template's generation prompt, then the
        message's text, with no end of turn."""
        if not messages:
            raise ChatTemplateError("a chat needs at least one message")
        if add_generation_prompt and messages[-1].role == "assistant":
            if len(messages) >= 2 and messages[-2].role == "assistant":
                raise ChatTemplateError(
                    "Cannot have 2 or more assistant messages at the end of the list."
                )
            before = messages[:-1]
            without = self._apply(before, tools, chat_template_kwargs, add_generation_prompt=False)
            with_prompt = self._apply(
                before, tools, chat_template_kwargs, add_generation_prompt=True
            )
            generation_prompt = with_prompt[len(os.path.commonprefix([without, with_prompt])) :]
            return without + generation_prompt + _as_text(_content_of(messages[-1]))
        return self._apply(messages, tools, chat_template_kwargs, add_generation_prompt)

    def _apply(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Mapping[str, Any]] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        add_generation_prompt: bool,
    ) -> str:
        """llama.cpp's ``common_chat_template_direct_apply``: one render with its inputs."""
        chat = self._normalise(messages)
        context: dict[str, Any] = {
            "messages": chat,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "enable_thinking": self.caps.supports_thinking,
        }
        if tools:
            context["tools"] = [_tool_as_llama_server_sends_it(t) for t in tools]
        now = _now()
        context["datetime"] = now.strftime("%b %d %Y")
        context["date_string"] = now.strftime("%d %b %Y")
        if chat_template_kwargs:
            thinking = chat_template_kwargs.get("enable_thinking")
            if thinking is not None and not isinstance(thinking, bool):
                raise ChatTemplateError("chat_template_kwargs.enable_thinking must be a boolean")
            context.update(chat_template_kwargs)
        if add_generation_prompt:
            context["add_generation_prompt"] = True
        text = self._render_bounded(context)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text

    def _render_bounded(self, context: dict[str, Any]) -> str:
        budget = _Budget()
        context[_ITERATE] = budget.iterate
        size = 0
        pieces: list[str] = []
        try:
            for piece in self._template.generate(context):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    raise ChatTemplateError(
                        f"the chat template rendered more than {MAX_RENDER_CHARS} characters"
                    )
                pieces.append(piece)
        except ChatTemplateError:
            raise
        except RecursionError as error:
            raise ChatTemplateError("the chat template recursed too deeply") from error
        except MemoryError as error:
            raise ChatTemplateError("the chat template ran out of memory") from error
        except Exception as error:
            raise ChatTemplateError(f"the chat template failed: {_describe(error)}") from error
        text = "".join(pieces)
        if "\x00" in text:
            raise ChatTemplateError("the chat template rendered a NUL character")
        return text

    def _normalise(self, messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        """llama-server's messages for this template (see the module docstring)."""
        caps = self.caps
        only_typed = caps.supports_typed_content and not caps.supports_string_content
        only_string = caps.supports_string_content and not caps.supports_typed_content
        keep_developer = "<|channel|>" in self.source  # GPT-OSS knows the developer role
        chat: list[dict[str, Any]] = []
        for message in messages:
            if not message.role:
                raise ChatTemplateError("a chat message needs a role")
            role = "system" if message.role == "developer" and not keep_developer else message.role
            entry: dict[str, Any] = {"role": role}
            content: Any
            if message.content:
                content = message.content
            elif message.parts:
                content = [{"type": "text", "text": part} for part in message.parts]
            else:
                content = ""
            if only_typed and isinstance(content, str):
                content = [{"type": "text", "text": content}]
            elif only_string and isinstance(content, list):
                content = "\n".join(part["text"] for part in content)
            entry["content"] = content
            if message.reasoning_content:
                entry["reasoning_content"] = message.reasoning_content
            if message.name:
                entry["name"] = message.name
            if message.tool_call_id:
                entry["tool_call_id"] = message.tool_call_id
            if message.tool_calls:
                entry["tool_calls"] = [
                    self._tool_call(call, caps.supports_object_arguments)
                    for call in message.tool_calls
                ]
            chat.append(entry)
        if not caps.supports_system_role and chat and chat[0]["role"] == "system":
            first = chat.pop(0)
            if chat:
                chat[0]["content"] = f"{_as_text(first['content'])}\n{_as_text(chat[0]['content'])}"
        return chat

    @staticmethod
    def _tool_call(call: ToolCall, object_arguments: bool) -> dict[str, Any]:
        arguments: Any = call.arguments
        if object_arguments:
            try:
                arguments = json.loads(call.arguments)
            except ValueError as error:
                raise ChatTemplateError(
                    "a tool call's arguments are not JSON, and this template reads them as an "
                    "object"
                ) from error
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }
        if call.id:
            entry["id"] = call.id
        return entry

    def _probe_caps(self) -> TemplateCaps:
        """Render llama.cpp's probe chats and watch what the template reads."""
        marker = "STRING_MARKER"
        as_string = self._probe([{"role": "user", "content": marker}])
        as_parts = self._probe([{"role": "user", "content": [{"type": "text", "text": marker}]}])
        supports_string = as_string is not None and marker in as_string
        supports_typed = (
            as_parts is not None
            and marker in as_parts
            and "'type'" not in as_parts
            and '"type"' not in as_parts
        )
        system = self._probe(
            [
                {"role": "system", "content": "System message"},
                {"role": "user", "content": "User message"},
            ]
        )
        supports_system = system is not None and "System message" in system
        used: set[str] = set()
        arguments = _Watched({"arg": "value"}, used, "arguments")
        self._probe(
            [
                {"role": "user", "content": "User message"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call00001",
                            "type": "function",
                            "function": {"name": "tool1", "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                {"role": "assistant", "content": "The tool response was 'tool response'"},
                {"role": "user", "content": "User message"},
            ],
            tools=[
                {
                    "name": "tool",
                    "type": "function",
                    "function": {
                        "name": "tool1",
                        "description": "Tool description",
                        "parameters": {
                            "type": "object",
                            "properties": {
                                "arg": {"type": "string", "description": "Arg description"}
                            },
                            "required": ["arg"],
                        },
                    },
                }
            ],
            watched=used,
        )
        return TemplateCaps(
            supports_string_content=supports_string or not supports_typed,
            supports_typed_content=supports_typed,
            supports_system_role=supports_system,
            supports_object_arguments="arguments" in used,
            supports_thinking=self._opens_thinking(),
        )

    def _opens_thinking(self) -> bool:
        if "enable_thinking" not in self.source:
            return False
        chat = [{"role": "user", "content": "User message"}]
        on = self._probe(chat, extra={"enable_thinking": True, "add_generation_prompt": True})
        off = self._probe(chat, extra={"enable_thinking": False, "add_generation_prompt": True})
        if on is None or off is None or on == off:
            return False
        # What differs between the two renders is the reasoning switch: does it open, close or
        # announce a reasoning block (<think>, Gemma's <|think|>/thought channel)?
        start = len(os.path.commonprefix([on, off]))
        end = len(os.path.commonprefix([on[start:][::-1], off[start:][::-1]]))
        # A few characters either side: "<think>" against "</think>" differ in one "/".
        before = max(0, start - 8)
        changed = (on[before : len(on) - end + 8] + off[before : len(off) - end + 8]).lower()
        return "think" in changed or "thought" in changed

    def _probe(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        watched: set[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str | None:
        context: dict[str, Any] = {
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_generation_prompt": False,
            **(extra or {}),
        }
        if tools is not None:
            context["tools"] = tools
        try:
            if watched is None:
                return self._render_bounded(context)
            _WATCH.append(watched)
            try:
                return self._render_bounded(context)
            finally:
                _WATCH.pop()
        except ChatTemplateError:
            return None


_WATCH: list[set[str]] = []
"""Probes in progress: where :func:`_tojson` notes that it serialised a watched value."""


def _note_watched(value: Any) -> None:
    # llama.cpp's tojson marks everything it serialises as used.
    if isinstance(value, _Watched):
        value._note()
    if isinstance(value, dict):
        for item in dict.values(value):
            _note_watched(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _note_watched(item)


class _Watched(dict[str, Any]):
    """A probe's mapping that notes when a template reads into it (llama.cpp's ``stats.used``)."""

    def __init__(self, data: dict[str, Any], used: set[str], label: str) -> None:
        super().__init__(data)
        self._used = used
        self._label = label

    def _note(self) -> None:
        self._used.add(self._label)

    def __getitem__(self, key: str) -> Any:
        self._note()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note()
        return super().get(key, default)

    def items(self) -> Any:
        self._note()
        return super().items()

    def values(self) -> Any:
        self._note()
        return super().values()


def _compile(source: str) -> jinja2.Template:
    import jinja2

    environment = _environment()
    try:
        tree = _budget_loops(environment.parse(source))
        return environment.from_string(tree)
    except ChatTemplateError:
        raise
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"the chat template is not valid Jinja (line {error.lineno}): {error.message}"
        ) from error
    except Exception as error:
        raise ChatTemplateError(
            f"the chat template does not compile: {_describe(error)}"
        ) from error


def parse_check(source: str) -> None:
    """Raise :class:`ChatTemplateError` unless ``source`` is a template this module can serve
    (size and Jinja syntax): what a load checks before it moves any weights."""
    if len(source.encode("utf-8", errors="replace")) > MAX_TEMPLATE_BYTES:
        raise ChatTemplateError(f"the chat template is larger than {MAX_TEMPLATE_BYTES} bytes")
    _compile(source)


def read_template_file(path: str) -> tuple[str | None, str | None]:
    """``load --chat-template FILE``: the file's text, or why it cannot serve (size, UTF-8,
    Jinja syntax; the message never names the path). Read by the host before any weights move."""
    from pathlib import Path

    try:
        with Path(path).expanduser().open("rb") as file:
            data = file.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as error:
        return None, f"the file cannot be read ({error.strerror or type(error).__name__})"
    if len(data) > MAX_TEMPLATE_BYTES:
        return None, f"the file is larger than {MAX_TEMPLATE_BYTES} bytes"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "the file is not UTF-8 text"
    if not text.strip():
        return None, "the file is empty"
    try:
        parse_check(text)
    except ChatTemplateError as error:
        return None, str(error)
    return text, None


def _tool_as_llama_server_sends_it(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        raise ChatTemplateError("each tool must be {type: function, function: {...}}")
    name = function.get("name")
    if not isinstance(name, str):
        raise ChatTemplateError("each tool's function needs a name")
    description = function.get("description", "")
    parameters = function.get("parameters", {})
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description if description is not None else "",
            "parameters": parameters if parameters is not None else {},
        },
    }


def _content_of(message: ChatMessage) -> Any:
    if message.content is not None:
        return message.content
    return [{"type": "text", "text": part} for part in message.parts or ()]


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 500 else text[:500] + "…"
