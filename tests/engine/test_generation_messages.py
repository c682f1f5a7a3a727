"""BatchEngine on real llama.cpp (tiny.gguf): what a request's messages say and in which order,
chat requests through the model's template, deterministic sampling, and no prompt words in any
message but the text. Fixtures and the recorder: tests/engine/conftest.py and
generation_harness.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import llama_cpp

from skippyctl.engine.generation import ChatMessage, GenerateRequest, SamplingParams
from skippyctl.engine.text import tokenize
from skippyctl.events.figures import FIGURES
from skippyctl.fixtures.generate import TINY, make_model
from skippyctl.fixtures.vocab import EOS_ID
from tests.engine.generation_harness import PROMPT, EngineFactory, greedy


def test_generation_completes_with_counts_and_ordered_messages(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, n_threads=None)  # the production default: every core
    h.engine.submit(GenerateRequest("r1", prompt=PROMPT, max_tokens=16, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    started = h.recorder.one("r1", "gen_started")
    prefill = h.recorder.one("r1", "gen_prefill_done")
    first = h.recorder.one("r1", "gen_first_token")
    assert started == {
        "msg": "gen_started",
        "request_id": "r1",
        "lane": 0,
        "session": None,
        "prompt_tokens": started["prompt_tokens"],
        "reused_tokens": 0,
        "cache": "none",
    }
    assert started["prompt_tokens"] > 5
    assert prefill["tokens"] == started["prompt_tokens"]
    assert first["ttft_ms"] > 0
    assert set(done) == {"msg", "request_id", "outcome", "reason", "stop_reason", "figures"}
    figures = done["figures"]
    assert set(figures) == {f.name for f in FIGURES}  # every figure, measured or not
    assert done["outcome"] == "completed"
    assert done["reason"] is None
    assert done["stop_reason"] == "length"
    assert figures["prompt_tokens"] == started["prompt_tokens"]
    assert figures["generated_tokens"] == 16
    assert figures["ttft_ms"] == first["ttft_ms"]
    assert 0 <= figures["engine_wait_ms"] <= figures["ttft_ms"]
    assert figures["decode_tokens_per_s"] > 0
    assert figures["prefill_tokens_per_s"] > 0
    assert figures["shared_decode_steps"] == 0
    assert figures["max_batch"] == 1
    assert h.recorder.text("r1")
    if figures["prefill_ms"] < 250:
        assert h.recorder.of("r1", "gen_prefill_progress") == []
    order = [m["msg"] for m in h.recorder.messages if m.get("request_id") == "r1"]
    # This prompt's first token is a partial UTF-8 character (no text yet): the observations
    # go out at the end of its step, before the second token's text.
    assert order[:4] == ["gen_started", "gen_prefill_done", "gen_first_token", "gen_text"]
    assert order[-1] == "gen_done"
    assert h.engine.context_tokens_per_lane() == 1024
    assert h.engine.lanes == 1


def test_eos_token_ends_generation_without_counting_it(make_engine: EngineFactory) -> None:
    h = make_engine(lanes=1)
    force_eos = SamplingParams(temperature=0.0, logit_bias=((EOS_ID, 1000.0),))
    h.engine.submit(GenerateRequest("r", prompt=PROMPT, max_tokens=16, sampling=force_eos))
    (done,) = h.recorder.wait_done(1)
    assert done["outcome"] == "completed"
    assert done["stop_reason"] == "eos"
    assert done["figures"]["generated_tokens"] == 0
    assert done["figures"]["ttft_ms"] is not None  # a token (the EOS) was sampled
    assert h.recorder.text("r") == ""


def test_first_token_text_goes_out_before_the_prefill_and_first_token_observations(
    make_engine: EngineFactory, model: Any, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """The client's time to first token must not wait for the host to turn the prefill and
    first-token observations into events: they follow the first text."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    (word,) = tokenize(llama_cpp, vocab, "the", add_special=False)
    h = make_engine(lanes=1)
    forced = greedy((*eog_ban, (word, 100.0)))
    h.engine.submit(GenerateRequest("t", prompt=PROMPT, max_tokens=3, sampling=forced))
    (done,) = h.recorder.wait_done(1)
    assert done["figures"]["generated_tokens"] == 3
    messages = [m for m in h.recorder.messages if m.get("request_id") == "t"]
    assert [m["msg"] for m in messages] == [
        "gen_started",
        "gen_text",
        "gen_prefill_done",
        "gen_first_token",
        "gen_text",
        "gen_text",  # the last token's text, flushed by the finish
        "gen_done",
    ]
    assert messages[1]["text"] == " the"  # this vocabulary's pieces carry their leading space
    assert h.recorder.text("t") == " the the the"


