"""What the golden scripts (scripts/golden_*.py) share: the llama-server they ask, a chat
answer's comparable fields, and how a golden file is written."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks import llama_server_build
from benchmarks.servers import ServerSpec, start_llama_server


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


def golden_arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """A golden script's command line: `--binary` (asked from then on) and `--out` (None: this
    CPU's directory, tests/goldens.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--binary", type=Path, help="a llama-server binary to use")
    parser.add_argument("--out", type=Path, help="default: this CPU's tests/golden/cpu/…")
    args = parser.parse_args(argv)
    use_binary(args.binary)
    return args


@contextlib.contextmanager
def peer_client(spec: ServerSpec, name: str) -> Iterator[httpx.Client]:
    """llama-server on `spec`, its log in a scratch directory, and a client of it; stopped
    after."""
    with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as scratch:
        server = start_llama_server(spec, Path(scratch))
        try:
            with httpx.Client(base_url=server.url, timeout=300) as http:
                yield http
        finally:
            server.stop()
