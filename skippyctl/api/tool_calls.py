"""A chat reply's text -> OpenAI `tool_calls`: whole replies and streamed deltas.

When a chat request offers `tools` (and `tool_choice` is not `none`), the model's reply is read
for calls in the two forms llama.cpp's server parses for the model families that use them:

- **Hermes 2 Pro / Qwen** (templates that contain `<tool_call>`): one or several
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (whitespace around the JSON is
  allowed). Text outside the blocks is the reply's `content`.
- **Llama 3.x JSON**: the whole reply (after an optional `<|python_tag|>`) is one object
  `{"name": ..., "parameters": {...}}` (or `"arguments"`; a `"type": "function"` key is allowed).
  Since any JSON answer could look like that, the name must be one of the request's tools.

Which forms a reply is read for is the template's to say, as in llama-server: the engine
reports the form its template teaches (`skippyctl.config.tool_call_format`), and a reply of a
Hermes template is read only for blocks, one of a Llama 3 template only as bare JSON. A template
that teaches neither (e.g. one without a tools section) has its replies read for both forms —
unlike llama-server, which then returns the text: a client that offered tools gets the calls the
model wrote (the forms cannot be confused: a reply is either wrapped in `<tool_call>` or is one
bare object).

What a malformed call becomes: as llama.cpp does, text that does not parse as a call stays
`content` — a block whose JSON is invalid or lacks a string `name` and an object (or string)
`arguments`, or an unterminated `<tool_call>` (the reply hit `max_tokens`), is left as the text
it was. A call's `arguments` is the JSON text the model wrote (a JSON string, as OpenAI sends
it); ids are `call_` + 24 random hex digits. With `parallel_tool_calls` false only the first call
is kept (OpenAI's "at most one"); later blocks are dropped, not turned into content.

:class:`ToolCallStream` gives the same result delta by delta: it holds back text that may be the
start of `<tool_call>` (as the engine's StopMatcher holds stop-string prefixes), a block until it
closes, and a reply that begins like a bare JSON object until it ends. For any split of a reply
into deltas, the concatenated content deltas and the calls equal :func:`parse_reply`'s. Content
that is only whitespace beside calls is dropped (the reply's `content` is then null). Under a
template that teaches a form, the reply's leading whitespace is not content either: llama-server
parses such a reply as the generation prompt, optional space, then content and calls (llama.cpp
common/chat-auto-parser-generator.cpp), so "\nIt is sunny." is "It is sunny." on both.

Nothing here logs: names, arguments and text stay with the caller.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from skippyctl.config.tool_call_format import OPEN_TAG, PYTHON_TAG, ToolCallFormat

CLOSE_TAG: Final = "</tool_call>"
SPACE: Final = " \t\n\v\f\r"
"""What llama.cpp's parsers take as space (C `isspace`)."""


def new_call_id() -> str:
    """`call_` + 24 random hex digits, as OpenAI's ids look."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments as JSON text (OpenAI sends a string)."""

    def document(self) -> dict[str, Any]:
        """The call as a non-streamed message's `tool_calls` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str | None
    """The text outside calls; None when the reply was only calls (and whitespace)."""
    calls: tuple[ToolCall, ...]


# -- reading one call ------------------------------------------------------------------------------

_DECODER: Final = json.JSONDecoder()
_WHITESPACE: Final = " \t\n\r"


def _skip_ws(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def _object_members(text: str) -> dict[str, tuple[Any, str]] | None:
    """A JSON object's members as (value, the value's own text), or None if `text` (stripped)
    is not exactly one JSON object. The text is kept so `arguments` go out as the model wrote
    them (as llama.cpp's server sends them)."""
    at = _skip_ws(text, 0)
    if not text.startswith("{", at):
        return None
    try:  # validates the whole object once; the member scan below cannot then fail
        _value, end = _DECODER.raw_decode(text, at)
    except ValueError:
        return None
    if _skip_ws(text, end) != len(text):
        return None
    members: dict[str, tuple[Any, str]] = {}
    at = _skip_ws(text, at + 1)
    while text[at] != "}":
        key, at = _DECODER.raw_decode(text, at)
        at = _skip_ws(text, _skip_ws(text, at) + 1)  # past ':'
        value, value_end = _DECODER.raw_decode(text, at)
        members[key] = (value, text[at:value_end])
        at = _skip_ws(text, value_end)
        if text[at] == ",":
            at = _skip_ws(text, at + 1)
    return members


def _call_from_json(
    text: str, argument_keys: tuple[str, ...], make_id: Callable[[], str]
) -> ToolCall | None:
    """The call that `text` (one JSON object) states, or None if it is not one."""
    members = _object_members(text)
    if members is None:
        return None
    name = members.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name:
        return None
    for key in argument_keys:
        if key in members:
            value, raw = members[key]
            if isinstance(value, dict):
                return ToolCall(make_id(), name, raw)
            if isinstance(value, str):  # some models write the arguments as a JSON string
                return ToolCall(make_id(), name, value)
            return None
    return None


def _hermes_call(body: str, make_id: Callable[[], str]) -> ToolCall | None:
    return _call_from_json(body, ("arguments", "parameters"), make_id)


def _bare_json_call(
    reply: str, tool_names: Collection[str], make_id: Callable[[], str]
) -> ToolCall | None:
    text = reply.lstrip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :]
    call = _call_from_json(text, ("parameters", "arguments"), make_id)
    if call is None or call.name not in tool_names:
        return None
    return call


