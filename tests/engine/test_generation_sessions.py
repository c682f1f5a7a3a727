"""BatchEngine on real llama.cpp (tiny.gguf): sessions reuse their lane's KV prefix, copy a shared
prompt start from another lane, are evicted when their lane is needed or under pressure, and are
dropped on request."""

from __future__ import annotations

from skippyctl.engine.generation import GenerateRequest
from tests.engine.generation_harness import PROMPT, EngineFactory, greedy


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
    assert done["figures"]["reused_tokens"] == started["reused_tokens"]
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
    # How long the evicted session's lane had been idle: from a's end to b's start.
    evicted = h.recorder.kind("session")[1]
    assert evicted["idle_ms"] is not None and evicted["idle_ms"] >= 0.0
    assert [m.get("idle_ms") for m in h.recorder.kind("session")][::2] == [None, None]
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
    assert h.recorder.one("new1", "gen_started")["cache"] == "partial"
    # new2 copies s-0's start beside new1, or, when new1 started before new2 was submitted (this
    # thread tokenizes each prompt as it submits it), new1's longer one: all but its last token.
    assert h.recorder.one("new2", "gen_started")["cache"] in ("partial", "hit")
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
