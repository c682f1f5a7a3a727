"""`--spec auto`, the default, against `--spec off` and llama-server's n-gram modes (issue 29).

    .venv/bin/python -m benchmarks.spec_auto [--rounds N] [--sessions 1,4,8]
        [--workloads chat,repetitive,successor] [--requests R] [--threads T]
        [--llama-server-types ngram-simple,ngram-map-k,ngram-mod] [--llama-server-flash-attn on,off]
        [--skippy-flash-attn auto|on|off]

Workloads, each at every S of --sessions (successor: 1 and 4 only):

- `chat`: the real small instruct model (SmolLM2-135M-Instruct Q4_1) and ordinary chat
  questions (not repetitive), `/v1/chat/completions`, greedy, up to 192 tokens, each reply
  ending where the model ends it. Variants: skippy with default load flags (`--spec auto`) and
  with `--spec off`. Target: default ≥ 0.98 × off.
- `repetitive`: the same model asked to repeat a given text or code with a small change (up
  to 256 tokens), the work prompt lookup exists for. Variants: skippy default, skippy
  `--spec off`, llama-server and llama-server with each `--spec-type` of
  --llama-server-types, each with every `-fa` of --llama-server-flash-attn (default on, its
  choice on a CPU). Targets: default ≥ 1.5 × off and ≥ 1.0 × llama-server's best mode (the
  fastest of its n-gram variants).
- `successor`: the 8-layer F16 successor model (`mid-f16-successor`: its greedy output cycles)
  with streaming greedy `/v1/completions` of 400 tokens, end-of-generation banned (as
  benchmarks/speculation.py). Variants: skippy default and llama-server's n-gram modes. Target:
  default ≥ 1.0 × llama-server's best mode.

Every variant is started fresh (benchmarks/servers.py: the same model, threads, flash
attention, S parallel sequences, split KV), warmed up, driven by S concurrent sessions each
sending R sequential requests (default: enough that they ask every prompt, up to 8, at least
once: chat 8, 2, 1 and repetitive 4, 1, 1 requests at 1, 4, 8 sessions), and stopped.
Measured: aggregate completion tokens per second (usage.completion_tokens over the S-session
run's wall time). Rounds rotate the order of the
variants. Each ratio is the ratio of the median rates and the median (min..max) of the
per-round ratios; a target is met only when both reach it. Greedy replies of skippy's variants
are compared byte for byte (speculation must not change the text).

Prints a table and the verdicts on stderr, one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.loadgen import Workload, banned_tokens, run_sessions, warm_up
from benchmarks.models import model_path
from benchmarks.servers import LLAMA_SERVER, MODEL_ALIAS, SEED, SKIPPY, ServerSpec, start
from benchmarks.speculation import Row, Variant, Verdict, verdict

DEFAULT: Final = "skippy (default)"
OFF: Final = "skippy --spec off"
PEER_OFF: Final = "llama-server"
DEFAULT_TYPES: Final = ("ngram-simple", "ngram-map-k", "ngram-mod")
TARGET_CHAT: Final = 0.98
TARGET_REPETITIVE: Final = 1.5
TARGET_PEER: Final = 1.0
REQUEST_TIMEOUT_S: Final = 600.0
PROMPT_ROOM: Final = 768
SUCCESSOR_TOKENS: Final = 400
MAX_PROMPTS: Final = 8

CHAT_PROMPTS: Final = (
    "What are three tips for staying focused while studying?",
    "Explain how a rainbow forms.",
    "Why do cats purr?",
    "Give me a short plan for a weekend trip to the mountains.",
    "What is the difference between weather and climate?",
    "How do I make a good cup of tea?",
    "Describe the water cycle for a ten year old.",
    "What should I consider when buying a used bicycle?",
    "Why is the sky blue?",
    "Suggest a few names for a small bakery.",
    "How does a refrigerator keep food cold?",
    "What are the benefits of regular walking?",
    "Write a short poem about autumn leaves.",
    "How can I improve my handwriting?",
    "What causes the seasons on Earth?",
    "Tell me a fun fact about octopuses.",
)

_CODE: Final = """def f(a, b):
    r = []
    for x in a:
        if x in b:
            r.append(x)
    return r


