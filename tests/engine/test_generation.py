"""BatchEngine on real llama.cpp (tiny.gguf): batching, sessions, limits, cancellation, messages."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import llama_cpp
import orjson
import pytest

from skippyctl.config.load_options import SpecMode
from skippyctl.engine.generation import (
    BatchEngine,
    ChatMessage,
    GenerateRequest,
    SamplingParams,
)
from skippyctl.engine.protocol import EngineMessage, encode
from skippyctl.engine.speculation import SpecConfig
from skippyctl.engine.text import apply_chat_template, tokenize
from skippyctl.fixtures.generate import TINY, make_model
from skippyctl.fixtures.vocab import EOS_ID

WAIT_S = 60.0
PROMPT = "The quick brown fox jumps over the lazy dog"

Message = dict[str, Any]


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(fixture_dir / "tiny.gguf"), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


@pytest.fixture(scope="module")
def eog_ban(model: Any) -> tuple[tuple[int, float], ...]:
    """A logit bias banning every end-of-generation token, so a run goes to its length limit."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    return tuple((t, -math.inf) for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))


class Recorder:
    """The engine's ``emit``: keeps every message as its control-channel payload (what the host
    receives); tests wait on gen_done counts."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.received_at: list[float] = []
        self._cond = threading.Condition()
        self.on_message: Callable[[Message], None] | None = None

    def __call__(self, typed: EngineMessage) -> None:
        message = orjson.loads(encode(typed))
        json.dumps(message)  # JSON-ready, or the test fails loudly
        with self._cond:
            self.messages.append(message)
            self.received_at.append(time.monotonic())
            self._cond.notify_all()
        if self.on_message is not None:
            self.on_message(message)

    def done(self) -> list[Message]:
        with self._cond:
            return [m for m in self.messages if m["msg"] == "gen_done"]

    def wait_done(self, count: int, timeout_s: float = WAIT_S) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while sum(m["msg"] == "gen_done" for m in self.messages) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"timed out waiting for {count} gen_done"
                self._cond.wait(left)
        return self.done()

    def wait_for(self, predicate: Callable[[Message], bool], timeout_s: float = WAIT_S) -> Message:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for a message"
                self._cond.wait(left)

    def of(self, request_id: str, kind: str) -> list[Message]:
        with self._cond:
            return [
                m for m in self.messages if m["msg"] == kind and m.get("request_id") == request_id
            ]

    def one(self, request_id: str, kind: str) -> Message:
        found = self.of(request_id, kind)
        assert len(found) == 1, (kind, found)
        return found[0]

    def text(self, request_id: str) -> str:
        return "".join(m["text"] for m in self.of(request_id, "gen_text"))

    def times(self, request_id: str, kind: str) -> list[float]:
        with self._cond:
            return [
                t
                for m, t in zip(self.messages, self.received_at, strict=True)
                if m["msg"] == kind and m.get("request_id") == request_id
            ]

    def kind(self, kind: str) -> list[Message]:
        with self._cond:
            return [m for m in self.messages if m["msg"] == kind]


@dataclasses.dataclass
class Harness:
    engine: BatchEngine
    recorder: Recorder
    context: Any


EngineFactory = Callable[..., Harness]


@pytest.fixture
def make_engine(model: Any) -> Iterator[EngineFactory]:
    made: list[Harness] = []

    def factory(
        lanes: int = 2,
        n_ctx: int = 1024,
        unified: bool = False,
        llama: ModuleType | SimpleNamespace = llama_cpp,
        on_model: Any = None,
        start: bool = True,
        n_threads: int | None = 1,
        **kwargs: Any,
    ) -> Harness:
        """A started engine on a fresh context.

        One compute thread by default: OpenMP's spinning barrier threads degrade badly when
        other processes share the cores, and these tests are about behaviour, not speed.
        """
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_seq_max = lanes
        params.kv_unified = unified
        the_model = model if on_model is None else on_model
        context = llama_cpp.llama_init_from_model(the_model, params)
        assert context
        recorder = Recorder()
        engine = BatchEngine(
            llama,  # type: ignore[arg-type]  # a fault-injecting proxy may stand in for the module
            the_model,
            context,
            lanes=lanes,
            emit=recorder,
            n_threads=n_threads,
            **kwargs,
        )
        harness = Harness(engine, recorder, context)
        made.append(harness)
        if start:
            engine.start()
        return harness

    yield factory
    for harness in made:
        harness.engine.stop()
        llama_cpp.llama_free(harness.context)


def greedy(eog_ban: tuple[tuple[int, float], ...] = (), **kwargs: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, logit_bias=eog_ban, **kwargs)


# ---------------------------------------------------------------- basics


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
    assert set(done) == {
        "msg", "request_id", "outcome", "reason", "stop_reason", "prompt_tokens",
        "completion_tokens", "reused_tokens", "prefill_ms", "decode_ms", "ttft_ms",
        "prefill_tokens_per_s", "decode_tokens_per_s", "shared_steps", "max_batch",
        "spec_windows", "spec_proposed", "spec_accepted", "spec_late", "spec_discarded",
    }  # fmt: skip
    assert done["outcome"] == "completed"
    assert done["reason"] is None
    assert done["stop_reason"] == "length"
    assert done["prompt_tokens"] == started["prompt_tokens"]
    assert done["completion_tokens"] == 16
    assert done["ttft_ms"] == first["ttft_ms"]
    assert done["decode_tokens_per_s"] > 0
    assert done["prefill_tokens_per_s"] > 0
    assert done["shared_steps"] == 0
    assert done["max_batch"] == 1
    assert h.recorder.text("r1")
    if done["prefill_ms"] < 250:
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
    assert done["completion_tokens"] == 0
    assert done["ttft_ms"] is not None  # a token (the EOS) was sampled
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
    assert done["completion_tokens"] == 3
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
    assert done["completion_tokens"] == 1


def test_chat_messages_use_the_model_template(
    make_engine: EngineFactory, model: Any, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    messages = (ChatMessage("user", "hello world"),)
    h.engine.submit(GenerateRequest("c", messages=messages, max_tokens=4, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    vocab = llama_cpp.llama_model_get_vocab(model)
    rendered = apply_chat_template(llama_cpp, None, messages)
    assert done["outcome"] == "completed"
    assert done["prompt_tokens"] == len(tokenize(llama_cpp, vocab, rendered))


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
        chatml = apply_chat_template(llama_cpp, "chatml", messages)
        assert done["outcome"] == "completed"
        assert done["prompt_tokens"] == len(tokenize(llama_cpp, vocab, chatml))
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


# ---------------------------------------------------------------- stop strings and limits


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
    assert (done["stop_reason"], done["completion_tokens"]) == ("length", 3)


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
    assert long_done["prompt_tokens"] > 256
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
    assert done["prompt_tokens"] + done["completion_tokens"] == 256 + 1  # last one never decoded
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


# ---------------------------------------------------------------- batching


def test_concurrent_requests_share_decode_batches(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=3)
    for i in range(3):
        h.engine.submit(
            GenerateRequest(
                f"b{i}", prompt=f"{PROMPT} {i}", max_tokens=20, sampling=greedy(eog_ban)
            )
        )
    done = h.recorder.wait_done(3)
    assert all(m["outcome"] == "completed" for m in done)
    assert all(m["shared_steps"] > 0 for m in done)
    assert max(m["max_batch"] for m in done) == 3
    assert all(m["max_batch"] >= 2 for m in done)
    assert {h.recorder.one(f"b{i}", "gen_started")["lane"] for i in range(3)} == {0, 1, 2}


def test_requests_that_arrive_together_prefill_in_one_step(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """Short prompts waiting together all fit one step's prefill budget: every first token
    comes from the first decode, before any request's second token (time to first token does
    not grow with the number of requests that arrived at once)."""
    h = make_engine(lanes=3, start=False)
    for i in range(3):
        h.engine.submit(
            GenerateRequest(f"t{i}", prompt=f"{PROMPT} {i}", max_tokens=4, sampling=greedy(eog_ban))
        )
    h.engine.start()  # the three are in the inbox before the first step
    done = h.recorder.wait_done(3)
    # Four steps each (the prefill that samples the first token, three decodes), all three
    # requests in every one of them: none waited for another's prefill.
    assert [(m["shared_steps"], m["max_batch"]) for m in done] == [(4, 3)] * 3, done


def test_with_emit_many_each_iteration_sends_its_messages_in_one_call(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """The worker's path: one call (one write to the host) per decode-loop iteration, in the
    order the core emitted them, and the same messages as one call each."""
    batches: list[int] = []
    recorder = Recorder()

    def emit_many(messages: list[EngineMessage]) -> int:
        batches.append(len(messages))
        for message in messages:
            recorder(message)
        return 0

    h = make_engine(lanes=3, start=False, emit_many=emit_many)
    for i in range(3):
        h.engine.submit(
            GenerateRequest(f"m{i}", prompt=f"{PROMPT} {i}", max_tokens=6, sampling=greedy(eog_ban))
        )
    h.engine.start()
    done = recorder.wait_done(3)
    assert h.recorder.messages == []  # nothing went through the one-at-a-time emit
    assert sum(batches) == len(recorder.messages)
    assert max(batches) >= 3  # the three requests' texts of one step travel together
    assert [m["outcome"] for m in done] == ["completed"] * 3
    assert h.engine.emit_failures == 0
    for i in range(3):  # per request: started, texts, then its one gen_done last
        kinds = [m["msg"] for m in recorder.messages if m.get("request_id") == f"m{i}"]
        assert kinds[0] == "gen_started" and kinds[-1] == "gen_done"
        assert kinds.count("gen_done") == 1


def test_long_prefill_is_chunked_beside_running_generation(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2, n_ctx=2048, prefill_chunk_tokens=16)
    h.engine.submit(GenerateRequest("gen", prompt=PROMPT, max_tokens=60, sampling=greedy(eog_ban)))
    h.recorder.wait_for(lambda m: m["msg"] == "gen_first_token")
    long_prompt = "the quick brown fox jumps " * 40
    h.engine.submit(GenerateRequest("pre", prompt=long_prompt, max_tokens=2))
    h.recorder.wait_done(2)
    gen = h.recorder.one("gen", "gen_done")
    pre = h.recorder.one("pre", "gen_done")
    # Every chunk of the long prefill rode along with a token of the running generation.
    assert pre["prompt_tokens"] > 16 * 5
    assert gen["shared_steps"] >= 5
    assert pre["max_batch"] == 2


def test_progress_messages_are_rate_limited(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    # One prompt token per step makes a prefill long enough to report progress.
    h = make_engine(lanes=1, n_ctx=2048, prefill_chunk_tokens=1)
    long_prompt = "the quick brown fox jumps " * 160
    h.engine.submit(
        GenerateRequest("p", prompt=long_prompt, max_tokens=1200, sampling=greedy(eog_ban))
    )
    (done,) = h.recorder.wait_done(1)
    prefill = h.recorder.of("p", "gen_prefill_progress")
    assert len(prefill) <= done["prefill_ms"] / 250
    if done["prefill_ms"] >= 500:
        assert prefill
    assert all(m["total"] == done["prompt_tokens"] for m in prefill)
    assert [m["done"] for m in prefill] == sorted({m["done"] for m in prefill})
    assert all(0 < m["done"] < m["total"] for m in prefill)
    times = h.recorder.times("p", "gen_prefill_progress")
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:], strict=False))

    generated = h.recorder.of("p", "gen_progress")
    assert len(generated) <= done["decode_ms"] / 500 + 1
    assert [m["generated"] for m in generated] == sorted({m["generated"] for m in generated})
    times = h.recorder.times("p", "gen_progress")
    assert all(b - a >= 0.4 for a, b in zip(times, times[1:], strict=False))


# ---------------------------------------------------------------- sessions


def test_session_reuses_its_prefix_and_prefills_only_the_suffix(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2)
    h.engine.submit(
        GenerateRequest("t1", prompt=PROMPT, session="s-1", max_tokens=8, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(1)
    first = h.recorder.one("t1", "gen_started")
    assert first["cache"] == "miss"
    second_prompt = PROMPT + h.recorder.text("t1") + " and then the dog"
    h.engine.submit(
        GenerateRequest(
            "t2", prompt=second_prompt, session="s-1", max_tokens=4, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(2)
    started = h.recorder.one("t2", "gen_started")
    prefill = h.recorder.one("t2", "gen_prefill_done")
    done = h.recorder.one("t2", "gen_done")
    assert started["cache"] in {"partial", "hit"}
    assert started["lane"] == first["lane"]
    assert started["reused_tokens"] > first["prompt_tokens"] // 2
    assert prefill["tokens"] == started["prompt_tokens"] - started["reused_tokens"]
    assert done["reused_tokens"] == started["reused_tokens"]
    events = [(m["event"], m["session"]) for m in h.recorder.kind("session")]
    # Re-tokenized completion text may split differently from the sampled tokens: then the
    # diverging tail of the KV is trimmed rather than reused as is.
    assert events[0] == ("created", "s-1")
    assert events[1] in {("reused", "s-1"), ("trimmed", "s-1")}
    assert h.recorder.kind("session")[1]["tokens"] == started["reused_tokens"]

    # The same prompt again: everything but the last token is cached (a "hit").
    h.engine.submit(
        GenerateRequest(
            "t3", prompt=second_prompt, session="s-1", max_tokens=1, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(3)
    third = h.recorder.one("t3", "gen_started")
    assert third["cache"] == "hit"
    assert third["reused_tokens"] == third["prompt_tokens"] - 1
    assert h.recorder.one("t3", "gen_prefill_done")["tokens"] == 1
    # The lane held t2's completion beyond the prompt: that tail was trimmed.
    assert h.recorder.kind("session")[-1]["event"] == "trimmed"


def test_session_whose_kv_is_a_prefix_of_the_prompt_is_reused_untrimmed(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    # max_tokens=1: the one sampled token is never decoded, so the KV holds exactly the prompt.
    h.engine.submit(
        GenerateRequest("u1", prompt=PROMPT, session="s-u", max_tokens=1, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(1)
    h.engine.submit(
        GenerateRequest(
            "u2", prompt=PROMPT + " and then", session="s-u", max_tokens=1, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(2)
    first = h.recorder.one("u1", "gen_started")
    second = h.recorder.one("u2", "gen_started")
    assert second["cache"] == "partial"
    assert second["reused_tokens"] == first["prompt_tokens"]
    last = h.recorder.kind("session")[-1]
    assert (last["event"], last["tokens"]) == ("reused", first["prompt_tokens"])


def test_idle_session_is_evicted_when_its_lane_is_needed(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(
        GenerateRequest("a", prompt=PROMPT, session="s-a", max_tokens=2, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(1)
    h.engine.submit(GenerateRequest("b", prompt=PROMPT, max_tokens=2, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    h.engine.submit(
        GenerateRequest("c", prompt=PROMPT, session="s-a", max_tokens=2, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(3)
    sessions = [(m["event"], m.get("reason")) for m in h.recorder.kind("session")]
    assert sessions == [("created", None), ("evicted", "lane_needed"), ("created", None)]
    # The lane kept b's KV (same prompt): c, new to the lane, prefills only the last token.
    for request in ("b", "c"):
        started = h.recorder.one(request, "gen_started")
        assert started["cache"] == "hit"
        assert started["reused_tokens"] == started["prompt_tokens"] - 1


def test_new_sessions_copy_a_lane_sharing_their_prompt_start_instead_of_prefilling_it(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """Many sessions with one system prompt arriving together: each lane gets the shared start
    from the lane that has it (a KV copy), not from its own prefill — and the donor keeps its
    session and KV."""
    system = " ".join([PROMPT] * 6)  # comfortably more shared tokens than the copy threshold
    h = make_engine(lanes=3, n_ctx=3 * 512)
    h.engine.submit(
        GenerateRequest(
            "first", prompt=system, session="s-0", max_tokens=2, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(1)
    for i in (1, 2):
        h.engine.submit(
            GenerateRequest(
                f"new{i}",
                prompt=f"{system} and then {i}",
                session=f"s-{i}",
                max_tokens=4,
                sampling=greedy(eog_ban),
            )
        )
    done = h.recorder.wait_done(3)
    assert [m["outcome"] for m in done] == ["completed"] * 3
    first = h.recorder.one("first", "gen_started")
    for i in (1, 2):
        started = h.recorder.one(f"new{i}", "gen_started")
        assert started["lane"] != first["lane"]  # its own lane, with s-0's prompt copied in
        assert started["reused_tokens"] >= first["prompt_tokens"] - 2, started
        assert started["cache"] == "partial"
    h.engine.submit(
        GenerateRequest(
            "again", prompt=system, session="s-0", max_tokens=2, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(4)
    again = h.recorder.one("again", "gen_started")
    assert again["lane"] == first["lane"] and again["cache"] == "hit"


def test_drop_session_frees_its_kv(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(
        GenerateRequest("a", prompt=PROMPT, session="s-d", max_tokens=2, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(1)
    h.engine.drop_session("s-d", "dropped")
    evicted = h.recorder.wait_for(lambda m: m["msg"] == "session" and m["event"] == "evicted")
    assert evicted["reason"] == "dropped"
    assert evicted["tokens"] > 0
    h.engine.submit(
        GenerateRequest("b", prompt=PROMPT, session="s-d", max_tokens=2, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(2)
    assert h.recorder.one("b", "gen_started")["cache"] == "miss"


def test_unified_kv_reserves_a_share_per_lane_and_evicts_idle_sessions_under_pressure(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2, n_ctx=512, unified=True)
    assert h.engine.kv_unified
    assert h.engine.context_tokens_per_lane() == 256
    h.engine.submit(
        GenerateRequest(
            "warm", prompt=PROMPT, session="s-w", max_tokens=200, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_done(1)
    h.engine.submit(GenerateRequest("big", prompt=PROMPT, max_tokens=500, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    big = h.recorder.one("big", "gen_done")
    assert big["reason"] == "context_exhausted"
    evicted = [m for m in h.recorder.kind("session") if m["event"] == "evicted"]
    assert [(m["session"], m["reason"]) for m in evicted] == [("s-w", "pressure")]
    events = [m["event"] for m in h.recorder.kind("kv") if m["event"].startswith("pressure")]
    assert events[:2] == ["pressure_crossed", "pressure_cleared"]


# ---------------------------------------------------------------- cancellation and deadlines


def test_cancel_takes_effect_before_the_next_step(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1)

    def cancel_on_first_token(message: Message) -> None:
        if message["msg"] == "gen_first_token":
            h.engine.cancel(message["request_id"])

    h.recorder.on_message = cancel_on_first_token
    h.engine.submit(GenerateRequest("c", prompt=PROMPT, max_tokens=500, sampling=greedy(eog_ban)))
    (done,) = h.recorder.wait_done(1)
    assert (done["outcome"], done["reason"], done["stop_reason"]) == (
        "cancelled",
        "cancellation",
        "cancelled",
    )
    assert done["completion_tokens"] == 1  # the token of the step in which cancel arrived


def test_cancel_from_another_thread_keeps_the_session_prefix(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, n_ctx=2048)
    h.engine.submit(
        GenerateRequest(
            "c", prompt=PROMPT, session="s-c", max_tokens=2000, sampling=greedy(eog_ban)
        )
    )
    h.recorder.wait_for(lambda m: m["msg"] == "gen_text")
    h.engine.cancel("c")
    (done,) = h.recorder.wait_done(1)
    assert done["outcome"] == "cancelled"
    assert done["completion_tokens"] < 2000
    h.engine.submit(
        GenerateRequest("d", prompt=PROMPT, session="s-c", max_tokens=1, sampling=greedy(eog_ban))
    )
    h.recorder.wait_done(2)
    assert h.recorder.one("d", "gen_started")["cache"] == "hit"


def test_cancel_of_a_queued_request_answers_without_starting_it(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, start=False)
    h.engine.submit(GenerateRequest("a", prompt=PROMPT, max_tokens=5, sampling=greedy(eog_ban)))
    h.engine.submit(GenerateRequest("b", prompt=PROMPT, max_tokens=5, sampling=greedy(eog_ban)))
    h.engine.cancel("b")
    h.engine.start()
    h.recorder.wait_done(2)
    assert h.recorder.one("b", "gen_done")["outcome"] == "cancelled"
    assert h.recorder.of("b", "gen_started") == []
    assert h.recorder.one("a", "gen_done")["outcome"] == "completed"


def test_deadline_times_out_running_and_queued_requests(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, n_ctx=2048)
    soon = time.monotonic() + 0.05
    h.engine.submit(
        GenerateRequest(
            "run", prompt=PROMPT, max_tokens=2000, sampling=greedy(eog_ban), deadline_mono_s=soon
        )
    )
    h.engine.submit(
        GenerateRequest("late", prompt=PROMPT, max_tokens=2, deadline_mono_s=time.monotonic() - 1)
    )
    h.recorder.wait_done(2)
    for rid in ("run", "late"):
        done = h.recorder.one(rid, "gen_done")
        assert (done["outcome"], done["reason"], done["stop_reason"]) == (
            "timed_out",
            "timeout",
            "timeout",
        )
    assert h.recorder.of("late", "gen_started") == []
    assert h.recorder.one("run", "gen_done")["completion_tokens"] < 2000


# ---------------------------------------------------------------- invalid input, stop, faults


@pytest.mark.parametrize(
    "request_",
    [
        GenerateRequest("x"),
        GenerateRequest("x", prompt="a", messages=(ChatMessage("user", "b"),)),
        GenerateRequest("x", prompt="a", max_tokens=0),
        GenerateRequest("x", messages=()),
        GenerateRequest("x", prompt="a", stop=["a"]),  # type: ignore[arg-type]  # wrong type on purpose
        GenerateRequest("x", prompt="a", sampling=SamplingParams(logit_bias=((10**6, 1.0),))),
        GenerateRequest("x", messages=(ChatMessage("user", "nul\x00"),)),
        GenerateRequest("", prompt="a"),
    ],
    ids=[
        "no-prompt", "both", "zero-tokens", "empty-chat", "stop-list", "bias-vocab", "nul",
        "empty-id",
    ],
)  # fmt: skip
def test_invalid_requests_fail_with_invalid_configuration(
    make_engine: EngineFactory, request_: GenerateRequest
) -> None:
    h = make_engine(lanes=1)
    h.engine.submit(request_)
    h.engine.submit(GenerateRequest("after", prompt=PROMPT, max_tokens=2))
    h.recorder.wait_done(2)
    bad = h.recorder.one(request_.request_id, "gen_done")
    assert (bad["outcome"], bad["reason"]) == ("failed", "invalid_configuration")
    assert h.recorder.one("after", "gen_done")["outcome"] == "completed"


def test_duplicate_in_flight_request_id_is_refused(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=1, start=False)
    h.engine.submit(GenerateRequest("dup", prompt=PROMPT, max_tokens=3, sampling=greedy(eog_ban)))
    h.engine.submit(GenerateRequest("dup", prompt=PROMPT, max_tokens=3, sampling=greedy(eog_ban)))
    h.engine.start()
    done = h.recorder.wait_done(2)
    assert sorted(m["outcome"] for m in done) == ["completed", "failed"]


def test_stop_cancels_everything_pending_and_later_submits(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2, n_ctx=2048)
    for i in range(5):
        h.engine.submit(
            GenerateRequest(f"r{i}", prompt=PROMPT, max_tokens=2000, sampling=greedy(eog_ban))
        )
    h.recorder.wait_for(lambda m: m["msg"] == "gen_text")
    h.engine.stop()
    h.engine.submit(GenerateRequest("after", prompt=PROMPT))
    done = h.recorder.done()
    assert sorted(m["request_id"] for m in done) == ["after", "r0", "r1", "r2", "r3", "r4"]
    assert {m["outcome"] for m in done} == {"cancelled"}
    assert not any(t.name == "skippy-decode" and t.is_alive() for t in threading.enumerate())


def test_stop_before_start_answers_what_was_submitted(make_engine: EngineFactory) -> None:
    h = make_engine(lanes=1, start=False)
    h.engine.submit(GenerateRequest("queued", prompt=PROMPT))
    h.engine.submit(GenerateRequest("invalid"))
    h.engine.stop()
    h.engine.stop()  # idempotent
    outcomes = {m["request_id"]: (m["outcome"], m["reason"]) for m in h.recorder.done()}
    assert outcomes == {
        "queued": ("cancelled", "cancellation"),
        "invalid": ("failed", "invalid_configuration"),
    }
    with pytest.raises(RuntimeError):
        h.engine.start()


def test_an_exception_inside_one_request_fails_only_that_request(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    calls = {"n": 0}

    def flaky_sample(sampler: Any, context: Any, index: int) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return int(llama_cpp.llama_sampler_sample(sampler, context, index))

    proxy = SimpleNamespace(
        **{name: getattr(llama_cpp, name) for name in dir(llama_cpp) if name.startswith("llama_")}
    )
    proxy.llama_sampler_sample = flaky_sample
    h = make_engine(lanes=2, llama=proxy)
    for rid in ("a", "b"):
        h.engine.submit(GenerateRequest(rid, prompt=PROMPT, max_tokens=8, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    h.engine.submit(GenerateRequest("c", prompt=PROMPT, max_tokens=8, sampling=greedy(eog_ban)))
    done = h.recorder.wait_done(3)
    outcomes = sorted((m["outcome"], m["reason"]) for m in done)
    assert outcomes == [
        ("completed", None),
        ("completed", None),
        ("failed", "internal_runtime_failure"),
    ]


# ---------------------------------------------------------------- burst and privacy


def test_burst_with_random_cancels_gets_exactly_one_gen_done_each(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=2)
    rng = random.Random(20240601)
    ids = [f"burst-{i}" for i in range(20)]
    for i, rid in enumerate(ids):
        h.engine.submit(
            GenerateRequest(
                rid,
                prompt=f"{PROMPT} {i}",
                session=f"s-{i % 3}" if i % 2 else None,
                max_tokens=rng.randint(1, 24),
                stop=("zz",) if i % 5 == 0 else (),
                sampling=SamplingParams(seed=i, logit_bias=eog_ban),
            )
        )
        if rng.random() < 0.3:
            h.engine.cancel(ids[rng.randrange(i + 1)])
    h.recorder.wait_done(20)
    done = h.recorder.done()
    assert sorted(m["request_id"] for m in done) == sorted(ids)
    # A lane never runs two requests at once.
    running: dict[int, str] = {}
    for m in h.recorder.messages:
        if m["msg"] == "gen_started":
            assert m["lane"] not in running
            running[m["lane"]] = m["request_id"]
        elif m["msg"] == "gen_done" and m["request_id"] in running.values():
            del running[next(k for k, v in running.items() if v == m["request_id"])]
    assert {m["outcome"] for m in done} <= {"completed", "cancelled"}


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
        assert not any(isinstance(v, list | dict) for v in message.values()), message


# ---------------------------------------------------------------- speculation (n-gram)

NGRAM = SpecConfig(SpecMode.NGRAM, draft_tokens=8)
SPEC_PROMPTS = ("The quick brown fox", "Once upon a time", "one two three four five")


def _both_modes(
    make_engine: EngineFactory,
    requests: list[GenerateRequest],
    sequential: bool = False,
    **engine: Any,
) -> tuple[Recorder, Recorder]:
    """The same requests on an engine without and one with n-gram speculation."""
    recorders = []
    for spec in (SpecConfig(), NGRAM):
        h = make_engine(speculation=spec, **engine)
        if sequential:
            for count, request in enumerate(requests, 1):
                h.engine.submit(request)
                h.recorder.wait_done(count)
        else:
            for request in requests:
                h.engine.submit(request)
            h.recorder.wait_done(len(requests))
        recorders.append(h.recorder)
    return recorders[0], recorders[1]


@pytest.mark.parametrize("lanes", [1, 3])
def test_speculation_commits_exactly_what_one_token_a_step_gives(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...], lanes: int
) -> None:
    requests = [
        GenerateRequest(f"s{i}", prompt=p, max_tokens=120, sampling=greedy(eog_ban))
        for i, p in enumerate(SPEC_PROMPTS[:lanes])
    ]
    plain, speculated = _both_modes(make_engine, requests, lanes=lanes, n_threads=2)
    accepted = 0
    for request in requests:
        off = plain.one(request.request_id, "gen_done")
        on = speculated.one(request.request_id, "gen_done")
        assert speculated.text(request.request_id) == plain.text(request.request_id)
        assert on["completion_tokens"] == off["completion_tokens"] == 120
        assert off["spec_windows"] == off["spec_proposed"] == off["spec_accepted"] == 0
        assert 0 <= on["spec_accepted"] <= on["spec_proposed"] <= 8 * on["spec_windows"]
        accepted += on["spec_accepted"]
    # The tiny model's greedy text falls into repeats: some proposals must have been right.
    assert accepted > 0


def test_a_session_continues_from_speculated_kv_as_from_plain_kv(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    """Rejected proposals leave no KV behind: the session's next request, which reuses the
    lane's KV, continues exactly as without speculation."""
    first = GenerateRequest(
        "k1", prompt=PROMPT, session="s", max_tokens=60, sampling=greedy(eog_ban)
    )
    plain, speculated = _both_modes(make_engine, [first], lanes=1)
    follow = PROMPT + plain.text("k1") + " and"
    second = GenerateRequest(
        "k2", prompt=follow, session="s", max_tokens=40, sampling=greedy(eog_ban)
    )
    plain2, speculated2 = _both_modes(make_engine, [first, second], sequential=True, lanes=1)
    assert speculated2.text("k1") == plain2.text("k1") == plain.text("k1")
    assert speculated2.text("k2") == plain2.text("k2")
    on, off = speculated2.one("k2", "gen_started"), plain2.one("k2", "gen_started")
    assert on["reused_tokens"] == off["reused_tokens"] > 0


