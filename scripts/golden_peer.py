"""What the golden scripts (scripts/golden_*.py) share: the llama-server they ask, a chat
answer's comparable fields, and how a golden file is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from benchmarks import llama_server_build


def use_binary(path: Path | None) -> None:
    """Ask the llama-server at `path` (built elsewhere) instead of the build cache's."""
    if path is None:
        return
    # start_llama_server looks the peer up through these two.
    directory = path.resolve().parent
    llama_server_build.binary = lambda name: directory / name  # the given build
    llama_server_build.is_built = lambda: True  # it is built


def chat_answer(body: dict[str, Any]) -> dict[str, Any]:
    """What a test compares of a chat completion: finish_reason, content, the calls' names and
    arguments, usage (ids are random and left out)."""
    choice = body["choices"][0]
    message = choice["message"]
    return {
        "finish_reason": choice["finish_reason"],
        "content": message.get("content"),
        "tool_calls": [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in message.get("tool_calls") or ()
        ],
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "completion_tokens": body["usage"]["completion_tokens"],
    }


def write_golden(out: Path, script: str, binary: Path | None, document: dict[str, Any]) -> None:
    """`document` as indented JSON at `out`, saying which command made it (no absolute path in a
    committed file: a binary's is the reader's own)."""
    made_by = f"python -m scripts.{script}" + (" --binary PATH" if binary is not None else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps({"made_by": made_by, **document}, option=orjson.OPT_INDENT_2) + b"\n"
    )
