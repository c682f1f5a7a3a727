"""Which form of tool call a chat template teaches its model, told from the template's text.

llama.cpp's server tells the forms apart by what a template's source contains (common/chat.cpp);
this does the same for the two forms the host parses (``api/tool_calls.py``). The engine, which
holds the template, reports the form when its context is ready (``ContextReturned``); the host
reads replies of that model's chat requests accordingly. Here, below both, since both name it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

OPEN_TAG: Final = "<tool_call>"
PYTHON_TAG: Final = "<|python_tag|>"
"""Llama 3.1's marker before a call (a special token; it reaches the text only if rendered)."""


class ToolCallFormat(StrEnum):
    """How a template teaches the model to call tools (a wire value: add, never rename)."""

    HERMES = "hermes"
    """`<tool_call>{json}</tool_call>` blocks (Hermes 2 Pro, Qwen 2.5/3)."""
    LLAMA3_JSON = "llama3_json"
    """The whole reply is one JSON object (Llama 3.x)."""


def tool_call_format(template_source: str | None) -> ToolCallFormat | None:
    """The call form a chat template teaches: `<tool_call>` -> Hermes; Llama 3.x's
    `<|start_header_id|>` with `ipython` or `<|python_tag|>` -> JSON; None when it teaches
    neither (or there is no template)."""
    if not template_source:
        return None
    if OPEN_TAG in template_source:
        return ToolCallFormat.HERMES
    if "<|start_header_id|>" in template_source and (
        "ipython" in template_source or PYTHON_TAG in template_source
    ):
        return ToolCallFormat.LLAMA3_JSON
    return None
