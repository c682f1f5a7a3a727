"""Request state alone: validation, the board's phase lists and deadline count, the terminal's
counters and the held-back observations (engine/request_state.py; no llama.cpp)."""

from __future__ import annotations

import math

import pytest

from skippyctl.engine.chat_template import ChatMessage, ToolCall
from skippyctl.engine.protocol_commands import Sampling
from skippyctl.engine.protocol_messages import GenFirstToken, GenPrefillDone
from skippyctl.engine.request_state import (
    GenerateRequest,
    Phase,
    RequestBoard,
    RequestState,
    validation_error,
)
from skippyctl.engine.sampling import SamplingParams
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import GenerationOutcome, ReasonCode


def state(request_id: str, deadline: float | None = None) -> RequestState:
    return RequestState(
        GenerateRequest(request_id, prompt="p", deadline_mono_s=deadline), 0.0, None
    )


CALLS_A_TOOL = ChatMessage("assistant", None, tool_calls=(ToolCall("f", "{}"),))


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (GenerateRequest("x", prompt="a"), None),
        (GenerateRequest("x", messages=(ChatMessage("user", "a"),)), None),
        (GenerateRequest(""), "request_id"),
        (GenerateRequest("x"), "exactly one of prompt and messages"),
        (GenerateRequest("x", prompt="a", messages=(ChatMessage("u", "b"),)),
         "exactly one of prompt and messages"),
        (GenerateRequest("x", messages=()), "messages"),
        (GenerateRequest("x", messages=(ChatMessage("user"),)), "messages"),
        (GenerateRequest("x", messages=(ChatMessage("user", None, parts=()),)), None),
        (GenerateRequest("x", messages=(CALLS_A_TOOL,)), None),
        (GenerateRequest("x", prompt="a", tools=[{}]), "tools"),  # type: ignore[arg-type]  # wrong type on purpose
        (GenerateRequest("x", prompt="a", chat_template_kwargs=[1]), "chat_template_kwargs"),  # type: ignore[arg-type]  # wrong type on purpose
        (GenerateRequest("x", prompt="a", session=""), "session"),
        (GenerateRequest("x", prompt="a", max_tokens=0), "max_tokens"),
        (GenerateRequest("x", prompt="a", max_tokens=True), "max_tokens"),
        (GenerateRequest("x", prompt="a", stop=["a"]), "stop"),  # type: ignore[arg-type]  # wrong type on purpose
        (GenerateRequest("x", prompt="a", sampling={"temperature": 0}), "sampling"),  # type: ignore[arg-type]  # wrong type on purpose
        (GenerateRequest("x", prompt="a", deadline_mono_s=math.nan), "deadline"),
    ],
)  # fmt: skip
def test_validation_names_the_field_never_the_content(
    request_: GenerateRequest, problem: str | None
) -> None:
    assert validation_error(request_) == problem


def test_an_invalid_request_carries_no_deadline() -> None:
    bad = RequestState(GenerateRequest("x", deadline_mono_s=1.0), 0.0, "prompt")
    assert bad.deadline is None and bad.phase is Phase.QUEUED


def test_the_board_counts_deadlines_and_expires_only_listed_requests_at_or_past_them() -> None:
    board = RequestBoard()
    soon, later, never = state("soon", 1.0), state("later", 5.0), state("never")
    for r in (soon, later, never):
        board.track(r)
    assert board.with_deadline == 2
    board.queue.extend((soon, never))
    board.decoding.append(later)
    assert board.expired(0.5) == []
    assert board.expired(1.0) == [soon]
    assert board.expired(9.0) == [soon, later]
    board.untrack(soon)
    board.untrack(soon)  # twice: counted once
    assert board.with_deadline == 1 and "soon" not in board.by_id


def test_unlist_takes_a_request_off_its_phase_list_even_when_it_is_off_already() -> None:
    board = RequestBoard()
    a, b = state("a"), state("b")
    board.prefilling.extend((a, b))
    board.unlist(a, Phase.PREFILL)
    board.unlist(a, Phase.PREFILL)
    board.unlist(b, Phase.DECODE)  # not on that list: nothing happens
    assert list(board.prefilling) == [b]


def test_orphans_are_tracked_requests_on_no_list() -> None:
    board = RequestBoard()
    listed, popped = state("listed"), state("popped")
    board.track(listed)
    board.track(popped)
    board.decoding.append(listed)
    assert board.orphans() == [popped]
    assert board.running() == (listed,)


def test_held_observations_are_taken_once_in_order() -> None:
    r = state("r")
    r.held_observations.append(GenPrefillDone("r", 3, 1.5))
    r.held_observations.append(GenFirstToken("r", 2.0))
    assert r.take_held() == [GenPrefillDone("r", 3, 1.5), GenFirstToken("r", 2.0)]
    assert r.take_held() == []


def test_the_terminal_counts_rates_and_defaults_reasons() -> None:
    r = state("r")
    r.submitted = 10.0
    r.prompt = [1, 2, 3, 4, 5]
    r.reused = 1
    r.prefill_pos = 5
    r.t_prefill_start, r.t_prefill_end = 10.0, 10.5
    r.sampled, r.generated_tokens = 3, 2
    r.t_first, r.t_last = 10.6, 11.6
    r.shared_decode_steps, r.max_batch = 2, 3
    r.spec_proposed, r.spec_accepted = 5, 3
    done = r.done_message(GenerationOutcome.COMPLETED, StopReason.EOS)
    assert done.reason is None
    figures = done.figures
    assert (figures.prompt_tokens, figures.generated_tokens, figures.reused_tokens) == (5, 2, 1)
    assert (figures.prefill_ms, figures.decode_ms, figures.ttft_ms) == (500.0, 1000.0, 600.0)
    assert figures.engine_wait_ms == 0.0  # its prefill began the moment it arrived
    assert figures.prefill_tokens_per_s == 8.0  # 4 prefilled tokens in 0.5 s
    assert figures.decode_tokens_per_s == 2.0  # 2 tokens after the first in 1 s
    assert (figures.shared_decode_steps, figures.max_batch) == (2, 3)
    assert figures.spec_rejected == 2
    cancelled = state("c").done_message(GenerationOutcome.CANCELLED, StopReason.CANCELLED)
    assert cancelled.reason is ReasonCode.CANCELLATION
    unmeasured = cancelled.figures
    assert unmeasured.ttft_ms is None and unmeasured.decode_tokens_per_s is None
    assert unmeasured.engine_wait_ms is None  # it never reached a lane
    timed_out = state("t").done_message(GenerationOutcome.TIMED_OUT, StopReason.TIMEOUT)
    assert timed_out.reason is ReasonCode.TIMEOUT


def test_a_refused_prompt_reports_the_tokens_it_counted() -> None:
    r = state("long")
    r.prompt_count = 70_000
    done = r.done_message(GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.CONTEXT_EXHAUSTED)
    assert (done.figures.prompt_tokens, done.reason) == (70_000, ReasonCode.CONTEXT_EXHAUSTED)


def test_sampling_defaults_match_the_protocol_defaults() -> None:
    """The host's unvalidated Sampling and the engine's SamplingParams agree on every default
    they share, so an omitted field means the same on both sides."""
    host, engine = Sampling(), SamplingParams()
    for name in Sampling.__dataclass_fields__:
        assert getattr(host, name) == getattr(engine, name), name
