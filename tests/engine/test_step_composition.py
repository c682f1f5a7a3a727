"""What one decode step holds when prompts arrive beside running generations (real llama.cpp,
tiny.gguf): with one KV stream per lane, prompts that complete in this step go first, alone, when
the decoding lanes would add a forward pass (``forward_passes``, llama.cpp's ``split_equal``);
otherwise, and with a unified KV, everything shares the step.

``llama_decode`` is wrapped to record each step's sequences and to submit the prompts from inside
a step of the running generation, so they all reach the next step together (a timing that cannot
be arranged from outside the decode thread). The decode itself is llama.cpp's."""

from __future__ import annotations

from collections import Counter
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine.batch import forward_passes
from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import (
    PROMPT,
    EngineFactory,
    Harness,
    greedy,
    llama_with_decode,
)

PROMPTS = (
    "Once upon a time there was",
    "In a hole in the ground lived",
    "It was a bright cold day",
)
RUNNING_TOKENS = 12
JOINING_TOKENS = 4
JOIN_AFTER_STEPS = 3


def _recording_engine(
    make_engine: EngineFactory, ban: tuple[tuple[int, float], ...], **kwargs: Any
) -> tuple[Harness, list[Counter[int]]]:
    """An engine whose every step's (sequence id → tokens) is recorded; after the running
    request's third step the three prompts are submitted from inside the fourth."""
    steps: list[Counter[int]] = []
    holder: dict[str, Harness] = {}

    def decode(context: Any, batch: Any) -> int:
        rows = Counter(int(batch.seq_id[i][0]) for i in range(batch.n_tokens))
        steps.append(rows)
        if len(steps) == JOIN_AFTER_STEPS + 1:
            for index, prompt in enumerate(PROMPTS):
                holder["h"].engine.submit(
                    GenerateRequest(
                        f"join-{index}",
                        prompt=prompt,
                        max_tokens=JOINING_TOKENS,
                        sampling=greedy(ban),
                    )
                )
        return int(llama_cpp.llama_decode(context, batch))

    proxy = llama_with_decode(decode)
    harness = make_engine(lanes=4, llama=proxy, start=False, **kwargs)
    holder["h"] = harness
    harness.engine.submit(
        GenerateRequest("running", prompt=PROMPT, max_tokens=RUNNING_TOKENS, sampling=greedy(ban))
    )
    harness.engine.start()
    harness.recorder.wait_done(1 + len(PROMPTS))
    return harness, steps


def _joining_step(steps: list[Counter[int]], running_seq: int) -> int:
    """The index of the first step with a sequence other than the running request's."""
    return next(i for i, rows in enumerate(steps) if set(rows) - {running_seq})


def _everything_completed(h: Harness) -> None:
    done = {m["request_id"]: m for m in h.recorder.done()}
    assert {rid: m["outcome"] for rid, m in done.items()} == {
        "running": "completed",
        **{f"join-{i}": "completed" for i in range(len(PROMPTS))},
    }
    assert done["running"]["figures"]["generated_tokens"] == RUNNING_TOKENS
    for i in range(len(PROMPTS)):
        assert done[f"join-{i}"]["figures"]["generated_tokens"] == JOINING_TOKENS


@pytest.mark.parametrize(
    ("rows", "passes"),
    [
        ([], 0),
        ([(0, 1), (1, 1), (2, 1), (3, 1)], 1),
        ([(0, 1), (1, 2), (2, 2), (3, 2)], 2),  # a decoding lane beside 2-token prompts
        ([(1, 2), (2, 2), (3, 2)], 1),
        ([(0, 1), (2, 1), (3, 1)], 2),  # a gap in the sequence ids splits the run
        ([(3, 1), (0, 1), (1, 1), (2, 1)], 1),  # the order of the rows does not matter
        ([(0, 1), (1, 9), (2, 3)], 3),
        ([(0, 0), (1, 4)], 1),  # a row without tokens is not in the batch
    ],
)
def test_forward_passes_follows_split_equal(rows: list[tuple[int, int]], passes: int) -> None:
    assert forward_passes(rows) == passes


def test_prompts_completing_in_one_step_go_first_beside_a_split_kv(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h, steps = _recording_engine(make_engine, eog_ban)
    running = h.recorder.one("running", "gen_started")["lane"]
    joined = _joining_step(steps, running)
    # The prompts alone (one pass), then every lane together.
    assert running not in steps[joined]
    assert len(steps[joined]) == len(PROMPTS)
    assert all(tokens > 1 for tokens in steps[joined].values())
    assert set(steps[joined + 1]) == {running, *steps[joined]}
    assert all(tokens == 1 for tokens in steps[joined + 1].values())
    _everything_completed(h)


def test_a_unified_kv_keeps_the_running_lane_in_the_prompts_step(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h, steps = _recording_engine(make_engine, eog_ban, unified=True)
    running = h.recorder.one("running", "gen_started")["lane"]
    joined = _joining_step(steps, running)
    assert steps[joined][running] == 1
    assert len(steps[joined]) == 1 + len(PROMPTS)
    _everything_completed(h)


def test_a_prompt_needing_more_steps_never_holds_the_running_lane_back(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    # Chunks of 4 prompt tokens a step (over all prompts): the prompts take several steps.
    h, steps = _recording_engine(make_engine, eog_ban, prefill_chunk_tokens=4)
    running = h.recorder.one("running", "gen_started")["lane"]
    to_prefill = {}
    for i in range(len(PROMPTS)):
        started = h.recorder.one(f"join-{i}", "gen_started")
        to_prefill[started["lane"]] = started["prompt_tokens"] - started["reused_tokens"]
    prefilled = Counter[int]()
    held_back = leaving_incomplete = 0
    for rows in steps[_joining_step(steps, running) :]:
        chunks = {seq: n for seq, n in rows.items() if prefilled[seq] < to_prefill.get(seq, 0)}
        prefilled.update(chunks)
        if any(prefilled[seq] < to_prefill[seq] for seq in chunks):
            leaving_incomplete += 1
            held_back += running not in rows
    assert leaving_incomplete > 1
    assert held_back == 0
    _everything_completed(h)