def g(d):
    t = 0
    for k in d:
        t = t + d[k]
    return t


def h(s):
    w = s.split(" ")
    c = {}
    for x in w:
        if x in c:
            c[x] = c[x] + 1
        else:
            c[x] = 1
    return c
"""
_FILES: Final = """import os


def list_files(folder):
    names = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            names.append(name)
    print("found", len(names), "files")
    return names


def total_size(folder):
    size = 0
    for name in list_files(folder):
        size += os.path.getsize(os.path.join(folder, name))
    print("total", size)
    return size
"""
_TEXT: Final = (
    "The library opens at nine in the morning and closes at six in the evening. Visitors can "
    "borrow up to five books at a time, and books must be returned within three weeks. The "
    "reading room on the second floor is quiet and has large tables, good lamps and a view of "
    "the park. Children can join the story hour every Saturday at ten. The library also offers "
    "free computer classes on Tuesday evenings, and a small cafe near the entrance sells tea, "
    "coffee and sandwiches."
)
_RECIPE: Final = (
    "Mix two cups of flour with one cup of sugar and a pinch of salt. Add two eggs, half a cup "
    "of milk and a spoon of butter, and stir until smooth. Pour the batter into a tin and bake "
    "for thirty minutes. Let the cake cool, then cover it with a thin layer of sugar and serve "
    "it with fresh berries."
)
REPETITIVE_PROMPTS: Final = (
    f"Repeat the following text, but replace 'library' with 'museum':\n\n{_TEXT}",
    f"Repeat the following Python code, but rename the function f to find_common:\n\n{_CODE}",
    f"Repeat the following recipe, but replace 'sugar' with 'honey':\n\n{_RECIPE}",
    f"Repeat this code, but change every print to log:\n\n{_FILES}",
)
"""Repeating a given text or code with a small change: the small model copies two of them
nearly whole, part of the third, and falls into a loop of its own on the recipe — all of it
the kind of output prompt lookup exists for."""
WORKLOADS: Final = ("chat", "repetitive", "successor")


@dataclass(frozen=True, slots=True)
class Sample:
    tokens_per_s: float
    replies: tuple[str, ...]
    """Each request's reply text, in (session, request) order (chat workloads)."""
    tokens: int = 0
    """Completion tokens of the chat workloads' requests (0 for the successor's)."""
    seconds: float = 0.0
    """Wall seconds from the first request to the last reply (chat workloads)."""


def _fa(flash: str) -> tuple[str, tuple[str, ...]]:
    """A llama-server variant's name suffix and arguments for its `-fa` (on: as started)."""
    return ("", ()) if flash == "on" else (f" -fa {flash}", ("-fa", flash))


def variants(
    workload: str,
    types: tuple[str, ...],
    flash: tuple[str, ...] = ("on",),
    skippy_flash: str = "auto",
) -> list[Variant]:
    ours: tuple[str, ...] = () if skippy_flash == "auto" else ("--flash-attn", skippy_flash)
    peers = [
        Variant(
            f"llama-server {t}{_fa(f)[0]}",
            LLAMA_SERVER,
            llama_server_args=("--spec-type", t, *_fa(f)[1]),
        )
        for f in flash
        for t in types
    ]
    if workload == "chat":
        return [Variant(DEFAULT, SKIPPY, ours), Variant(OFF, SKIPPY, ("--spec", "off", *ours))]
    if workload == "repetitive":
        return [
            Variant(DEFAULT, SKIPPY, ours),
            Variant(OFF, SKIPPY, ("--spec", "off", *ours)),
            *(
                Variant(PEER_OFF + _fa(f)[0], LLAMA_SERVER, llama_server_args=_fa(f)[1])
                for f in flash
            ),
            *peers,
        ]
    return [Variant(DEFAULT, SKIPPY, ours), *peers]


def _chat_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "seed": SEED,
    }


