"""The plugin link's reports as events (runtime/plugin_events.py) and their one-line summaries."""

from __future__ import annotations

import pytest

from skippyctl.engine.protocol_messages import GenDone, PluginCounters, PluginReported
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, StopReason, SummaryKey
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import GenerationOutcome, Outcome, ReasonCode
from skippyctl.output.summary import render_summary
from skippyctl.runtime.observations import done_emissions
from skippyctl.runtime.plugin_events import KINDS, plugin_events

MODEL = LogicalId("m")


@pytest.mark.parametrize(
    ("kind", "reason", "event_id", "code", "text"),
    [
        ("loaded", "ok", EventId.SERVING_PLUGIN_LOADED, None, "serving plugin started"),
        (
            "failed",
            "crashed",
            EventId.SERVING_PLUGIN_FAILED,
            ReasonCode.PROCESS_CRASH,
            "serving plugin failed: process_crash (2 failures so far)",
        ),
        (
            "disabled",
            "timeout",
            EventId.SERVING_PLUGIN_DISABLED,
            ReasonCode.TIMEOUT,
            "serving plugin disabled after 2 failures (last: timeout)",
        ),
        (
            "load_failed",
            "abi_mismatch",
            EventId.SERVING_PLUGIN_LOAD_FAILED,
            ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
            "serving plugin not loaded: incompatible_abi_or_feature_set; the model serves "
            "without it",
        ),
        (
            "failed",
            "a-word-this-host-does-not-know",
            EventId.SERVING_PLUGIN_FAILED,
            ReasonCode.UNKNOWN_FAILURE,
            "serving plugin failed: unknown_failure (2 failures so far)",
        ),
    ],
)
def test_a_report_is_one_event_scoped_to_the_model_and_plugin(
    kind: str, reason: str, event_id: EventId, code: ReasonCode | None, text: str
) -> None:
    (event,) = plugin_events(PluginReported("ngram_plugin.so", kind, reason, 2), MODEL)
    assert event.id is event_id
    assert event.scope.model_id == MODEL and event.scope.plugin_id == "ngram_plugin.so"
    assert event.reason_code is code
    assert event.outcome is (Outcome.SUCCESS if code is None else Outcome.FAILURE)
    assert event.summary_value(SummaryKey.COUNT) == 2
    assert render_summary(event) == text


def test_every_report_kind_has_an_event_and_unknown_ones_or_unsafe_names_are_left_out() -> None:
    assert set(KINDS) == {"loaded", "load_failed", "failed", "restarted", "disabled"}
    assert plugin_events(PluginReported("p", "exploded", "crashed", 1), MODEL) == []
    assert plugin_events(PluginReported("/abs/path/p.so", "failed", "crashed", 1), MODEL) == []


def _done(windows: int, proposed: int, accepted: int, late: int) -> GenDone:
    figures = GenerationFigures(
        prompt_tokens=3,
        generated_tokens=10,
        prefill_ms=1.0,
        decode_ms=2.0,
        ttft_ms=1.5,
        max_batch=1,
        spec_windows=windows,
        spec_proposed=proposed,
        spec_accepted=accepted,
        spec_rejected=proposed - accepted,
        spec_late=late,
    )
    return GenDone("r1", GenerationOutcome.COMPLETED, None, StopReason.LENGTH, figures)


def test_a_speculating_request_ends_with_its_speculation_summary() -> None:
    emitted = done_emissions(_done(3, 12, 9, 2), has_session=False, duration_ms=5.0)
    (summary,) = [e for e in emitted if e.event_id is EventId.SPECULATION_SUMMARIZED]
    values = {s.key: s.value for s in summary.numbers}
    assert values == {
        SummaryKey.SPEC_WINDOWS: 3,
        SummaryKey.SPEC_PROPOSED_TOKENS: 12,
        SummaryKey.SPEC_ACCEPTED_TOKENS: 9,
        SummaryKey.SPEC_REJECTED_TOKENS: 3,
        SummaryKey.SPEC_LATE_QUERIES: 2,
        SummaryKey.SPEC_DISCARDED_TOKENS: 0,
    }
    # The request's terminal stays last.
    assert emitted[-1].event_id is EventId.REQUEST_COMPLETED


def test_a_request_that_did_not_speculate_has_no_speculation_summary() -> None:
    emitted = done_emissions(_done(0, 0, 0, 0), has_session=False, duration_ms=5.0)
    assert all(e.event_id is not EventId.SPECULATION_SUMMARIZED for e in emitted)


def test_a_report_made_during_the_load_is_part_of_the_load_operation() -> None:
    (during,) = plugin_events(
        PluginReported("ngram_plugin.so", "loaded", "ok", 0, operation_id="op-7"), MODEL
    )
    assert during.operation_id == "op-7"
    (after,) = plugin_events(PluginReported("ngram_plugin.so", "failed", "crashed", 1), MODEL)
    assert after.operation_id is None  # the load's terminal is past: not part of it


def test_counters_are_one_progress_event_with_counts_only() -> None:
    message = PluginCounters("ngram_plugin.so", 10, 2, 1, 3, 0, 4, 5, 6, 7)
    (event,) = plugin_events(message, MODEL)
    assert event.id is EventId.SERVING_PLUGIN_OBSERVED
    assert event.operation_id is None
    assert event.scope.plugin_id == "ngram_plugin.so"
    assert {s.key.value: s.value for s in event.summaries} == {
        "plugin_delivered": 10,
        "plugin_deferred": 2,
        "plugin_dropped": 1,
        "plugin_late": 3,
        "plugin_failures": 0,
        "plugin_discarded_invalid_token_count": 4,
        "plugin_discarded_invalid_token_id": 5,
        "plugin_discarded_position_mismatch": 6,
        "plugin_discarded_execution_failed": 7,
    }
    assert plugin_events(PluginCounters("/abs/p.so", 1, 0, 0, 0, 0, 0, 0, 0, 0), MODEL) == []


def test_the_counters_summary_names_each_count() -> None:
    (event,) = plugin_events(PluginCounters("ngram", 1234, 1, 2, 3, 1, 0, 2, 0, 4), MODEL)
    assert render_summary(event) == (
        "serving plugin: 1234 delivered, 1 deferred, 2 dropped, 3 late, 6 discarded otherwise, "
        "1 failures"
    )
