"""The engine protocol: every message of the control channel as a frozen, slotted type, and the
codec that puts them on the wire.

Two tagged unions, one per direction, each in its own module:

- :data:`~skippyctl.engine.protocol_commands.Command` (host → engine, tag key ``op``;
  ``engine/protocol_commands.py``): ``Load``, ``Generate``, ``Cancel``, ``AttachStream``,
  ``ReleaseText``, ``DropSession``, ``Ping``, ``Shutdown``, ``SaveSessions``.
- :data:`~skippyctl.engine.protocol_messages.EngineMessage` (engine → host, tag key ``msg``;
  ``engine/protocol_messages.py``): ``Hello``, ``Pong``, ``ProtocolError``, the load replies
  (``LoadBegun``, ``LoadReturned``, ``ContextBegun``, ``ContextReturned``), the serving messages
  (``ServingMessage``: generation observations, ``GenDone``, ``Kv``, ``SessionChanged``) and the
  resource messages.

:func:`encode` turns a message into the JSON payload of one frame; :func:`decode_command` and
:func:`decode_engine_message` are the same table-driven decoder for each direction. The types are
the single definition of the wire: a field's name is its key, its annotation says what a decoder
accepts (exact JSON types, enum values, nested records), and a field whose default is ``None`` is
absent from the payload while it is ``None``. Decoding is strict — an unknown tag, a missing,
unknown or ill-typed field, a message of the other direction — and raises
:class:`MalformedMessage`, never anything else; the error keeps the tag and the request or
operation id when the payload had them, so the receiver can end that one command. The wire format
is internal to one host and its engines (not a public contract); it changes with this module.

Privacy (ARCHITECTURE.md section 4): completion text travels only in ``GenText.text`` (and a
chat template's refusal only in ``GenDone.detail``), prompt text only in ``Generate``, a model
path only in ``Load`` — none of them ever reaches an event. ``dict[str, Any]`` fields (tools,
template variables) are JSON objects taken as decoded. Every other message carries counts,
durations and logical ids only; no token ids.
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

from skippyctl.engine.protocol_commands import (
    AttachStream,
    Cancel,
    Command,
    Detokenize,
    DropSession,
    Embed,
    Generate,
    Load,
    Ping,
    ReleaseText,
    SaveSessions,
    Shutdown,
    Tokenize,
)
from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    ComputeFailed,
    ContextBegun,
    ContextReturned,
    CpuFallback,
    DeviceMemory,
    EmbeddingAnswer,
    EngineMessage,
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenSpecSwitched,
    GenStarted,
    GenText,
    GenToken,
    Hello,
    Kv,
    Link,
    LoadBegun,
    LoadPhase,
    LoadReturned,
    MemoryAllocated,
    PluginCounters,
    PluginReported,
    Pong,
    ProtocolError,
    SessionChanged,
    StateExported,
    StateImported,
    VocabularyAnswer,
)

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


Message = Command | EngineMessage
"""Any message of the control channel, either direction."""


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


def _json_object(value: object) -> object:
    if type(value) is not dict:
        raise TypeError("expected an object")
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
    if origin is dict and args and args[0] is str:
        # JSON-compatible data (tools, template variables): the decoder already produced
        # JSON types; only the top-level object is checked.
        return _json_object
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
        _spec("op", "attach_stream", AttachStream),
        _spec("op", "release_text", ReleaseText),
        _spec("op", "drop_session", DropSession),
        _spec("op", "ping", Ping),
        _spec("op", "shutdown", Shutdown),
        _spec("op", "save_sessions", SaveSessions),
        _spec("op", "tokenize", Tokenize),
        _spec("op", "detokenize", Detokenize),
        _spec("op", "embed", Embed),
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
        _spec("msg", "gen_spec_switched", GenSpecSwitched),
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
        _spec("msg", "device_memory", DeviceMemory),
        _spec("msg", "plugin_reported", PluginReported),
        _spec("msg", "plugin_counters", PluginCounters),
        _spec("msg", "vocabulary_answer", VocabularyAnswer),
        _spec("msg", "embedding_answer", EmbeddingAnswer),
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
