"""The most n-gram proposals could give on the repetitive workload, on this machine: the
repetitive prompts' greedy replies replayed with an oracle that verifies, in every step, exactly
the proposals that would be accepted (no wasted row, no added forward pass).

    .venv/bin/python -m benchmarks.spec_bound [--rounds 3] [--threads 2] [--sessions 1,4,8]
        [--no-server]

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
4. What the target measures (unless ``--no-server``): `spec_auto`'s tokens/s of skippy
   `--spec off` on the same workload, the wall clock from the first request to the last reply,
   at each S (the median of ``--rounds`` fresh servers). Beside the decode steps that wall time
   holds what speculation cannot shorten (the prompts' prefill, timed in step 1's process, one
   prompt after another, the fastest of 5 times each) and what it can (the host's work of each
   step: sampling, commits). The wall bound counts all of the wall time outside the replayed
   decode and the prefill as work per step, which the oracle saves in proportion to the steps
   it saves: more generous than the machine can be (HTTP and a reply's first token are in that
   rest too), so a wall bound under a target is a target no window policy over these
   proposals reaches here (:func:`wall_bound`).

Reported per S: the share of reply tokens that proposals can give (`proposed_share`), the
oracle's time and the plain replay's, and their ratio: the bound (decode only); the measured
`--spec off` wall time, the prefill in it and the wall bound. Prints a table on stderr, one
JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Final, NamedTuple

import orjson

from benchmarks.models import model_path
from benchmarks.spec_auto import OFF, REPETITIVE_PROMPTS, Sample, _measure, variants
from benchmarks.spec_ceiling import _child as ceiling_child
from benchmarks.spec_ceiling import _counts
from skippyctl.plugins.builtin.ngram import NgramIndex, SharedNgrams

MAX_TOKENS: Final = 256
"""As the repetitive workload's requests."""
WINDOWS: Final = "2,4,8,16,32"
LONGEST_WINDOW: Final = 64
"""The longest window the engine verifies a lane."""
PREFILL_REPEATS: Final = 5


def greedy_replies(path: str, threads: int) -> list[dict[str, Any]]:
    """In this process: each repetitive prompt's tokens (the model's chat template), its
    greedy reply's, and the milliseconds its prefill takes (the least of
    :data:`PREFILL_REPEATS`: the wall bound leaves that much unsaved, and the least errs on
    the generous side), on the batch-invariant kernels."""
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
        prefill = []
        for _ in range(PREFILL_REPEATS):
            llm.reset()  # type: ignore[no-untyped-call]
            started = time.perf_counter()
            llm.eval(tokens)
            prefill.append((time.perf_counter() - started) * 1000.0)
        replies.append({"prompt": list(tokens), "reply": reply, "prefill_ms": min(prefill)})
    return replies


def _replies_child(path: str, threads: int) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "benchmarks.spec_bound", "--child", path]
    done = subprocess.run(command + ["--threads", str(threads)], check=True, capture_output=True)
    replies: list[dict[str, Any]] = orjson.loads(done.stdout)
    return replies


class Replay(NamedTuple):
    """What lanes in lockstep took: decode milliseconds, reply tokens, tokens from proposals
    and steps."""

    ms: float
    made: int
    from_proposals: int
    steps: int


def replay(
    replies: list[dict[str, Any]],
    sessions: int,
    plain_ms: dict[int, float],
    token_ms: dict[int, float],
    oracle: bool,
) -> Replay:
    """The replies replayed in lockstep, the oracle's proposals verified or none."""
    shared = SharedNgrams()
    if sessions == 1:
        orders = [replies]  # one session asks the prompts one after another
    else:
        orders = [[replies[lane % len(replies)]] for lane in range(sessions)]
    # Each lane: its queue of replies, the index of the one it writes, its position in it.
    lanes: list[dict[str, Any]] = [{"queue": list(order), "index": None} for order in orders]
    total_ms, made, from_proposals, steps = 0.0, 0, 0, 0
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
            return Replay(total_ms, made, from_proposals, steps)
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
        steps += 1


