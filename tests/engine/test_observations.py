"""BatchEngine observation switches: the events-off baseline and per-token debug observations."""

from __future__ import annotations

import json

from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import PROMPT, EngineFactory, greedy


def test_without_observations_only_text_and_terminals_are_sent(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
) -> None:
    h = make_engine(lanes=2, n_ctx=512, observations=False, token_observations=True)
    h.engine.submit(GenerateRequest("o1", prompt=PROMPT, session="s-1", max_tokens=12,
                                    sampling=greedy(eog_ban)))  # fmt: skip
    h.engine.submit(GenerateRequest("o2", prompt=PROMPT, max_tokens=12, sampling=greedy(eog_ban)))
    done = h.recorder.wait_done(2)
    h.engine.drop_session("s-1")
    h.engine.submit(GenerateRequest("o3", prompt=PROMPT, max_tokens=1, sampling=greedy(eog_ban)))
    h.recorder.wait_done(3)
    assert {m["msg"] for m in h.recorder.messages} == {"gen_text", "gen_done"}
    assert all(d["figures"]["generated_tokens"] == 12 for d in done)
    assert h.recorder.text("o1") == h.recorder.text("o2")


def test_token_observations_are_one_per_sampled_token_without_the_token(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
) -> None:
    h = make_engine(lanes=2, n_ctx=512, token_observations=True)
    h.engine.submit(GenerateRequest("t1", prompt=PROMPT, max_tokens=20, sampling=greedy(eog_ban)))
    h.engine.submit(GenerateRequest("t2", prompt=PROMPT, max_tokens=7, sampling=greedy(eog_ban)))
    h.recorder.wait_done(2)
    for request_id, count in (("t1", 20), ("t2", 7)):
        tokens = h.recorder.of(request_id, "gen_token")
        assert [m["index"] for m in tokens] == list(range(count))
        for message in tokens:
            assert set(message) == {"msg", "request_id", "index", "step_ms"}
            assert isinstance(message["step_ms"], float) and message["step_ms"] >= 0
        first = h.recorder.one(request_id, "gen_first_token")
        assert tokens[0]["step_ms"] == first["ttft_ms"]  # the first step is measured from submit
    text = h.recorder.text("t1")
    for message in h.recorder.kind("gen_token"):
        assert text.strip() not in json.dumps(message)


def test_a_sampled_end_of_generation_token_is_observed_too(make_engine: EngineFactory) -> None:
    h = make_engine(lanes=1, n_ctx=512, token_observations=True)
    h.engine.submit(GenerateRequest("e1", prompt=PROMPT, max_tokens=64, sampling=greedy()))
    (done,) = h.recorder.wait_done(1)
    sampled = done["figures"]["generated_tokens"] + (done["stop_reason"] == "eos")
    assert len(h.recorder.of("e1", "gen_token")) == sampled


def test_no_token_observations_by_default(
    make_engine: EngineFactory,
    eog_ban: tuple[tuple[int, float], ...],
) -> None:
    h = make_engine(lanes=1, n_ctx=512)
    h.engine.submit(GenerateRequest("d1", prompt=PROMPT, max_tokens=8, sampling=greedy(eog_ban)))
    h.recorder.wait_done(1)
    assert h.recorder.kind("gen_token") == []
    assert h.recorder.of("d1", "gen_first_token")
