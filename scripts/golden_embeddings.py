"""Make embeddings.json: llama-server's `/v1/embeddings` on the embedding fixture.

    .venv/bin/python -m scripts.golden_embeddings [--binary PATH] [--out FILE]

Starts llama-server `--embeddings` (benchmarks/servers.py's `start_llama_server`, the peer built
from the same vendored llama.cpp) on fixtures/tiny-embedding.gguf (`make fixtures`: the tiny
model with mean pooling) and keeps its answers to INPUTS: each vector and the usage.
tests/api/test_embeddings.py asks skippyctl the same through the official `openai` client.

The default `--out` is this machine's CPU directory, tests/golden/cpu/<features>/
(tests/goldens.py): the answers depend on the CPU's kernels.

`--binary`: a llama-server built elsewhere, used in place of benchmarks.llama_server_build's cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from benchmarks.servers import MODEL_ALIAS, ServerSpec
from scripts.golden_peer import golden_arguments, peer_client, write_golden
from tests.goldens import machine_golden

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "tiny-embedding.gguf"
INPUTS: Final[list[tuple[str, Any]]] = [
    ("one_text", "Hello world"),
    ("texts", ["The capital of France", "", "<|im_start|>user"]),
    ("tokens", [1, 5, 9, 200]),
    ("token_lists", [[1, 5], [7]]),
]


def main(argv: list[str] | None = None) -> int:
    args = golden_arguments(__doc__, argv)
    spec = ServerSpec(
        MODEL, sessions=1, context_per_session=512, threads=1, llama_server_args=("--embeddings",)
    )
    cases = []
    with peer_client(spec, "embeddings") as http:
        for name, value in INPUTS:
            response = http.post("/v1/embeddings", json={"model": MODEL_ALIAS, "input": value})
            response.raise_for_status()
            body = response.json()
            cases.append(
                {
                    "name": name,
                    "input": value,
                    "vectors": [d["embedding"] for d in body["data"]],
                    "prompt_tokens": body["usage"]["prompt_tokens"],
                }
            )
    write_golden(
        args.out or machine_golden("embeddings.json"),
        "golden_embeddings",
        args.binary,
        {
            "peer": "llama-server --embeddings (benchmarks/llama_server_build.py), one slot",
            "model": MODEL.name,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
