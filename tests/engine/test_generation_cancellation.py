"""BatchEngine on real llama.cpp (tiny.gguf): cancels, deadlines and the engine's stop end each
request exactly once, running or queued, and keep what they should (a session's prefix)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from skippyctl.engine.generation import GenerateRequest, SamplingParams
from tests.engine.generation_harness import PROMPT, EngineFactory, Message, greedy


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
    assert done["figures"]["generated_tokens"] == 1  # the token of the step in which cancel arrived


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
    assert done["figures"]["generated_tokens"] < 2000
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
    assert h.recorder.one("run", "gen_done")["figures"]["generated_tokens"] < 2000


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