def test_observations_held_for_the_first_text_are_sent_before_gen_done(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """A request that ends on its first token still reports prefill and first token."""
    h = make_engine(lanes=1)
    h.engine.submit(GenerateRequest("one", prompt=PROMPT, max_tokens=1, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    order = [m["msg"] for m in h.recorder.messages if m.get("request_id") == "one"]
    assert order[0] == "gen_started" and order[-1] == "gen_done"
    assert order.index("gen_prefill_done") + 1 == order.index("gen_first_token")
    assert done["figures"]["generated_tokens"] == 1


def test_chat_messages_use_the_model_template(
    make_engine: EngineFactory, model: Any, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    messages = (ChatMessage("user", "hello world"),)
    h.engine.submit(GenerateRequest("c", messages=messages, max_tokens=4, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    vocab = llama_cpp.llama_model_get_vocab(model)
    rendered = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert done["outcome"] == "completed"
    assert done["figures"]["prompt_tokens"] == len(tokenize(llama_cpp, vocab, rendered))


def test_chat_on_a_model_without_template_uses_chatml(
    make_engine: EngineFactory, tmp_path: Path, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    spec = dataclasses.replace(TINY, chat_template=None, name="skippy-tiny-plain")
    plain = llama_cpp.llama_model_load_from_file(
        os.fsencode(make_model(tmp_path / "plain.gguf", spec)),
        llama_cpp.llama_model_default_params(),
    )
    assert plain
    try:
        h = make_engine(lanes=1, on_model=plain)
        messages = (ChatMessage("user", "hello"),)
        h.engine.submit(
            GenerateRequest("c", messages=messages, max_tokens=3, sampling=greedy(eog_ban))
        )
        (done,) = h.recorder.wait_done(1)
        vocab = llama_cpp.llama_model_get_vocab(plain)
        chatml = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
        assert done["outcome"] == "completed"
        assert done["figures"]["prompt_tokens"] == len(tokenize(llama_cpp, vocab, chatml))
        h.engine.stop()
    finally:
        llama_cpp.llama_model_free(plain)


def test_seeded_sampling_is_deterministic_and_greedy_is_too(make_engine: EngineFactory) -> None:
    h = make_engine(lanes=2)
    seeded = SamplingParams(temperature=1.0, seed=77)
    for rid in ("s1", "s2"):
        h.engine.submit(GenerateRequest(rid, prompt=PROMPT, max_tokens=24, sampling=seeded))
    for rid in ("g1", "g2"):
        h.engine.submit(GenerateRequest(rid, prompt=PROMPT, max_tokens=24, sampling=greedy()))
    h.engine.submit(
        GenerateRequest(
            "other", prompt=PROMPT, max_tokens=24, sampling=dataclasses.replace(seeded, seed=78)
        )
    )
    h.recorder.wait_done(5)
    assert h.recorder.text("s1") == h.recorder.text("s2")
    assert h.recorder.text("g1") == h.recorder.text("g2")
    assert h.recorder.text("s1") != h.recorder.text("other")


def test_no_message_but_gen_text_carries_prompt_words(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    canaries = ("pelican", "zeppelin", "marmalade", "quixotic")
    prompt = " ".join(canaries)
    h = make_engine(lanes=2, n_ctx=512, prefill_chunk_tokens=4)
    h.engine.submit(
        GenerateRequest(
            "p1", prompt=prompt, session="s-9", max_tokens=6, stop=("marmalade",),
            sampling=greedy(eog_ban),
        )
    )  # fmt: skip
    h.engine.submit(
        GenerateRequest(
            "p2", messages=(ChatMessage("user", prompt),), max_tokens=300, sampling=greedy(eog_ban)
        )
    )
    h.engine.submit(GenerateRequest("p3", prompt=prompt * 200))  # too long for a lane
    h.recorder.wait_done(3)
    h.engine.drop_session("s-9", "dropped")
    h.recorder.wait_for(lambda m: m["msg"] == "session" and m["event"] == "evicted")
    for message in h.recorder.messages:
        if message["msg"] == "gen_text":
            continue
        encoded = json.dumps(message).lower()
        assert not any(word in encoded for word in canaries), message
        flat = dict(message)
        # gen_done's one record is its figures: numbers only (counts and durations).
        figures = flat.pop("figures") if message["msg"] == "gen_done" else {}
        assert not any(isinstance(v, list | dict) for v in flat.values()), message
        assert all(v is None or type(v) in (int, float) for v in figures.values()), message
