"""The events-log filter language."""

from __future__ import annotations

from skippy_tui import demo
from skippy_tui.filtering import EventFilter
from skippyctl.events.catalog import EventId

EVENTS = demo.failed()


def _ids(text: str) -> set[str]:
    flt = EventFilter.parse(text)
    return {e.id.value for e in EVENTS if flt.matches(e)}


def test_empty_filter_matches_everything() -> None:
    assert not EventFilter.parse("  ").active
    assert _ids("") == {e.id.value for e in EVENTS}


def test_model_term_narrows_to_that_model() -> None:
    flt = EventFilter.parse("model:broken")
    assert all(e.scope.model_id == "broken" for e in EVENTS if flt.matches(e))
    assert EventId.MODEL_LOAD_FAILED.value in _ids("model:broken")


def test_category_id_severity_and_reason_terms() -> None:
    assert _ids("cat:node") == {"node_unavailable", "node_starting", "node_accepting_requests"}
    assert _ids("id:progress") == {"model_load_progress"}
    assert _ids("sev:error") == {"model_load_failed"}
    assert _ids("reason:format") == {"model_load_failed"}


def test_terms_combine_with_and_and_plain_words_search_everywhere() -> None:
    assert _ids("broken started") == {"model_load_started", "engine_process_started"}
    assert _ids("FAILED") == {"model_load_failed"}


def test_node_term_matches_the_events_node_and_nothing_without_one() -> None:
    event = EVENTS[0]
    flt = EventFilter.parse("node:GPU")
    assert flt.matches(event, "gpu1")
    assert not flt.matches(event, "local")
    assert not flt.matches(event)  # one runtime's events have no node
    assert EventFilter.parse("gpu1").matches(event, "gpu1")  # a plain word searches it too
    assert not EventFilter.parse("gpu1").matches(event)
