"""`tool_choice: required` or a named function: the JSON schema (and tags) that force one call.

As llama-server does, a call is forced with a grammar: the reply must be one call, written in the
form the model's chat template teaches (config/tool_call_format.py), of one of the request's
tools (`required`) or of the named one, with arguments that satisfy that tool's `parameters`
schema. This builds the call's JSON schema — `{"name": <const>, "arguments" | "parameters": <the
tool's parameters>}`, one `anyOf` branch per tool — and, for the Hermes form, the `<tool_call>`
tags around it; the engine turns them into the grammar (engine/sampling.py). The reply is then
read for calls like any other (api/tool_calls.py).

Refused (400 naming `tool_choice`): a template that teaches no form (there is no form to force),
a name that is not one of `tools`, `required` or a name without `tools`, and a forced call with
`response_format` or `grammar` (one constraint per reply).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from skippyctl.api.schemas import ChatCompletionBody, NamedToolChoice
from skippyctl.config.tool_call_format import OPEN_TAG, ToolCallFormat
from skippyctl.runtime.requests import InvalidRequest

HERMES_TAGS: Final = (OPEN_TAG + "\n", "\n</tool_call>")
"""A Hermes call's tags as the templates teach them (llama-server allows space around the JSON)."""
ARGUMENTS_KEY: Final = {
    ToolCallFormat.HERMES: "arguments",
    ToolCallFormat.LLAMA3_JSON: "parameters",
}
"""The key of a call's arguments in each form, as its templates teach it."""
ANY_OBJECT: Final = {"type": "object"}


def forced_tool_call(
    body: ChatCompletionBody, form: ToolCallFormat | None
) -> tuple[str, tuple[str, str] | None] | None:
    """The JSON schema text and tags that force the call `body.tool_choice` asks for; None when
    it asks for none (`auto`, `none`, absent). :class:`InvalidRequest` when it cannot be served."""
    choice = body.tool_choice
    if choice is None or choice in ("auto", "none"):
        return None
    tools = body.tools or []
    if not tools:
        raise InvalidRequest("tool_choice", "a required or named tool call needs 'tools'")
    if body.response_format is not None or body.grammar is not None:
        raise InvalidRequest(
            "tool_choice", "a forced tool call cannot be combined with response_format or grammar"
        )
    if form is None:
        raise InvalidRequest(
            "tool_choice",
            "the model's chat template teaches no tool-call form, so a call cannot be forced "
            "(load it with a --chat-template that has a tools section)",
        )
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise InvalidRequest("tool_choice", "tool_choice names a function that 'tools' lacks")
    else:
        chosen = list(tools)
    key = ARGUMENTS_KEY[form]
    branches = [_call_schema(t.function.name, t.function.parameters, key) for t in chosen]
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    tags = HERMES_TAGS if form is ToolCallFormat.HERMES else None
    return orjson.dumps(schema).decode(), tags


def _call_schema(name: str, parameters: dict[str, Any] | None, key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters or ANY_OBJECT},
        "required": ["name", key],
    }
