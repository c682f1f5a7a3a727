"""The most n-gram proposals could give on the repetitive workload, on this machine: the
repetitive prompts' greedy replies replayed with an oracle that verifies, in every step, exactly
the proposals that would be accepted (no wasted row, no added forward pass).

    .venv/bin/python -m benchmarks.spec_bound [--rounds 3] [--threads 2] [--sessions 1,4,8]

`benchmarks.spec_ceiling` bounds any proposer (every proposal right). This bounds the one
`--spec auto` has: the n-gram index of `skippyctl/plugins/builtin/ngram.py` (prompt lookup, the
pool shared across requests), on the replies `benchmarks.spec_auto`'s repetitive workload gets.
Steps:

1. The greedy replies (up to 256 tokens) of the 4 repetitive prompts, in a child process on
   the kernels the default load computes with (batch-invariant, flash attention off): their
   text does not depend on the batch, so it is the text every session count gets.
2. What steps cost, in the same run: `spec_ceiling`'s plain step of S lanes and its verify steps
   (windows of 2 to 32 on every lane); a proposed token costs the least over the windows of
   (step − plain step) / (S × W). Which window is cheapest a token depends on the machine:
   short windows cost more a token where a step is bound by reading the weights (one lane),
   long ones where it is bound by arithmetic (8 lanes on an AVX2-only CPU).
3. The replay, per S: S lanes in lockstep, lane i on prompt i mod 4 (as `spec_auto` assigns
   them; at 1 session the 4 prompts one after another), every step costing the plain step of
   the lanes still running plus a proposed token per verified proposal. Without proposals that
   is `--spec off`; with the oracle it is more than any window policy over these proposals
   could do: no proposal is wasted, and lanes of unequal windows cost no forward pass more
   (with one KV stream per lane they do). Prompt prefill, which both pay alike, is left out.

Reported per S: the share of reply tokens that proposals can give (`proposed_share`), the
oracle's time and the plain replay's, and their ratio: the bound. Prints a table on stderr,
one JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any, Final

import orjson

from benchmarks.models import model_path
from benchmarks.spec_auto import REPETITIVE_PROMPTS
from benchmarks.spec_ceiling import _child as ceiling_child
from benchmarks.spec_ceiling import _counts
from skippyctl.plugins.builtin.ngram import NgramIndex, SharedNgrams

MAX_TOKENS: Final = 256
"""As the repetitive workload's requests."""
WINDOWS: Final = "2,4,8,16,32"
LONGEST_WINDOW: Final = 64
"""The longest window the engine verifies a lane."""


def greedy_replies(path: str, threads: int) -> list[dict[str, list[int]]]:
    """In this process: each repetitive prompt's tokens (the model's chat template) and its
    greedy reply's, on the batch-invariant kernels."""
    from skippyctl.engine.kernels import preload_invariant_kernels

    problem = preload_invariant_kernels()
    if problem is not None:
        raise SystemExit(f"spec_bound: {problem}")
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = Llama(path, n_ctx=2048, n_threads=threads, flash_attn=False, verbose=False)
    template = str(llm.metadata["tokenizer.chat_template"])
    eos = llm.token_eos()
    formatter = Jinja2ChatFormatter(
        template, eos_token=llm.detokenize([eos]).decode(), bos_token=""
    )
    vocab = llm._model.vocab  # llama_vocab_is_eog takes the vocabulary's pointer
    import llama_cpp

    replies = []
    for prompt in REPETITIVE_PROMPTS:
        text = formatter(messages=[{"role": "user", "content": prompt}]).prompt
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        reply: list[int] = []
        for token in llm.generate(tokens, top_k=1, temp=0.0, repeat_penalty=1.0):
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(reply) >= MAX_TOKENS:
                break
            reply.append(token)
        replies.append({"prompt": list(tokens), "reply": reply})
    return replies


def _replies_child(path: str, threads: int) -> list[dict[str, list[int]]]:
    command = [sys.executable, "-m", "benchmarks.spec_bound", "--child", path]
    done = subprocess.run(command + ["--threads", str(threads)], check=True, capture_output=True)
    replies: list[dict[str, list[int]]] = orjson.loads(done.stdout)
    return replies


