"""The engine-message → event tables (runtime/observations.py): complete, and what each builds."""

from __future__ import annotations

import typing

import pytest

from skippyctl.engine.protocol_messages import (
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenStarted,
    GenText,
    GenToken,
    KvChange,
    RequestObservation,
    SessionChange,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import BatchingMode, Progress, StopReason, summaries
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import (
    CacheResult,
    GenerationOutcome,
    Outcome,
    ProgressUnit,
    ReasonCode,
)
from skippyctl.runtime.observations import (
    CACHE_EVENTS,
    KV_EVENTS,
    OBSERVATION_EVENTS,
    OUTCOME_EVENTS,
    SESSION_EVENTS,
    Emission,
    done_emissions,
    host_ended_emissions,
    observation_emissions,
    unstarted_emission,
)


def test_the_tables_cover_every_value_they_translate() -> None:
    assert set(OUTCOME_EVENTS) == set(GenerationOutcome)
    assert set(KV_EVENTS) == set(KvChange)
    assert set(CACHE_EVENTS) == set(CacheResult) - {CacheResult.NONE}
    assert set(SESSION_EVENTS) == set(SessionChange) - {SessionChange.REUSED}
    # Every observation but the text (which is the request's stream) stands for events.
    assert set(OBSERVATION_EVENTS) == set(typing.get_args(RequestObservation)) - {GenText}
    for outcome, (generation, request, _) in OUTCOME_EVENTS.items():
        assert generation.value == f"generation_{outcome.value}"
        assert request.value == f"request_{outcome.value}"
    for result, event_id in CACHE_EVENTS.items():
        assert event_id.value == f"prompt_cache_restore_{result.value}"


@pytest.mark.parametrize(
    ("message", "has_session", "expected"),
    [
        (
            GenStarted("r", 1, "s", 10, 4, CacheResult.PARTIAL),
            True,
            (
                Emission(EventId.PROMPT_PROCESSING_STARTED),
                Emission(EventId.TOKENIZATION_COMPLETED, summaries(prompt_tokens=10)),
                Emission(EventId.CACHE_LOOKUP_HIT, summaries(reused_tokens=4, prompt_tokens=10)),
                Emission(
                    EventId.PROMPT_CACHE_RESTORE_PARTIAL,
                    summaries(reused_tokens=4, prompt_tokens=10),
                ),
                Emission(EventId.SESSION_ACTIVE, summaries(lanes=1)),
                Emission(EventId.PREFILL_STARTED, summaries(prompt_tokens=6)),
            ),
        ),
        (
            GenStarted("r", 0, None, 10, 0, CacheResult.NONE),
            False,
            (
                Emission(EventId.PROMPT_PROCESSING_STARTED),
                Emission(EventId.TOKENIZATION_COMPLETED, summaries(prompt_tokens=10)),
                Emission(EventId.CACHE_LOOKUP_MISS, summaries(reused_tokens=0, prompt_tokens=10)),
                Emission(EventId.PREFILL_STARTED, summaries(prompt_tokens=10)),
            ),
        ),
        (
            GenPrefillProgress("r", 3, 9),
            False,
            (Emission(EventId.PREFILL_PROGRESS, progress=Progress(3, 9, ProgressUnit.TOKENS)),),
        ),
        (
            GenPrefillDone("r", 9, 12.5),
            False,
            (
                Emission(EventId.PREFILL_COMPLETED, summaries(prompt_tokens=9), duration_ms=12.5),
                Emission(EventId.GENERATION_STARTED),
            ),
        ),
        (
            GenFirstToken("r", 30.0),
            False,
            (Emission(EventId.FIRST_TOKEN_PRODUCED, summaries(time_to_first_token_ms=30.0)),),
        ),
        (
            GenProgress("r", 17),
            False,
            (
                Emission(
                    EventId.GENERATION_PROGRESS, progress=Progress(17, None, ProgressUnit.TOKENS)
                ),
            ),
        ),
        (
            GenToken("r", 0, 1.25),
            False,
            (
                Emission(
                    EventId.GENERATION_TOKEN_OBSERVED,
                    summaries(generated_tokens=1),
                    duration_ms=1.25,
                ),
            ),
        ),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, bool | tuple) else "",
)
def test_each_observation_builds_its_events(
    message: typing.Any, has_session: bool, expected: tuple[Emission, ...]
) -> None:
    assert observation_emissions(message, has_session) == expected


def test_a_terminal_that_filled_its_lane_reports_context_exhausted_and_its_stop() -> None:
    figures = GenerationFigures(
        prompt_tokens=200,
        generated_tokens=57,
        prefill_ms=5.0,
        decode_ms=50.0,
        ttft_ms=6.0,
        prefill_tokens_per_s=40_000.0,
        decode_tokens_per_s=1_120.0,
        max_batch=1,
    )
    message = GenDone(
        "r", GenerationOutcome.COMPLETED, ReasonCode.CONTEXT_EXHAUSTED, StopReason.LENGTH, figures
    )
    emitted = done_emissions(message, has_session=True, duration_ms=70.0)
    assert [e.event_id for e in emitted] == [
        EventId.CONTEXT_EXHAUSTED,
        EventId.STOP_CONDITION_REACHED,
        EventId.GENERATION_COMPLETED,
        EventId.REQUEST_COMPLETED,
        EventId.SESSION_IDLE,
    ]
    generation = emitted[2]
    assert (generation.outcome, generation.stop_reason, generation.batching) == (
        Outcome.SUCCESS,
        StopReason.LENGTH,
        BatchingMode.SINGLE,
    )
    assert emitted[3].duration_ms == 70.0


def test_a_failed_terminal_reports_no_stop_condition() -> None:
    message = GenDone.refused("r", ReasonCode.INVALID_CONFIGURATION)
    emitted = done_emissions(message, has_session=False, duration_ms=1.0)
    assert [e.event_id for e in emitted] == [EventId.GENERATION_FAILED, EventId.REQUEST_FAILED]
    assert {e.reason for e in emitted} == {ReasonCode.INVALID_CONFIGURATION}


def test_host_ended_and_unstarted_terminals() -> None:
    timed_out = host_ended_emissions(
        GenerationOutcome.TIMED_OUT, ReasonCode.TIMEOUT, has_session=False, duration_ms=3.0
    )
    assert [(e.event_id, e.stop_reason) for e in timed_out] == [
        (EventId.GENERATION_TIMED_OUT, StopReason.TIMEOUT),
        (EventId.REQUEST_TIMED_OUT, None),
    ]
    refused = host_ended_emissions(
        GenerationOutcome.FAILED, ReasonCode.CONTEXT_EXHAUSTED, has_session=True, duration_ms=3.0
    )
    assert [e.event_id for e in refused] == [
        EventId.CONTEXT_EXHAUSTED,
        EventId.GENERATION_FAILED,
        EventId.REQUEST_FAILED,
        EventId.SESSION_IDLE,
    ]
    assert refused[1].stop_reason is StopReason.ERROR
    assert unstarted_emission(ReasonCode.TIMEOUT, 2.0) == Emission(
        EventId.REQUEST_TIMED_OUT,
        outcome=Outcome.FAILURE,
        reason=ReasonCode.TIMEOUT,
        duration_ms=2.0,
    )
    assert unstarted_emission(ReasonCode.CANCELLATION, 2.0).event_id is EventId.REQUEST_CANCELLED
