"""The typed state-document reader: it reads back what `state_document` wrote, in the reducer's
enums, and tolerates what a newer runtime might send."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from skippy_tui import demo
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import ProgressUnit
from skippyctl.output.state import state_document
from skippyctl.output.state_reader import ABSENT, EnumValue, LoadableEntry, read_state_document
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import (
    EventSystemView,
    ModelState,
    NodeState,
    RuntimeView,
    lanes_in_use,
    queue_depth,
)

SCENARIOS = {
    "loading": demo.loading(),
    "available": demo.available(),
    "failed": demo.available() + demo.failed(),
    "sessions": demo.sessions(),
    "pressure": demo.pressure(),
    "topology": demo.topology(),
}


def _reduced(events: list[Event]) -> RuntimeView:
    view = RuntimeView()
    for event in events:
        view, _ = reduce(view, event)
    return view


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_reading_of_a_document_agrees_with_the_state_it_was_built_from(
    scenario: str,
) -> None:
    view = _reduced(SCENARIOS[scenario])
    document = orjson.loads(orjson.dumps(state_document(view, health={"subscribers_lagging": 2})))
    reading = read_state_document(document)
    assert reading.runtime == EnumValue(view.runtime.value, view.runtime)
    assert reading.node == EnumValue(view.node.value, view.node)
    assert reading.native_mode.member is view.native_mode
    assert reading.event_system == view.event_system
    assert reading.subscribers_lagging == 2
    assert [m.model_id for m in reading.models] == [str(m) for m in view.models]
    for entry in reading.models:
        model = view.models[LogicalId(entry.model_id)]
        assert entry.state == EnumValue(model.state.value, model.state)
        reason = model.reason_code
        assert entry.reason_code == (None if reason is None else EnumValue(reason.value, reason))
        assert entry.progress == model.progress
        assert entry.lanes == model.lanes and entry.context_tokens == model.context_tokens
        assert entry.lanes_in_use == lanes_in_use(view, model.model_id)
        assert entry.queue_depth == queue_depth(view, model.model_id)
        assert entry.decode_tokens_per_s == model.decode_tokens_per_s
        assert entry.model_size_bytes == model.model_size_bytes
    assert [(s.session_id, s.state.member) for s in reading.sessions] == [
        (str(s.session_id), s.state) for s in view.sessions.values()
    ]


def test_the_scenarios_cover_more_than_one_state() -> None:
    """Guard for the test above: it must see loading, serving and failed models."""
    seen = {
        model.state for events in SCENARIOS.values() for model in _reduced(events).models.values()
    }
    assert {ModelState.LOADING, ModelState.AVAILABLE, ModelState.FAILED} <= seen


def test_values_a_newer_runtime_might_send_keep_their_name_and_match_no_member() -> None:
    document: dict[str, Any] = {
        "runtime": "hibernating",
        "node": "accepting",
        "models": [
            {"model_id": "tiny", "state": "teleporting", "reason_code": "solar_flare"},
            {"model_id": "small", "state": "available"},
        ],
        "sessions": [{"session_id": "s-1", "state": "dreaming", "model_id": "tiny"}],
        "event_system": {"dropped_state": 3, "dropped_future": 9, "exporter_degraded": True},
    }
    reading = read_state_document(document)
    assert reading.runtime == EnumValue("hibernating", None)
    assert reading.node == EnumValue("accepting", NodeState.ACCEPTING)
    tiny = reading.model("tiny")
    assert tiny is not None
    assert tiny.state == EnumValue("teleporting", None)
    assert tiny.reason_code == EnumValue("solar_flare", None)
    small = reading.model("small")
    assert small is not None and small.state.member is ModelState.AVAILABLE
    assert small.reason_code is None
    assert reading.model("absent") is None
    assert reading.sessions[0].state == EnumValue("dreaming", None)
    assert reading.event_system == EventSystemView(dropped_state=3, exporter_degraded=True)


def test_values_of_the_wrong_type_read_as_absent_and_entries_without_ids_are_left_out() -> None:
    document: dict[str, Any] = {
        "runtime": 7,
        "models": [
            {"model_id": "tiny", "state": None, "lanes": "2", "lanes_in_use": True, "progress": 5},
            {"state": "available"},
            "not a model",
        ],
        "sessions": {"s-1": {}},
        "event_system": {"dropped_state": "3", "coalesced": False, "exporter_degraded": 1},
        "health": {"subscribers_lagging": "many"},
    }
    reading = read_state_document(document)
    assert reading.runtime == EnumValue(ABSENT, None)
    assert reading.node == EnumValue(ABSENT, None)
    (tiny,) = reading.models
    assert tiny.state == EnumValue(ABSENT, None)
    assert (tiny.lanes, tiny.lanes_in_use, tiny.progress) == (None, 0, None)
    assert reading.sessions == ()
    assert reading.event_system == EventSystemView()
    assert reading.subscribers_lagging is None


def test_progress_without_a_unit_reads_as_no_unit() -> None:
    reading = read_state_document(
        {"models": [{"model_id": "tiny", "state": "loading", "progress": {"current": 3}}]}
    )
    (tiny,) = reading.models
    assert tiny.progress is not None
    assert (tiny.progress.current, tiny.progress.total, tiny.progress.unit) == (
        3,
        None,
        ProgressUnit.NONE,
    )


def test_loadable_models_are_read_and_what_does_not_fit_is_left_out() -> None:
    reading = read_state_document(
        {
            "loadable_models": [
                {"model_id": "held", "source": "preset", "pinned": True},
                {"model_id": "shelf", "source": "models_dir", "pinned": False, "idle_ttl_s": 90},
                {"model_id": "odd", "source": 3, "pinned": "yes", "idle_ttl_s": "soon"},
                {"source": "preset"},
                "not an entry",
            ]
        }
    )
    assert reading.loadable == (
        LoadableEntry("held", "preset", pinned=True),
        LoadableEntry("shelf", "models_dir", idle_ttl_s=90.0),
        LoadableEntry("odd", ABSENT),
    )
    assert read_state_document({"loadable_models": {"held": {}}}).loadable == ()


def test_an_empty_document_reads_as_nothing_known() -> None:
    reading = read_state_document({})
    assert reading.loadable == ()  # a runtime older than `loadable_models`
    assert reading.models == () and reading.sessions == ()
    assert reading.node.member is None and reading.runtime.member is None
    assert reading.event_system == EventSystemView()


def test_active_warnings_and_degraded_modes_are_read_from_the_document() -> None:
    """The reducer keeps what the deriver raised; the document lists it; the reader and `ps`
    show it (and drop it once cleared)."""
    from skippyctl.cli.state_tables import warnings_line
    from skippyctl.events.catalog import EventId
    from skippyctl.events.envelope import LogicalId, Scope, make_event, summaries
    from skippyctl.events.reasons import DegradedMode, ReasonCode
    from skippyctl.output.state import state_document
    from skippyctl.output.state_reader import read_state_document
    from skippyctl.pipeline.warnings import WarningDeriver, degraded_operation
    from skippyctl.reducer.reduce import reduce
    from skippyctl.reducer.state import RuntimeView

    deriver = WarningDeriver()
    state = RuntimeView()
    crossed = make_event(
        EventId.CACHE_PRESSURE_CROSSED,
        scope=Scope(model_id=LogicalId("tiny")),
        summaries=summaries(kv_cells_used=220, kv_cells_total=256),
    )
    for event in (
        *deriver.derive(crossed, state),
        degraded_operation(True, DegradedMode.LEGACY_INGRESS, ReasonCode.UNSUPPORTED_CAPABILITY),
    ):
        state, _ = reduce(state, event)
    view = read_state_document(state_document(state))
    assert [(w.code, w.reason_code, w.about) for w in view.warnings] == [
        ("kv_near_full", "context_exhausted", "tiny")
    ]
    assert view.degraded_modes == ("legacy_ingress",)
    line = warnings_line(view)
    assert "kv_near_full (tiny, context_exhausted)" in line and "legacy_ingress" in line
    cleared = make_event(EventId.CACHE_PRESSURE_CLEARED, scope=Scope(model_id=LogicalId("tiny")))
    for event in deriver.derive(cleared, state):
        state, _ = reduce(state, event)
    assert read_state_document(state_document(state)).warnings == ()
