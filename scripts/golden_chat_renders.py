"""Records llama-server's renders of every vendored chat template (tests/golden/chat_renders.json).

    .venv/bin/python scripts/golden_chat_renders.py

For each `fixtures/vendor/templates/*.jinja`, starts llama-server (built from the vendored
llama.cpp, `benchmarks/llama_server_build.py`) on the real model
(`fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf`, for its BOS/EOS) with `--jinja
--chat-template-file TEMPLATE`, and asks `POST /apply-template` for each chat of CHATS: the
prompt text, or the error llama-server answered. tests/engine/test_chat_template_goldens.py
renders the same chats with skippyctl's renderer and compares.
"""

from __future__ import annotations

import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.servers import ServerSpec, start_llama_server

REPO: Final = Path(__file__).resolve().parents[1]
MODEL: Final = REPO / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATES: Final = REPO / "fixtures" / "vendor" / "templates"
OUT: Final = REPO / "tests" / "golden" / "chat_renders.json"
WEATHER_TOOL: Final = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CHATS: Final[dict[str, dict[str, Any]]] = {
    "plain": {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello world"},
        ]
    },
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Name a colour."},
        ]
    },
    "tools": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
        ],
        "tools": [WEATHER_TOOL],
    },
}


def main() -> int:
    renders: dict[str, dict[str, dict[str, str]]] = {}
    for template in sorted(TEMPLATES.glob("*.jinja")):
        spec = ServerSpec(
            path=MODEL,
            sessions=1,
            context_per_session=512,
            threads=1,
            llama_server_args=("--jinja", "--chat-template-file", str(template)),
        )
        with tempfile.TemporaryDirectory() as directory:
            try:
                server = start_llama_server(spec, Path(directory))
            except RuntimeError as error:
                renders[template.name] = {"_server": {"error": str(error)[-300:]}}
                continue
            try:
                with httpx.Client(base_url=server.url, timeout=30) as client:
                    answers: dict[str, dict[str, str]] = {}
                    for name, body in CHATS.items():
                        response = client.post("/apply-template", json=body)
                        if response.status_code == 200:
                            answers[name] = {"prompt": response.json()["prompt"]}
                        else:
                            answers[name] = {"error": response.text[:300]}
                    renders[template.name] = answers
            finally:
                server.stop()
        sys.stderr.write(f"{template.name}\n")
    document = {
        "made_by": "scripts/golden_chat_renders.py (llama-server of llama-cpp-python 0.3.36's "
        "vendored llama.cpp, --jinja --chat-template-file, POST /apply-template)",
        "model": MODEL.name,
        # Templates that print today's date rendered this day: the test renders it too.
        "rendered_on": datetime.date.today().isoformat(),
        "chats": CHATS,
        "renders": renders,
    }
    OUT.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
