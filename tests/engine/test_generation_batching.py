"""BatchEngine on real llama.cpp (tiny.gguf): simultaneous requests share decode steps, prefill
is chunked beside running generation, one write per iteration, progress messages rate-limited."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from skippyctl.engine import request_intake
from skippyctl.engine.generation import DECODE_THREAD_NAME, GenerateRequest, SamplingParams
from skippyctl.engine.protocol_messages import EngineMessage
from tests.engine.generation_harness import PROMPT, EngineFactory, Recorder, greedy


def test_concurrent_requests_share_decode_batches(
    make_engine: EngineFactory, eog_ban: tuple[tuple[int, float], ...]
) -> None:
    h = make_engine(lanes=3, start=False)
    for i in range(3):
        h.engine.submit(
            GenerateRequest(
                f"b{i}", prompt=f"{PROMPT} {i}", max_tokens=20, sampling=greedy(eog_ban)
            )
        )
    # Queued before the decode thread starts: this thread tokenizes each as it submits it, and
    # 20 tokens of the tiny model may be decoded before a loaded machine submits the next.
    h.engine.start()
    done = h.recorder.wait_done(3)
    assert all(m["outcome"] == "completed" for m in done)
    assert all(m["figures"]["shared_decode_steps"] > 0 for m in done)
    assert max(m["figures"]["max_batch"] for m in done) == 3
    assert all(m["figures"]["max_batch"] >= 2 for m in done)
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
    figures = [m["figures"] for m in done]
    assert [(f["shared_decode_steps"], f["max_batch"]) for f in figures] == [(4, 3)] * 3, done


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
    # The generation outlasts the long prefill however late this thread submits it (a loaded
    # machine); it is cancelled once the prefill's request is done.
    h.engine.submit(GenerateRequest("gen", prompt=PROMPT, max_tokens=900, sampling=greedy(eog_ban)))
    h.recorder.wait_for(lambda m: m["msg"] == "gen_first_token")
    long_prompt = "the quick brown fox jumps " * 40
    h.engine.submit(GenerateRequest("pre", prompt=long_prompt, max_tokens=2))
    h.recorder.wait_for(lambda m: m["msg"] == "gen_done" and m.get("request_id") == "pre")
    h.engine.cancel("gen")
    h.recorder.wait_done(2)
    gen = h.recorder.one("gen", "gen_done")["figures"]
    pre = h.recorder.one("pre", "gen_done")["figures"]
    # Every chunk of the long prefill rode along with a token of the running generation.
    assert pre["prompt_tokens"] > 16 * 5
    assert gen["shared_decode_steps"] >= 5
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
    figures = done["figures"]
    prefill = h.recorder.of("p", "gen_prefill_progress")
    assert len(prefill) <= figures["prefill_ms"] / 250
    if figures["prefill_ms"] >= 500:
        assert prefill
    assert all(m["total"] == figures["prompt_tokens"] for m in prefill)
    assert [m["done"] for m in prefill] == sorted({m["done"] for m in prefill})
    assert all(0 < m["done"] < m["total"] for m in prefill)
    times = h.recorder.times("p", "gen_prefill_progress")
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:], strict=False))

    generated = h.recorder.of("p", "gen_progress")
    assert len(generated) <= figures["decode_ms"] / 500 + 1
    assert [m["generated"] for m in generated] == sorted({m["generated"] for m in generated})
    times = h.recorder.times("p", "gen_progress")
    assert all(b - a >= 0.4 for a, b in zip(times, times[1:], strict=False))


def test_prompts_are_tokenized_on_the_submitting_thread_not_the_decode_thread(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request's prompt is tokenized (and a chat rendered) by the thread that submits it, as
    llama-server's HTTP threads do: the decode thread never spends a step's gap on it, and the
    engine's command thread does it while a step's llama_decode holds no GIL."""
    threads: list[str] = []
    tokenize = request_intake.tokenize_at_most

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(request_intake, "tokenize_at_most", recorded)
    h = make_engine(lanes=2)
    submitter = threading.Thread(
        target=lambda: h.engine.submit(
            GenerateRequest("p0", prompt=PROMPT, max_tokens=4, sampling=greedy(eog_ban))
        ),
        name="test-submitter",
    )
    submitter.start()
    submitter.join()
    outside_vocab = SamplingParams(temperature=0.0, logit_bias=((10**6, 1.0),))
    h.engine.submit(GenerateRequest("p1", prompt=PROMPT, max_tokens=4, sampling=outside_vocab))
    done = {m["request_id"]: m for m in h.recorder.wait_done(2)}
    assert done["p0"]["outcome"] == "completed"
    # A bias on a token outside the vocabulary is refused as before (found at intake).
    assert done["p1"]["outcome"] == "failed"
    assert done["p1"]["reason"] == "invalid_configuration"
    assert threads == ["test-submitter", threading.current_thread().name]
    assert DECODE_THREAD_NAME not in threads
