"""BatchEngine on real llama.cpp (tiny.gguf): stop strings, max_tokens and the lane's context
limit end a generation where they say, with the text up to there."""

from __future__ import annotations

import math

from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import PROMPT, EngineFactory, greedy


def test_stop_string_spanning_two_tokens_is_cut(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(GenerateRequest("ref", prompt=PROMPT, max_tokens=40, sampling=greedy(eog_ban)))
    h.recorder.wait_done(1)
    pieces = [m["text"] for m in h.recorder.of("ref", "gen_text")]
    full = "".join(pieces)
    # A stop string made of the end of one token's text and the start of the next one's.
    index = next(
        i for i in range(5, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2
    )
    stop = pieces[index][-2:] + pieces[index + 1][:2]
    expected = full[: full.index(stop)]

    h.engine.submit(
        GenerateRequest(
            "cut",
            prompt=PROMPT,
            max_tokens=40,
            stop=("never-there", stop),
            sampling=greedy(eog_ban),
        )
    )
    done = h.recorder.wait_done(2)[-1]
    assert done["stop_reason"] == "stop"
    assert done["outcome"] == "completed"
    assert h.recorder.text("cut") == expected
    assert all(stop not in m["text"] for m in h.recorder.of("cut", "gen_text"))


def test_text_held_back_at_the_length_limit_goes_out_in_the_last_gen_text(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=3)
    # Prompts whose greedy continuations give one gen_text per token (no token ends inside a
    # UTF-8 character), so the k-th message is the k-th token's text.
    candidates = ("This is a test", "Hello world", "story time")
    for i, prompt in enumerate(candidates):
        h.engine.submit(
            GenerateRequest(f"ref{i}", prompt=prompt, max_tokens=20, sampling=greedy(eog_ban))
        )
    h.recorder.wait_done(len(candidates))
    runs = [[m["text"] for m in h.recorder.of(f"ref{i}", "gen_text")] for i in range(3)]
    prompt, pieces = next((p, r) for p, r in zip(candidates, runs, strict=True) if len(r) == 20)
    # The last token's last character starts a stop string (never completed): that character
    # is held back when the token arrives and released when the length limit ends the run.
    count = next(
        k
        for k in range(3, 21)
        if len(pieces[k - 1]) >= 2 and pieces[k - 1][-1] not in "".join(pieces[: k - 1])
    )
    stop = pieces[count - 1][-1] + "\x01never"
    h.engine.submit(
        GenerateRequest(
            "held", prompt=prompt, max_tokens=count, stop=(stop,), sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(len(candidates) + 1)
    held = [m["text"] for m in h.recorder.of("held", "gen_text")]
    assert held == pieces[:count]  # still one gen_text per step, nothing lost
    assert h.recorder.one("held", "gen_done")["stop_reason"] == "length"


def test_max_tokens_ends_with_length(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(GenerateRequest("r", prompt=PROMPT, max_tokens=3, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    assert (done["stop_reason"], done["figures"]["generated_tokens"]) == ("length", 3)


def test_prompt_longer_than_the_lane_fails_without_decoding_and_engine_goes_on(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2, n_ctx=512)
    assert h.engine.context_tokens_per_lane() == 256
    h.engine.submit(GenerateRequest("long", prompt="the quick brown fox " * 100, max_tokens=4))
    h.engine.submit(GenerateRequest("ok", prompt=PROMPT, max_tokens=4, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    long_done = h.recorder.one("long", "gen_done")
    assert long_done["outcome"] == "failed"
    assert long_done["reason"] == "context_exhausted"
    assert long_done["figures"]["prompt_tokens"] > 256
    assert h.recorder.of("long", "gen_started") == []
    assert h.recorder.of("long", "gen_prefill_done") == []
    assert h.recorder.one("ok", "gen_done")["outcome"] == "completed"


def test_generation_stops_when_the_lane_context_is_full_and_kv_reports_pressure(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, n_ctx=256)
    h.engine.submit(
        GenerateRequest("big", prompt=PROMPT, max_tokens=1000, sampling=greedy(eog_ban))
    )
    (done,) = h.recorder.wait_done(1)
    assert done["outcome"] == "completed"
    assert done["stop_reason"] == "length"
    assert done["reason"] == "context_exhausted"
    figures = done["figures"]
    assert figures["prompt_tokens"] + figures["generated_tokens"] == 256 + 1  # last one not decoded
    kv = h.recorder.kind("kv")
    assert [m["event"] for m in kv] == [
        "initialized",
        "pressure_crossed",
        "approaching_limit",
        "pressure_cleared",
    ]
    assert kv[0] == {"msg": "kv", "event": "initialized", "cells_used": 0, "cells_total": 256}
    assert kv[1]["cells_used"] == math.ceil(0.85 * 256)
    assert "request_id" not in kv[1]
    assert kv[2]["request_id"] == "big"
    assert kv[2]["cells_used"] == math.ceil(0.90 * 256)
    assert kv[3]["cells_used"] == 0  # no session: the lane's KV stays only as reusable cache