def prefill_ms(replies: list[dict[str, Any]], sessions: int) -> float:
    """Milliseconds the prompts a run of ``sessions`` asks take to prefill, one after another
    (as ``replay`` assigns them)."""
    if sessions == 1:
        return float(sum(pair["prefill_ms"] for pair in replies))
    return float(sum(replies[lane % len(replies)]["prefill_ms"] for lane in range(sessions)))


def wall_bound(wall_ms: float, off: Replay, oracle: Replay, prefill: float) -> float:
    """The most the oracle's proposals could speed up a measured ``--spec off`` run of
    ``wall_ms`` whose prompts take ``prefill`` milliseconds: the replayed decode time they save
    (scaled down where the replay's plain decode took longer than the run), and of the rest of
    the run outside the prefill the same share as of the steps, as if all of it were work per
    step (module docstring, 4)."""
    decode = min(off.ms, wall_ms)
    rest = max(0.0, wall_ms - decode - prefill)
    saved = (off.ms - oracle.ms) * decode / off.ms + rest * (1.0 - oracle.steps / off.steps)
    return wall_ms / (wall_ms - saved)


def measured_off(threads: int, sessions: int, runs: int) -> list[Sample]:
    """``runs`` fresh servers of skippy ``--spec off`` on the repetitive workload at ``sessions``
    (``spec_auto``'s measurement, as its target ratio's denominator)."""
    (off,) = [v for v in variants("repetitive", ()) if v.name == OFF]
    return [_measure("repetitive", off, sessions, 0, threads) for _ in range(runs)]


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
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the step timings, and fresh `--spec off` servers a session count",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", default="1,4,8", help="comma-separated session counts")
    parser.add_argument(
        "--no-server",
        action="store_true",
        help="skip the measured `--spec off` runs (and the wall bound): the decode bound only",
    )
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
        off = replay(replies, count, plain, token, oracle=False)
        best = replay(replies, count, plain, token, oracle=True)
        assert off.made == best.made  # the same replies either way
        row: dict[str, Any] = {
            "sessions": count,
            "plain_step_ms": round(plain[count], 2),
            "proposed_token_ms": round(token[count], 2),
            "reply_tokens": off.made,
            "proposed_share": round(best.from_proposals / off.made, 3),
            "off_ms": round(off.ms, 1),
            "oracle_ms": round(best.ms, 1),
            "bound": round(off.ms / best.ms, 3),
        }
        if not args.no_server:
            samples = measured_off(args.threads, count, args.rounds)
            wall_ms = statistics.median(sample.seconds for sample in samples) * 1000.0
            served = sorted({sample.tokens for sample in samples})
            if served != [off.made]:
                sys.stderr.write(
                    f"warning: at S={count} the server's replies were {served} tokens, the "
                    f"replayed ones {off.made}: the wall bound compares different texts\n"
                )
            prefill = prefill_ms(replies, count)
            row["off_wall_ms"] = round(wall_ms, 1)
            row["prefill_ms"] = round(prefill, 1)
            row["wall_bound"] = round(wall_bound(wall_ms, off, best, prefill), 3)
        rows.append(row)
    out = sys.stderr
    out.write(f"model {os.path.basename(path)}, {args.threads} threads, {args.rounds} rounds\n")
    out.write(f"{'S':>3} {'plain ms':>9} {'token ms':>9} {'share':>6} {'off ms':>9}")
    out.write(f" {'oracle ms':>10} {'bound':>6} {'wall ms':>9} {'prefill':>8} {'wall bound':>10}\n")
    for row in rows:
        out.write(
            f"{row['sessions']:>3} {row['plain_step_ms']:>9.2f} {row['proposed_token_ms']:>9.2f}"
            f" {row['proposed_share']:>6.3f} {row['off_ms']:>9.1f} {row['oracle_ms']:>10.1f}"
            f" {row['bound']:>6.3f} {row.get('off_wall_ms', float('nan')):>9.1f}"
            f" {row.get('prefill_ms', float('nan')):>8.1f}"
            f" {row.get('wall_bound', float('nan')):>10.3f}\n"
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
