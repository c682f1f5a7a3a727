"""Make logprobs.json: llama-server's logprobs on the real model, for tests/api/test_logprobs.py.

    .venv/bin/python -m scripts.golden_logprobs [--binary PATH] [--out FILE]

Starts llama-server (benchmarks/servers.py's `start_llama_server`, the peer built from the same
vendored llama.cpp; `--jinja`, 2 slots, 2 threads, flash attention on: its choice on a CPU) on
fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf and keeps two greedy answers' logprobs, each
token's and its top alternatives': a chat (`logprobs`, `top_logprobs: 3`) and a completion
(`logprobs: 2`, which llama-server answers in its chat-style `content` list). The default `--out`
is this machine's CPU directory (tests/goldens.py): the values depend on the CPU's kernels.

`--binary`: a llama-server built elsewhere, used in place of benchmarks.llama_server_build's cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from benchmarks.servers import ServerSpec
from scripts.golden_peer import golden_arguments, peer_client, write_golden
from tests.goldens import machine_golden

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT: Final = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 6,
    "logprobs": True,
    "top_logprobs": 3,
}
COMPLETION: Final = {
    "prompt": "The capital of France is",
    "temperature": 0,
    "max_tokens": 6,
    "logprobs": 2,
}


def _entries(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top": [[top["token"], top["logprob"]] for top in entry["top_logprobs"]],
        }
        for entry in body["choices"][0]["logprobs"]["content"]
    ]


def main(argv: list[str] | None = None) -> int:
    args = golden_arguments(__doc__, argv)
    spec = ServerSpec(
        MODEL, sessions=2, context_per_session=1024, threads=2, llama_server_args=("--jinja",)
    )
    with peer_client(spec, "logprobs") as http:
        chat = http.post("/v1/chat/completions", json=CHAT)
        chat.raise_for_status()
        completion = http.post("/v1/completions", json=COMPLETION)
        completion.raise_for_status()
    write_golden(
        args.out or machine_golden("logprobs.json"),
        "golden_logprobs",
        args.binary,
        {
            "peer": "llama-server --jinja (benchmarks/llama_server_build.py), 2 slots, 2 threads",
            "model": MODEL.name,
            "chat": _entries(chat.json()),
            "completion": _entries(completion.json()),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
