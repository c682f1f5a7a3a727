"""Make model_template_greedy.json: llama-server's greedy chats under the real model's own template.

    .venv/bin/python -m scripts.golden_model_template [--binary PATH] [--out FILE]

Starts llama-server (benchmarks/servers.py's `start_llama_server`, the peer built from the same
vendored llama.cpp; `--jinja`, one slot of 1,024 tokens, 2 threads, flash attention on: its
choice on a CPU) on fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf and asks CHATS greedily
(`temperature: 0`, `max_tokens: 24`), keeping each answer's content and `prompt_tokens`.
tests/api/test_chat_templates.py asks skippyctl the same, the model loaded with
`--flash-attn on`. The default `--out` is this machine's CPU directory,
tests/golden/cpu/<features>/ (tests/goldens.py): greedy texts depend on the CPU's kernels.

`--binary`: a llama-server built elsewhere, used in place of benchmarks.llama_server_build's cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from benchmarks.servers import ServerSpec
from scripts.golden_chat_renders import WEATHER_TOOL
from scripts.golden_peer import golden_arguments, peer_client, write_golden
from tests.goldens import machine_golden

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATS: Final[list[tuple[str, list[dict[str, str]], list[dict[str, Any]] | None]]] = [
    ("user-only", [{"role": "user", "content": "What is the capital of France?"}], None),
    (
        "system-and-user",
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colors."},
        ],
        None,
    ),
    ("with-tools", [{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER_TOOL]),
]


def main(argv: list[str] | None = None) -> int:
    args = golden_arguments(__doc__, argv)
    spec = ServerSpec(
        MODEL, sessions=1, context_per_session=1024, threads=2, llama_server_args=("--jinja",)
    )
    cases = []
    with peer_client(spec, "model-template") as http:
        for name, messages, tools in CHATS:
            body: dict[str, Any] = {"messages": messages, "temperature": 0, "max_tokens": 24}
            if tools is not None:
                body["tools"] = tools
            response = http.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            answer = response.json()
            cases.append(
                {
                    "name": name,
                    "messages": messages,
                    "tools": tools,
                    "content": answer["choices"][0]["message"].get("content"),
                    "prompt_tokens": answer["usage"]["prompt_tokens"],
                }
            )
    write_golden(
        args.out or machine_golden("model_template_greedy.json"),
        "golden_model_template",
        args.binary,
        {
            "peer": "llama-server --jinja (benchmarks/llama_server_build.py), one slot, 2 threads",
            "model": MODEL.name,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