def test_speculation_keeps_the_lane_limit_stop_strings_and_max_tokens(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    plain, _ = _both_modes(
        make_engine,
        [GenerateRequest("p", prompt=PROMPT, max_tokens=40, sampling=greedy(eog_ban))],
        lanes=1,
    )
    text = plain.text("p")
    stop = text[25:28]  # somewhere inside the generation, likely inside a window
    requests = [
        GenerateRequest("full", prompt=PROMPT, max_tokens=500, sampling=greedy(eog_ban)),
        GenerateRequest(
            "stop", prompt=PROMPT, max_tokens=40, stop=(stop,), sampling=greedy(eog_ban)
        ),
        GenerateRequest("short", prompt=PROMPT, max_tokens=13, sampling=greedy(eog_ban)),
    ]
    # 128 cells a lane: "full" runs into the lane's end.
    off, on = _both_modes(make_engine, requests, lanes=3, n_ctx=3 * 128, n_threads=2)
    for request_id in ("full", "stop", "short"):
        assert on.text(request_id) == off.text(request_id), request_id
        done_on, done_off = on.one(request_id, "gen_done"), off.one(request_id, "gen_done")
        for key in ("completion_tokens", "stop_reason", "reason"):
            assert done_on[key] == done_off[key], (request_id, key)
    assert on.one("full", "gen_done")["reason"] == "context_exhausted"
    assert on.one("stop", "gen_done")["stop_reason"] == "stop"
    assert on.one("short", "gen_done")["completion_tokens"] == 13
