"""Make tool_calls.json: llama-server's tool calls for the real model, once.

    .venv/bin/python -m scripts.golden_tool_calls [--binary PATH] [--out FILE]

Starts llama-server (benchmarks/servers.py's `start_llama_server`, the peer built from the same
vendored llama.cpp) on fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf with Qwen 2.5's chat
template (fixtures/vendor/templates, `--jinja --chat-template-file`): a Hermes-form tool template
on a ChatML model, so llama-server parses `<tool_call>` blocks from its replies. SmolLM2 copies a
few-shot pattern greedily, so each case's messages show two solved turns and ask a third. The
file keeps each request and what llama-server answered (finish_reason, content, the calls' names
and arguments, usage); ids are random and left out. tests/api/test_tool_calls_real.py replays
the requests on skippy with the same template and compares.

The default `--out` is this machine's CPU directory, tests/golden/cpu/<features>/
(tests/goldens.py): the answers depend on the CPU's kernels.

`--binary`: a llama-server built elsewhere (e.g. the path in /work/cache/llama-server.path),
used in place of benchmarks.llama_server_build's cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from benchmarks.servers import MODEL_ALIAS, ServerSpec
from scripts.golden_peer import chat_answer, golden_arguments, peer_client, write_golden
from tests.goldens import machine_golden

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE: Final = "Qwen-Qwen2.5-7B-Instruct.jinja"
SYSTEM: Final = (
    "You are a function calling AI model. You may call one or more functions to assist with the "
    "user query. For each function call return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags."
)


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.removeprefix('get_')} in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }


TOOLS: Final = [_tool("get_weather"), _tool("get_time")]


def _hermes(name: str, city: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


def _few_shot(answer: Any, question: Any, last: str = "Oslo") -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question("Paris")},
        {"role": "assistant", "content": answer("Paris")},
        {"role": "user", "content": question("Berlin")},
        {"role": "assistant", "content": answer("Berlin")},
        {"role": "user", "content": question(last)},
    ]


def _weather(city: str) -> str:
    return f"What is the weather in {city}?"


def _both(city: str) -> str:
    return f"Weather and time in {city}?"


def _two_calls(city: str) -> str:
    return _hermes("get_weather", city) + "\n" + _hermes("get_time", city)


CASES: Final[list[tuple[str, dict[str, Any]]]] = [
    ("one_call", {"messages": _few_shot(lambda c: _hermes("get_weather", c), _weather)}),
    ("two_calls", {"messages": _few_shot(_two_calls, _both)}),
    ("two_calls_lima", {"messages": _few_shot(_two_calls, _both, "Lima")}),
    (
        "text_before_call",
        {
            "messages": _few_shot(
                lambda c: "Let me look that up.\n" + _hermes("get_weather", c), _weather
            )
        },
    ),
    ("no_call", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}),
]


def main(argv: list[str] | None = None) -> int:
    args = golden_arguments(__doc__, argv)
    template = REPO / "fixtures" / "vendor" / "templates" / TEMPLATE
    spec = ServerSpec(
        MODEL,
        sessions=1,
        context_per_session=2048,
        threads=1,
        llama_server_args=("--jinja", "--chat-template-file", str(template)),
    )
    cases = []
    with peer_client(spec, "tool-calls") as http:
        for name, extra in CASES:
            request = {"tools": TOOLS, "max_tokens": 80, "temperature": 0, **extra}
            response = http.post("/v1/chat/completions", json={"model": MODEL_ALIAS, **request})
            response.raise_for_status()
            cases.append({"name": name, "request": request, **chat_answer(response.json())})
    write_golden(
        args.out or machine_golden("tool_calls.json"),
        "golden_tool_calls",
        args.binary,
        {
            "peer": "llama-server (benchmarks/llama_server_build.py), greedy, one slot",
            "model": MODEL.name,
            "template": TEMPLATE,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
