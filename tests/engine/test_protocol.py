"""The engine protocol's codec: every message survives encode → decode, and nothing a peer can
send makes a decoder raise anything but MalformedMessage (one that still names its command)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import pkgutil
import types
import typing
from typing import Any, Union

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import skippyctl.engine
from skippyctl.config.load_options import LoadOptions, SpecMode
from skippyctl.engine import protocol
from skippyctl.engine.chat_template import ChatMessage, ToolCall
from skippyctl.engine.protocol import (
    MalformedMessage,
    UnencodableMessage,
    decode_command,
    decode_engine_message,
    encode,
)
from skippyctl.engine.protocol_commands import (
    Cancel,
    Command,
    Generate,
    Load,
    Ping,
    Sampling,
    Shutdown,
)
from skippyctl.engine.protocol_messages import (
    EngineMessage,
    GenDone,
    GenStarted,
    Kv,
    KvChange,
    LoadReturned,
    Pong,
    SessionChange,
    SessionChanged,
)
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import CacheResult, GenerationOutcome, ReasonCode

COMMANDS = typing.get_args(Command)
ENGINE_MESSAGES = typing.get_args(EngineMessage)
# Text JSON can carry (a lone surrogate cannot be UTF-8: see the unencodable test below).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Values of one annotated protocol field (mirrors the decoder's accepted types)."""
    if hint is str:
        return TEXT
    if hint is bool:
        return st.booleans()
    if hint is int:
        return INT64
    if hint is float:
        return FLOATS
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return builds(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        (inner,) = (a for a in args if a is not type(None))
        return st.none() | strategy_for(inner)
    if origin is dict:
        return st.dictionaries(TEXT, st.none() | st.booleans() | INT64 | TEXT, max_size=3)
    if origin is tuple and args[-1] is Ellipsis:
        return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
    if origin is tuple:
        return st.tuples(*(strategy_for(a) for a in args))
    raise AssertionError(f"no strategy for {hint!r}")


def builds(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


@pytest.mark.parametrize("cls", [*COMMANDS, *ENGINE_MESSAGES], ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_message_survives_encode_then_decode(cls: type, data: st.DataObject) -> None:
    message = data.draw(builds(cls))
    decode = decode_command if cls in COMMANDS else decode_engine_message
    assert decode(encode(message)) == message


def test_each_direction_decodes_only_its_own_messages() -> None:
    with pytest.raises(MalformedMessage):
        decode_engine_message(encode(Ping(1)))
    with pytest.raises(MalformedMessage):
        decode_command(encode(Pong(1)))


def test_every_union_member_has_one_wire_tag() -> None:
    assert set(protocol.TAGS) == {*COMMANDS, *ENGINE_MESSAGES}
    tags = list(protocol.TAGS.values())
    assert len(tags) == len(set(tags))
    assert protocol.tag_of(Shutdown()) == "shutdown"
    assert protocol.tag_of(SessionChanged("s", SessionChange.CREATED, 0, 0)) == "session"


def test_a_field_defaulting_to_none_is_absent_while_none_and_others_are_always_there() -> None:
    assert orjson.loads(encode(Kv(KvChange.INITIALIZED, 0, 256))) == {
        "msg": "kv",
        "event": "initialized",
        "cells_used": 0,
        "cells_total": 256,
    }
    assert orjson.loads(encode(LoadReturned("load-1", ok=False))) == {
        "msg": "load_returned",
        "operation_id": "load-1",
        "ok": False,
    }
    done = orjson.loads(encode(GenDone.refused("r", ReasonCode.CONTEXT_EXHAUSTED)))
    figures = done["figures"]  # a nested record: all of its fields present, None too
    assert figures["ttft_ms"] is None and figures["decode_tokens_per_s"] is None
    assert (done["outcome"], done["reason"], done["stop_reason"]) == (
        "failed",
        "context_exhausted",
        "error",
    )


def test_the_engine_speaks_the_events_enums() -> None:
    hints = typing.get_type_hints(GenDone)
    assert hints["outcome"] is GenerationOutcome
    assert hints["stop_reason"] is StopReason
    assert hints["reason"] == ReasonCode | None
    assert typing.get_type_hints(GenStarted)["cache"] is CacheResult
    # ... and keeps no copies of them.
    copies = {"StopReason", "GenerationOutcome", "CacheResult", "Outcome", "ReasonCode"}
    for info in pkgutil.iter_modules(skippyctl.engine.__path__):
        module = importlib.import_module(f"skippyctl.engine.{info.name}")
        for name in copies:
            found = getattr(module, name, None)
            assert found is None or not found.__module__.startswith("skippyctl.engine"), name


@pytest.mark.parametrize(
    ("payload", "tag", "correlation"),
    [
        ({"op": "generate", "request_id": "r1", "max_tokens": "many"}, "generate", "r1"),
        ({"op": "generate", "request_id": "r2", "max_tokens": True}, "generate", "r2"),
        ({"op": "generate", "request_id": "r3", "prompt": ["not", "text"]}, "generate", "r3"),
        ({"op": "generate", "request_id": "r4", "sampling": {"no_such_knob": 1}}, "generate", "r4"),
        (
            {"op": "generate", "request_id": "r5", "sampling": {"logit_bias": [[1]]}},
            "generate",
            "r5",
        ),
        ({"op": "generate", "request_id": "r6", "messages": [{"content": "x"}]}, "generate", "r6"),
        ({"op": "generate", "request_id": "r7", "extra": 1}, "generate", "r7"),
        ({"op": "generate", "request_id": 7}, "generate", None),
        ({"op": "load", "operation_id": "load-x", "native_operation": "x"}, "load", "load-x"),
        ({"op": "cancel"}, "cancel", None),
        ({"op": "ping", "seq": 1.5}, "ping", None),
    ],
)
def test_an_ill_typed_command_is_malformed_and_names_what_it_can(
    payload: dict[str, Any], tag: str, correlation: str | None
) -> None:
    with pytest.raises(MalformedMessage) as raised:
        decode_command(orjson.dumps(payload))
    assert (raised.value.tag, raised.value.correlation_id) == (tag, correlation)
    assert "many" not in str(raised.value) and "text" not in str(raised.value)  # no echo


@pytest.mark.parametrize(
    "payload",
    [
        {"msg": "gen_done", "request_id": "r", "outcome": "exploded"},
        {"msg": "gen_started", "request_id": "r", "cache": "lukewarm"},
        {"msg": "kv", "event": "initialized", "cells_used": 0},
        {"msg": "hello"},
        {"msg": "no_such_message"},
        {"op": "ping", "seq": 1},
        {"msg": 3},
        {},
    ],
)
def test_an_unknown_or_ill_typed_engine_message_is_malformed(payload: dict[str, Any]) -> None:
    with pytest.raises(MalformedMessage):
        decode_engine_message(orjson.dumps(payload))


JSON = st.recursive(
    st.none() | st.booleans() | INT64 | FLOATS | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
TAGS = st.sampled_from(
    [
        "load",
        "generate",
        "cancel",
        "drop_session",
        "ping",
        "shutdown",
        "gen_done",
        "kv",
        "hello",
        "session",
        "x",
    ]
)
FIELD_NAMES = st.sampled_from(
    ["request_id", "operation_id", "seq", "prompt", "messages", "sampling", "stop", "max_tokens",
     "outcome", "reason", "stop_reason", "event", "lanes", "path", "ok", "session", "zzz"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    key=st.sampled_from(["op", "msg"]),
    tag=TAGS,
    fields=st.dictionaries(FIELD_NAMES, JSON, max_size=6),
)
def test_decoding_any_payload_gives_a_message_or_malformed_never_another_error(
    key: str, tag: str, fields: dict[str, Any]
) -> None:
    payload = orjson.dumps({key: tag, **fields})
    for decode in (decode_command, decode_engine_message):
        with contextlib.suppress(MalformedMessage):
            decode(payload)


def test_text_json_cannot_carry_is_unencodable() -> None:
    with pytest.raises(UnencodableMessage):
        encode(Generate("r", prompt="lone \ud800 surrogate"))
    with pytest.raises(UnencodableMessage):
        encode(Generate("r", prompt="hi", sampling=Sampling(seed=1 << 70)))


def test_generate_carries_tool_calls_tools_and_template_variables() -> None:
    command = Generate(
        "r",
        messages=(
            ChatMessage("user", None, parts=("a", "b")),
            ChatMessage("assistant", None, tool_calls=(ToolCall("f", '{"x": 1}', id="c1"),)),
            ChatMessage("tool", "42", tool_call_id="c1", name="f"),
        ),
        tools=({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},),
        chat_template_kwargs={"enable_thinking": False, "nested": {"k": [1, "two", None]}},
    )
    assert decode_command(encode(command)) == command
    bad_tools = orjson.loads(encode(command))
    bad_tools["tools"] = ["not an object"]
    with pytest.raises(MalformedMessage):
        decode_command(orjson.dumps(bad_tools))
    bad_kwargs = orjson.loads(encode(command))
    bad_kwargs["chat_template_kwargs"] = [1]
    with pytest.raises(MalformedMessage):
        decode_command(orjson.dumps(bad_kwargs))
    bad_call = orjson.loads(encode(command))
    bad_call["messages"][1]["tool_calls"][0]["arguments"] = {"x": 1}  # text on the wire
    with pytest.raises(MalformedMessage):
        decode_command(orjson.dumps(bad_call))


def test_commands_carry_chat_messages_and_sampling_as_nested_records() -> None:
    command = Generate(
        "r",
        messages=(ChatMessage("user", "hi"),),
        stop=("x",),
        sampling=Sampling(temperature=0, logit_bias=((3, -1.5),)),
    )
    payload = orjson.loads(encode(command))
    assert payload["messages"] == [
        {
            "role": "user",
            "content": "hi",
            "parts": None,
            "tool_calls": [],
            "name": None,
            "tool_call_id": None,
            "reasoning_content": None,
        }
    ]
    assert payload["sampling"]["logit_bias"] == [[3, -1.5]]
    assert "prompt" not in payload and "timeout_s" not in payload
    decoded = decode_command(encode(command))
    assert decoded == command
    assert isinstance(decoded, Generate) and decoded.sampling.temperature == 0.0
    assert decode_command(encode(Cancel("r"))) == Cancel("r")
    load = Load(
        "l", 1, 2, LoadOptions("m.gguf", lanes=1, spec=SpecMode.NGRAM, stages=("1.2.3.4:5",))
    )
    assert decode_command(encode(load)) == load