async def _chat_sessions(
    url: str,
    headers: dict[str, str],
    prompts: tuple[str, ...],
    sessions: int,
    requests: int,
    max_tokens: int,
) -> tuple[float, int, tuple[str, ...]]:
    """S sessions of R sequential chat requests: wall seconds, completion tokens, replies."""
    limits = httpx.Limits(max_connections=sessions + 2)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:

        async def session(index: int) -> list[tuple[int, str]]:
            done = []
            for request in range(requests):
                prompt = prompts[(index * requests + request) % len(prompts)]
                response = await client.post(
                    "/v1/chat/completions", json=_chat_body(prompt, max_tokens)
                )
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
                answer = response.json()
                done.append(
                    (
                        int(answer["usage"]["completion_tokens"]),
                        str(answer["choices"][0]["message"].get("content") or ""),
                    )
                )
            return done

        started = time.perf_counter()
        results = await asyncio.gather(*(session(i) for i in range(sessions)))
        wall = time.perf_counter() - started
    flat = [item for session_items in results for item in session_items]
    return wall, sum(tokens for tokens, _ in flat), tuple(text for _, text in flat)


def _measure(workload: str, variant: Variant, sessions: int, requests: int, threads: int) -> Sample:
    successor = workload == "successor"
    path = model_path("mid-f16-successor" if successor else "real")
    max_tokens = 192 if workload == "chat" else 256
    tokens = SUCCESSOR_TOKENS if successor else max_tokens
    prompts = CHAT_PROMPTS if workload == "chat" else REPETITIVE_PROMPTS
    if not requests:  # enough that the sessions ask every prompt (up to 8) at least once
        requests = -(-min(len(prompts), MAX_PROMPTS) // sessions)
    work = Workload(
        requests=requests if not successor else 1, tokens=tokens, banned=banned_tokens(path)
    )
    with tempfile.TemporaryDirectory(prefix="skippy-spec-auto-") as temp:
        spec = ServerSpec(
            path,
            sessions,
            PROMPT_ROOM + tokens,
            threads,
            skippy_load_args=variant.skippy_args,
            llama_server_args=variant.llama_server_args,
        )
        server = start(variant.server, spec, Path(temp))
        replies: tuple[str, ...] = ()
        wall, made = 0.0, 0
        try:
            warm_up(server, work)
            if not successor:
                # The chat path too (a server may prepare its chat template on first use).
                asyncio.run(_chat_sessions(server.url, server.headers, prompts[:1], 1, 1, 4))
            if successor:
                sample = asyncio.run(run_sessions(server, work, sessions))
                rate = sample.tokens_per_s
            else:
                wall, made, replies = asyncio.run(
                    _chat_sessions(
                        server.url, server.headers, prompts, sessions, requests, max_tokens
                    )
                )
                rate = made / wall
            acceptance = _acceptance(server.url, server.headers) if variant.server == SKIPPY else ""
        finally:
            server.stop()
    sys.stderr.write(f"  {variant.name:>28} S={sessions}: {rate:8.1f} tok/s{acceptance}\n")
    return Sample(rate, replies, made, wall)


def _acceptance(url: str, headers: dict[str, str]) -> str:
    """What speculation did in the run, from skippy's /metrics: drafted and accepted tokens."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30.0).text
    counts = {"drafted": 0.0, "accepted": 0.0}
    for line in text.splitlines():
        for name in counts:
            if line.startswith(f"skippy_spec_{name}_tokens_total{{"):
                counts[name] += float(line.rsplit(" ", 1)[1])
    return f"  (drafted {counts['drafted']:.0f}, accepted {counts['accepted']:.0f})"


def run(
    workloads: tuple[str, ...],
    sessions: tuple[int, ...],
    rounds: int,
    requests: int,
    threads: int,
    types: tuple[str, ...],
    flash: tuple[str, ...] = ("on",),
    skippy_flash: str = "auto",
) -> tuple[list[Row], list[Verdict], list[str]]:
    rows: list[Row] = []
    verdicts: list[Verdict] = []
    differences: list[str] = []
    for workload in workloads:
        chosen = variants(workload, types, flash, skippy_flash)
        counts = tuple(s for s in sessions if workload != "successor" or s <= 4)
        for count in counts:
            rates: dict[str, list[float]] = {v.name: [] for v in chosen}
            replies: dict[str, tuple[str, ...]] = {}
            for index in range(rounds):
                sys.stderr.write(f"{workload} S={count} round {index + 1}/{rounds}\n")
                order = chosen[index % len(chosen) :] + chosen[: index % len(chosen)]
                for variant in order:
                    sample = _measure(workload, variant, count, requests, threads)
                    rates[variant.name].append(sample.tokens_per_s)
                    if variant.server == SKIPPY and sample.replies:
                        first = replies.setdefault(variant.name, sample.replies)
                        if first != sample.replies:
                            differences.append(f"{workload} S={count}: {variant.name} changed")
            if DEFAULT in replies and OFF in replies and replies[DEFAULT] != replies[OFF]:
                differences.append(f"{workload} S={count}: default and --spec off differ")
            for name, values in rates.items():
                rows.append(
                    Row(
                        workload,
                        count,
                        name,
                        rounds,
                        round(statistics.median(values), 1),
                        round(min(values), 1),
                        round(max(values), 1),
                    )
                )
            ours = rates[DEFAULT]
            if OFF in rates:
                target = TARGET_CHAT if workload == "chat" else TARGET_REPETITIVE
                verdicts.append(verdict(workload, count, "default / off", ours, rates[OFF], target))
            peers = [v.name for v in chosen if "--spec-type" in v.llama_server_args]
            if peers:
                best = max(peers, key=lambda name: statistics.median(rates[name]))
                verdicts.append(
                    verdict(workload, count, f"default / {best}", ours, rates[best], TARGET_PEER)
                )
    return rows, verdicts, differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", default="1,4,8")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="sequential requests a session (0: enough that the sessions ask every prompt, up "
        "to 8, at least once)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server-types", default=",".join(DEFAULT_TYPES))
    parser.add_argument(
        "--llama-server-flash-attn",
        default="on",
        help="llama-server's -fa for its variants, e.g. on,off: each mode with each (on: its "
        "choice on a CPU, as skippy's default)",
    )
    parser.add_argument(
        "--skippy-flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="skippy's `load --flash-attn` in every skippy variant (auto: the default load, "
        "off on a CPU: the batch-invariant kernels; on: llama.cpp's flash attention)",
    )
    args = parser.parse_args(argv)
    workloads = tuple(w for w in args.workloads.split(",") if w)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    sessions = tuple(int(s) for s in args.sessions.split(","))
    types = tuple(t for t in args.llama_server_types.split(",") if t)
    flash = tuple(f for f in args.llama_server_flash_attn.split(",") if f)
    if not flash or set(flash) - {"on", "off"}:
        parser.error("--llama-server-flash-attn: on, off or on,off")
    rows, verdicts, differences = run(
        workloads,
        sessions,
        args.rounds,
        args.requests,
        args.threads,
        types,
        flash,
        args.skippy_flash_attn,
    )
    sys.stderr.write(f"\n{'workload':>10} {'S':>2} {'variant':>28} {'tok/s':>8}  min..max\n")
    for row in rows:
        sys.stderr.write(
            f"{row.model:>10} {row.sessions:>2} {row.variant:>28} {row.tokens_per_s:8.1f}  "
            f"{row.tokens_per_s_min:.1f}..{row.tokens_per_s_max:.1f}\n"
        )
    sys.stderr.write("\n")
    for v in verdicts:
        mark = "met" if v.met else "NOT met"
        sys.stderr.write(
            f"{v.model} S={v.sessions} {v.what}: {v.ratio_of_medians:.3f}x (paired "
            f"{v.paired_median:.3f}, {v.paired_min:.3f}..{v.paired_max:.3f}; target "
            f"{v.target}) {mark}\n"
        )
    for line in differences:
        sys.stderr.write(f"TEXT DIFFERS: {line}\n")
    sys.stdout.write(
        orjson.dumps(
            {
                "rows": [asdict(r) for r in rows],
                "verdicts": [asdict(v) for v in verdicts],
                "text_differences": differences,
            }
        ).decode()
        + "\n"
    )
    return 0 if all(v.met for v in verdicts) and not differences else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
