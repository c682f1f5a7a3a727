"""Make chat_greedy*.json: llama-server's greedy chat answers under vendored templates.

    .venv/bin/python -m scripts.golden_chat_greedy [--binary PATH] [--flash-attn on|off]
        [--out FILE]

For each template in TEMPLATES (llama.cpp's `models/templates`, vendored into
fixtures/vendor/templates by `make fixtures`), starts llama-server (benchmarks/servers.py's
`start_llama_server`, the peer built from the same vendored llama.cpp) on the real model
fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf with that template (`--jinja
--chat-template-file`), and asks each of the template's chats greedily: the real weights and
vocabulary under another model's template, so the prompt that reaches the model is that template's
render, tokenized with a real tokenizer. The file keeps each request and what llama-server
answered (content, tool calls, finish_reason, usage). tests/api/test_chat_greedy_goldens.py loads
the same model with each template (`load --chat-template`) and compares through the official
`openai` client.

The default `--out` is this machine's CPU directory, tests/golden/cpu/<features>/
(tests/goldens.py): the answers depend on the CPU's kernels.

`--binary`: a llama-server built elsewhere, used in place of benchmarks.llama_server_build's cache.
`--flash-attn`: llama-server's `-fa` (default on, llama-server's own choice on a CPU: the file
chat_greedy.json, against skippyctl's `--flash-attn on`; off: chat_greedy_fa_off.json, what
skippyctl's default computes on a CPU (`--flash-attn auto`: off), so llama-server then computes
on the same ggml CPU library as skippyctl's engine: the one with batch-invariant products,
skippyctl/engine/kernels.py).
Flash attention rounds differently, and a greedy text can part on it.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path
from typing import Any, Final

import httpx

from benchmarks.servers import MODEL_ALIAS, ServerSpec, start_llama_server
from scripts.golden_peer import chat_answer, use_binary, write_golden
from tests.goldens import machine_golden

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"

PLAIN: Final = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
MULTI_TURN: Final = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Name another one."},
]
WEATHER_TOOL: Final = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_CHAT: Final = [{"role": "user", "content": "What is the weather in Paris?"}]

CHATS: Final = {"plain": PLAIN, "multi_turn": MULTI_TURN}
TOOL_TEMPLATES: Final = frozenset(
    {
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    }
)
TEMPLATES: Final = (
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "google-gemma-2-2b-it.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
)
MAX_TOKENS: Final = 32


def requests_for(template: str) -> list[tuple[str, dict[str, Any]]]:
    """The chats asked under `template`: every template gets the plain and multi-turn chats, a
    template that teaches tool calls also a chat with a tool."""
    cases: list[tuple[str, dict[str, Any]]] = [
        (name, {"messages": messages}) for name, messages in CHATS.items()
    ]
    if template in TOOL_TEMPLATES:
        cases.append(("tools", {"messages": TOOL_CHAT, "tools": [WEATHER_TOOL]}))
    return [(name, {**body, "max_tokens": MAX_TOKENS, "temperature": 0}) for name, body in cases]


def _ask(template: str, scratch: Path, flash_attn: str) -> list[dict[str, Any]]:
    path = REPO / "fixtures" / "vendor" / "templates" / template
    spec = ServerSpec(
        MODEL,
        sessions=1,
        context_per_session=2048,
        threads=1,
        llama_server_args=("--jinja", "--chat-template-file", str(path)),
    )
    cases = []
    server = start_llama_server(
        spec, scratch, flash_attn=flash_attn, invariant_kernels=flash_attn == "off"
    )
    try:
        with httpx.Client(base_url=server.url, timeout=300) as http:
            for name, request in requests_for(template):
                response = http.post("/v1/chat/completions", json={"model": MODEL_ALIAS, **request})
                response.raise_for_status()
                cases.append({"name": name, "request": request, **chat_answer(response.json())})
    finally:
        server.stop()
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, help="a llama-server binary to use")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on")
    parser.add_argument(
        "--out", type=Path, help="default: this CPU's tests/golden/cpu/…/chat_greedy[_fa_off].json"
    )
    args = parser.parse_args(argv)
    suffix = "" if args.flash_attn == "on" else "_fa_off"
    out = args.out or machine_golden(f"chat_greedy{suffix}.json")
    use_binary(args.binary)
    templates = {}
    with tempfile.TemporaryDirectory(prefix="golden-chat-greedy-") as scratch:
        for template in TEMPLATES:
            templates[template] = _ask(template, Path(scratch), args.flash_attn)
    write_golden(
        out,
        "golden_chat_greedy" + ("" if args.flash_attn == "on" else " --flash-attn off"),
        args.binary,
        {
            "peer": "llama-server (benchmarks/llama_server_build.py), --jinja, greedy, one slot, "
            f"-fa {args.flash_attn}"
            + (", on the batch-invariant ggml kernels" if args.flash_attn == "off" else ""),
            "model": MODEL.name,
            # Templates that print today's date saw this day: the test pins it too.
            "rendered_on": datetime.date.today().isoformat(),
            "templates": templates,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