def replay(
    replies: list[dict[str, list[int]]],
    sessions: int,
    plain_ms: dict[int, float],
    token_ms: dict[int, float],
    oracle: bool,
) -> tuple[float, int, int]:
    """Milliseconds the lanes take in lockstep, reply tokens, tokens from proposals."""
    shared = SharedNgrams()
    if sessions == 1:
        orders = [replies]  # one session asks the prompts one after another
    else:
        orders = [[replies[lane % len(replies)]] for lane in range(sessions)]
    # Each lane: its queue of replies, the index of the one it writes, its position in it.
    lanes: list[dict[str, Any]] = [{"queue": list(order), "index": None} for order in orders]
    total_ms, made, from_proposals = 0.0, 0, 0
    while True:
        running = []
        for lane in lanes:
            if lane["index"] is None or lane["at"] >= len(lane["reply"]):
                if not lane["queue"]:
                    continue
                pair = lane["queue"].pop(0)
                lane["reply"] = pair["reply"]
                lane["index"] = NgramIndex(pair["prompt"], shared=shared)
                lane["index"].commit(0, pair["reply"][:1])  # the prompt's step samples it
                lane["at"] = 1
                made += min(1, len(pair["reply"]))
                if lane["at"] >= len(lane["reply"]):
                    continue
            running.append(lane)
        if not running:
            return total_ms, made, from_proposals
        proposed = 0
        for lane in running:
            reply, at, index = lane["reply"], lane["at"], lane["index"]
            accepted = 0
            if oracle:
                # The pending token is the last committed one; a window's proposals follow it,
                # and the token sampled after the last accepted one comes with them.
                draft = index.propose(min(LONGEST_WINDOW, len(reply) - at - 1))
                while accepted < len(draft) and draft[accepted] == reply[at + accepted]:
                    accepted += 1
            proposed += accepted
            index.commit(index.committed, reply[at : at + accepted + 1])
            lane["at"] = at + accepted + 1
            made += accepted + 1
            from_proposals += accepted
        count = len(running)
        total_ms += plain_ms[count] + token_ms[count] * proposed


def _costs(
    runs: list[dict[str, float]], counts: list[int]
) -> tuple[dict[int, float], dict[int, float]]:
    """Plain step ms and ms a proposed token, per lane count (medians over the rounds)."""
    ms = {case: statistics.median(run[case] for run in runs) for case in runs[0]}
    windows = _counts(WINDOWS)
    plain = {count: ms[f"S={count}/W=0"] for count in counts}
    token = {
        count: min((ms[f"S={count}/W={w}"] - plain[count]) / (count * w) for w in windows)
        for count in counts
    }
    return plain, token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the step timings")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", default="1,4,8", help="comma-separated session counts")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sessions = _counts(args.sessions)
    if not sessions or min(sessions) < 1 or max(sessions) > 8:
        parser.error("--sessions takes comma-separated counts from 1 to 8")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.child:
        sys.stdout.write(orjson.dumps(greedy_replies(args.child, args.threads)).decode() + "\n")
        return 0
    path = str(model_path("real"))
    replies = _replies_child(path, args.threads)
    sys.stderr.write(
        "greedy replies: " + ", ".join(str(len(r["reply"])) for r in replies) + " tokens\n"
    )
    # Every lane count a replay passes through (lanes end at different times).
    counts = list(range(1, max(sessions) + 1))
    runs = []
    for index in range(args.rounds):
        runs.append(ceiling_child(path, ",".join(map(str, counts)), WINDOWS, args.threads))
        sys.stderr.write(f"step timings: round {index + 1} of {args.rounds}\n")
    plain, token = _costs(runs, counts)
    rows = []
    for count in sessions:
        off_ms, made, _ = replay(replies, count, plain, token, oracle=False)
        oracle_ms, made_oracle, from_proposals = replay(replies, count, plain, token, oracle=True)
        assert made == made_oracle  # the same replies either way
        rows.append(
            {
                "sessions": count,
                "plain_step_ms": round(plain[count], 2),
                "proposed_token_ms": round(token[count], 2),
                "reply_tokens": made,
                "proposed_share": round(from_proposals / made, 3),
                "off_ms": round(off_ms, 1),
                "oracle_ms": round(oracle_ms, 1),
                "bound": round(off_ms / oracle_ms, 3),
            }
        )
    out = sys.stderr
    out.write(f"model {os.path.basename(path)}, {args.threads} threads, {args.rounds} rounds\n")
    out.write(f"{'S':>3} {'plain ms':>9} {'token ms':>9} {'share':>6} {'off ms':>9}")
    out.write(f" {'oracle ms':>10} {'bound':>6}\n")
    for row in rows:
        out.write(
            f"{row['sessions']:>3} {row['plain_step_ms']:>9.2f} {row['proposed_token_ms']:>9.2f}"
            f" {row['proposed_share']:>6.3f} {row['off_ms']:>9.1f} {row['oracle_ms']:>10.1f}"
            f" {row['bound']:>6.3f}\n"
        )
    summary = {
        "model": os.path.basename(path),
        "threads": args.threads,
        "rounds": args.rounds,
        "reply_tokens": [len(r["reply"]) for r in replies],
        "rows": rows,
    }
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