def _may_be_bare_json(prefix: str) -> bool:
    """Whether a reply starting with `prefix` (no call released yet) may be a bare JSON call."""
    text = prefix.lstrip()
    if not text:
        return True
    if text.startswith(PYTHON_TAG):
        return True
    if PYTHON_TAG.startswith(text):
        return True
    return text.startswith("{")


# -- whole replies ---------------------------------------------------------------------------------


def parse_reply(
    reply: str,
    tool_names: Collection[str],
    *,
    form: ToolCallFormat | None = None,
    parallel: bool = True,
    make_id: Callable[[], str] = new_call_id,
) -> ParsedReply:
    """The calls in `reply` and the content beside them (see the module docstring); `form`:
    the template's, None for both."""
    stream = ToolCallStream(tool_names, form=form, parallel=parallel, make_id=make_id)
    deltas = stream.feed(reply) + stream.finish()
    return collect(deltas)


def collect(deltas: list[Delta]) -> ParsedReply:
    """A reply's deltas folded back into content and calls."""
    content: list[str] = []
    heads: list[CallStart] = []
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            content.append(delta.text)
        elif isinstance(delta, CallStart):
            heads.append(delta)
            arguments[delta.index] = []
        else:
            arguments[delta.index].append(delta.fragment)
    calls = tuple(ToolCall(h.id, h.name, "".join(arguments[h.index])) for h in heads)
    text = "".join(content)
    return ParsedReply(None if calls and not text.strip() else text, calls)


# -- streamed replies ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call's first delta: its index among the reply's calls, id and name (arguments follow)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    index: int
    fragment: str


Delta = ContentDelta | CallStart | ArgumentsDelta


@dataclass(slots=True)
class ToolCallStream:
    """Feed a reply's text deltas; get content and call deltas (see the module docstring).

    Every call is held until it is complete, then given as a :class:`CallStart` and one
    :class:`ArgumentsDelta`: a call that turns out malformed is still content, which could not
    be taken back once part of it went out as a call."""

    tool_names: Collection[str]
    form: ToolCallFormat | None = None
    """The form the model's template teaches; None: both."""
    parallel: bool = True
    make_id: Callable[[], str] = new_call_id
    _pending: str = ""
    """Text not yet released: a possible `<tool_call>` prefix, an open block, or the whole
    reply while it may still be a bare JSON call."""
    _whitespace: str = ""
    """Whitespace-only content held until real content or the end says whether it goes out."""
    _content_seen: bool = False
    _bare_possible: bool = True
    _calls: int = 0
    _out: list[Delta] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._bare_possible = self.form is not ToolCallFormat.HERMES

    @property
    def call_count(self) -> int:
        return self._calls

    def feed(self, text: str) -> list[Delta]:
        """The deltas `text` releases (possibly none: it may be held)."""
        self._pending += text
        self._advance(final=False)
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Delta]:
        """The deltas held until the reply ended (the stream is then spent)."""
        if self._bare_possible:
            self._bare_possible = False
            call = _bare_json_call(self._pending, self.tool_names, self.make_id)
            if call is not None:
                self._pending = ""
                self._emit_call(call)
        self._advance(final=True)
        if self._pending:  # an unterminated block, or a possible tag that never completed
            self._content(self._pending)
            self._pending = ""
        if not self._calls and self._whitespace and self.form is None:
            self._out.append(ContentDelta(self._whitespace))
        self._whitespace = ""
        out, self._out = self._out, []
        return out

    def _advance(self, *, final: bool) -> None:
        if self._bare_possible:
            if _may_be_bare_json(self._pending) and not final:
                return
            self._bare_possible = False
        if self.form is ToolCallFormat.LLAMA3_JSON:  # no blocks to look for
            self._content(self._pending)
            self._pending = ""
            return
        while self._pending:
            start = self._pending.find(OPEN_TAG)
            if start < 0:
                keep = _tag_prefix_length(self._pending)
                self._content(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                return
            end = self._pending.find(CLOSE_TAG, start + len(OPEN_TAG))
            if end < 0:
                self._content(self._pending[:start])
                self._pending = self._pending[start:]
                return
            self._content(self._pending[:start])
            block = self._pending[start : end + len(CLOSE_TAG)]
            self._pending = self._pending[end + len(CLOSE_TAG) :]
            call = _hermes_call(block[len(OPEN_TAG) : -len(CLOSE_TAG)], self.make_id)
            if call is None:
                self._content(block)
            elif self.parallel or not self._calls:
                self._emit_call(call)

    def _content(self, text: str) -> None:
        if not text:
            return
        if not self._content_seen and not text.strip(SPACE):
            self._whitespace += text
            return
        if not self._content_seen and self.form is not None:
            self._whitespace = ""  # the space after the generation prompt (module docstring)
            text = text.lstrip(SPACE)
        self._content_seen = True
        self._out.append(ContentDelta(self._whitespace + text))
        self._whitespace = ""

    def _emit_call(self, call: ToolCall) -> None:
        index = self._calls
        self._calls += 1
        self._out.append(CallStart(index, call.id, call.name))
        self._out.append(ArgumentsDelta(index, call.arguments))


def _tag_prefix_length(text: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of `<tool_call>`."""
    for length in range(min(len(text), len(OPEN_TAG) - 1), 0, -1):
        if OPEN_TAG.startswith(text[-length:]):
            return length
    return 0
