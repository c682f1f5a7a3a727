"""The reply -> `tool_calls` parser (skippyctl/api/tool_calls.py): both forms, malformed calls,
several calls, text beside calls, and streamed deltas equal to the whole reply for any split."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.api.tool_calls import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    Delta,
    ParsedReply,
    ToolCallStream,
    collect,
    new_call_id,
    parse_reply,
)
from skippyctl.config.tool_call_format import ToolCallFormat, tool_call_format

TOOLS = ("get_weather", "add")
TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "templates"


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def parse(reply: str, *, parallel: bool = True, form: ToolCallFormat | None = None) -> ParsedReply:
    return parse_reply(reply, TOOLS, form=form, parallel=parallel, make_id=counter_ids())


def calls(parsed: ParsedReply) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


# -- Hermes / Qwen ---------------------------------------------------------------------------------


def test_hermes_single_call_is_a_call_without_content() -> None:
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parsed = parse(reply)
    assert parsed.content is None
    assert calls(parsed) == [("get_weather", {"city": "Paris"})]
    assert parsed.calls[0].arguments == '{"city": "Paris"}'  # the model's own JSON text
    assert parsed.calls[0].id == "call_0"


def test_hermes_several_calls_keep_their_order_and_text_before_is_content() -> None:
    reply = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": {"c": [2, 3]}}}\n</tool_call>'
    )
    parsed = parse(reply)
    assert parsed.content == "Let me check both.\n\n"
    assert calls(parsed) == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": {"c": [2, 3]}}),
    ]
    assert [c.id for c in parsed.calls] == ["call_0", "call_1"]


def test_without_parallel_calls_only_the_first_call_is_kept() -> None:
    reply = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    )
    assert calls(parse(reply, parallel=False)) == [("add", {"a": 1})]
    assert calls(parse(reply, parallel=True)) == [("add", {"a": 1}), ("add", {"a": 2})]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add"}</tool_call>',  # no arguments
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {}} trailing</tool_call>',
        '<tool_call>["add", {}]</tool_call>',
    ],
)
def test_a_malformed_block_stays_content(block: str) -> None:
    parsed = parse("Answer: " + block)
    assert parsed.calls == ()
    assert parsed.content == "Answer: " + block


def test_a_malformed_block_beside_a_good_one_is_content_and_the_good_one_a_call() -> None:
    good = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    parsed = parse("<tool_call>{oops}</tool_call>" + good)
    assert parsed.content == "<tool_call>{oops}</tool_call>"
    assert calls(parsed) == [("add", {"a": 1})]


def test_an_unterminated_call_stays_content() -> None:
    reply = 'Sure <tool_call>{"name": "add", "arguments": {"a":'
    assert parse(reply) == ParsedReply(reply, ())


def test_arguments_given_as_a_json_string_are_passed_through() -> None:
    parsed = parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed.calls[0].arguments == '{"a": 1}'


def test_a_reply_without_calls_is_all_content_whitespace_included() -> None:
    for reply in ("Hello there.", "  \n", "", "a < b and <tool", "x <tool_call"):
        assert parse(reply) == ParsedReply(reply, ())


@pytest.mark.parametrize("form", list(ToolCallFormat))
def test_under_a_template_s_form_the_reply_s_leading_space_is_not_content(
    form: ToolCallFormat,
) -> None:
    # llama-server: the generation prompt, optional space, then content and calls.
    assert parse("\n It is sunny. \n", form=form) == ParsedReply("It is sunny. \n", ())
    assert parse(" \n\t", form=form) == ParsedReply("", ())
    assert parse("a\n b", form=form) == ParsedReply("a\n b", ())
    # Unicode space that C's isspace does not know stays.
    assert parse("\u00a0x", form=form) == ParsedReply("\u00a0x", ())


# -- Llama 3.x JSON --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ' \n{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}\n',
        '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
    ],
)
def test_llama3_whole_reply_json_is_a_call(reply: str) -> None:
    parsed = parse(reply)
    assert parsed.content is None
    assert calls(parsed) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "not_a_tool", "parameters": {}}',  # any JSON answer could look like a call
        '{"name": "add", "parameters": {}} and more',
        'I will call {"name": "add", "parameters": {}}',
        '{"name": "add", "parameters": {}',
        '{"answer": 42}',
    ],
)
def test_json_that_is_not_exactly_one_known_call_is_content(reply: str) -> None:
    assert parse(reply) == ParsedReply(reply, ())


# -- the template's form -----------------------------------------------------------------------


def test_a_hermes_template_s_replies_are_read_only_for_blocks() -> None:
    bare = '{"name": "add", "parameters": {"a": 1}}'
    assert parse(bare, form=ToolCallFormat.HERMES) == ParsedReply(bare, ())
    block = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert calls(parse(block, form=ToolCallFormat.HERMES)) == [("add", {"a": 1})]


def test_a_llama3_template_s_replies_are_read_only_as_bare_json() -> None:
    block = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert parse(block, form=ToolCallFormat.LLAMA3_JSON) == ParsedReply(block, ())
    bare = '{"name": "add", "parameters": {"a": 1}}'
    assert calls(parse(bare, form=ToolCallFormat.LLAMA3_JSON)) == [("add", {"a": 1})]


# -- template detection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolCallFormat.HERMES),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat.HERMES),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat.LLAMA3_JSON),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat.LLAMA3_JSON),
        ("google-gemma-2-2b-it.jinja", None),
        ("fireworks-ai-llama-3-firefunction-v2.jinja", None),
    ],
)
def test_the_format_is_told_from_the_template_text(
    name: str, expected: ToolCallFormat | None
) -> None:
    path = TEMPLATES / name
    if not path.exists():
        pytest.skip(f"vendored template {name} not in fixtures/vendor/templates")
    assert tool_call_format(path.read_text()) == expected


def test_call_ids_look_like_openai_ids_and_differ() -> None:
    first, second = new_call_id(), new_call_id()
    assert first.startswith("call_") and len(first) == len("call_") + 24
    assert first != second


# -- streaming -------------------------------------------------------------------------------------


def stream(
    pieces: list[str], *, parallel: bool = True, form: ToolCallFormat | None = None
) -> list[Delta]:
    parser = ToolCallStream(TOOLS, form=form, parallel=parallel, make_id=counter_ids())
    out: list[Delta] = []
    for piece in pieces:
        out.extend(parser.feed(piece))
    out.extend(parser.finish())
    return out


def test_streamed_call_starts_with_id_and_name_then_its_arguments() -> None:
    deltas = stream(
        [
            "Checking",
            " now <tool",
            '_call>{"name": "add", ',
            '"arguments": {"a": 1}}</tool_call>',
        ]
    )
    assert deltas == [
        ContentDelta("Checking"),
        ContentDelta(" now "),
        CallStart(0, "call_0", "add"),
        ArgumentsDelta(0, '{"a": 1}'),
    ]


def test_streamed_text_that_only_looked_like_a_tag_is_released() -> None:
    deltas = stream(["a <tool", "box> b"])
    assert deltas == [ContentDelta("a "), ContentDelta("<toolbox> b")]


def test_streamed_content_is_not_held_while_no_tag_can_start() -> None:
    parser = ToolCallStream(TOOLS)
    assert parser.feed("Hello") == [ContentDelta("Hello")]
    assert parser.feed(" world.") == [ContentDelta(" world.")]


REPLIES = [
    "Plain answer with no calls at all.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "Before.\n"
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
    "<tool_call>{broken}</tool_call>"
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call> after',
    '  {"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "add", "arguments": {"a": 2}}',
    '{"name": "unknown", "parameters": {}}',
    'Partial <tool_call>{"name": "add", "argu',
    '\n\n<tool_call>{"name": "add", "arguments": {}}</tool_call>\n\n',
    '<tool<tool_call>{"name": "add", "arguments": {}}</tool_call></tool_call>',
]


@given(
    reply=st.sampled_from(REPLIES),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    parallel=st.booleans(),
    form=st.sampled_from([None, *ToolCallFormat]),
)
def test_any_split_into_deltas_gives_the_whole_reply_s_calls_and_content(
    reply: str, cuts: list[int], parallel: bool, form: ToolCallFormat | None
) -> None:
    points = sorted({c % (len(reply) + 1) for c in cuts})
    pieces = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)], strict=True)]
    whole = parse(reply, parallel=parallel, form=form)
    assert collect(stream(pieces, parallel=parallel, form=form)) == whole


@given(text=st.text(alphabet='<>/{}":, atoolcalnme_\n', max_size=80), data=st.data())
def test_any_split_of_any_text_agrees_with_the_whole(text: str, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=8))
    points = sorted(set(cuts))
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    streamed = collect(stream(pieces))
    assert streamed == parse(text)
    if not streamed.calls:  # nothing is lost: without calls the content is the text
        assert streamed.content == text


def test_streamed_deltas_of_one_call_come_in_order_start_then_arguments() -> None:
    deltas = stream(list(REPLIES[2]))  # one character at a time
    kinds = [type(d).__name__ for d in deltas if not isinstance(d, ContentDelta)]
    assert kinds == ["CallStart", "ArgumentsDelta"] * 2
    starts = [d for d in deltas if isinstance(d, CallStart)]
    assert [s.index for s in starts] == [0, 1]
