"""Every fact a llama.cpp log line states about a load is carried by a structured event, with
the log's figure, or is a known gap; and the checks can fail (package docstring)."""

from __future__ import annotations

import pytest

from tests.api.log_coverage.evidence import (
    Evidence,
    Fact,
    Run,
    evidence_of,
    has_extra_buffer_types,
)
from tests.api.log_coverage.facts import FACTS


@pytest.mark.parametrize("fact", FACTS, ids=lambda fact: fact.key)
def test_each_logged_fact_is_carried_by_a_structured_event(
    fact: Fact, results: dict[str, Evidence]
) -> None:
    evidence = results[fact.key]
    if fact.absent or (fact.needs_extra_buffer_type and not has_extra_buffer_types()):
        assert evidence.lines_seen == 0, f"llama.cpp now logs {fact.key}: give it an event"
        return
    assert evidence.lines_seen > 0, f"no log line states {fact.key} any more: {fact.pattern}"
    if fact.gap is None:
        assert evidence.covered, f"no event carries {fact.key} any more: {evidence}"
        assert set(evidence.carried_by) <= set(fact.event_ids), evidence
    else:
        assert not evidence.carried_by, (
            f"{fact.key} is carried now ({evidence.carried_by}): drop its gap, name its "
            f"event ids and regenerate docs/LOG_COVERAGE.md"
        )


def test_the_fallback_load_is_the_only_one_with_fallback_events(runs: dict[str, Run]) -> None:
    fallbacks = {m for m, run in runs.items() if run.of("cpu_fallback_activated")}
    assert fallbacks == {"gpu"}


@pytest.mark.parametrize(
    "fact", [f for f in FACTS if f.gap is None and not f.absent], ids=lambda fact: fact.key
)
def test_a_fact_is_uncovered_once_its_events_are_gone(fact: Fact, runs: dict[str, Run]) -> None:
    """The checks can fail: the same run without the fact's event ids covers nothing."""
    stripped = {
        model_id: Run(
            model_id, run.lines, tuple(e for e in run.events if e["kind"] not in fact.event_ids)
        )
        for model_id, run in runs.items()
    }
    assert not evidence_of(fact, stripped).covered
