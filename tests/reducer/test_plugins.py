"""A model's serving plugins in the reduced state (reducer/plugins.py): each plugin's state from
its ``serving_plugin_*`` events, failures and restarts, and its delivery counters from
``serving_plugin_observed`` — table-driven, through the one reduce path."""

from __future__ import annotations

import pytest

from skippyctl.engine.protocol_messages import PluginCounters, PluginReported
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import PluginState, PluginView, RuntimeView
from skippyctl.runtime.plugin_events import plugin_events

MODEL = LogicalId("tiny")
PLUGIN = "ngram_plugin.so"


def _loaded_model() -> RuntimeView:
    state = RuntimeView()
    event = make_event(
        EventId.MODEL_LOAD_REQUESTED, operation_id=LogicalId("op-1"), scope=Scope(model_id=MODEL)
    )
    state, _ = reduce(state, event)
    return state


def _report(kind: str, reason: str = "ok", failures: int = 0) -> Event:
    (event,) = plugin_events(PluginReported(PLUGIN, kind, reason, failures), MODEL)
    return event


def _counters(**counts: int) -> Event:
    values = dict.fromkeys(
        (
            "delivered",
            "deferred",
            "dropped",
            "late",
            "failures",
            "discarded_invalid_token_count",
            "discarded_invalid_token_id",
            "discarded_position_mismatch",
            "discarded_execution_failed",
        ),
        0,
    )
    values.update(counts)
    (event,) = plugin_events(PluginCounters(PLUGIN, **values), MODEL)
    return event


def _plugin(state: RuntimeView) -> PluginView | None:
    (view,) = state.models[MODEL].plugins or (None,)
    return view


@pytest.mark.parametrize(
    ("events", "expected_state", "rejected", "duplicates"),
    [
        (["loaded"], PluginState.SERVING, 0, 0),
        (["loaded", "loaded"], PluginState.SERVING, 0, 1),
        (["loaded", "failed", "restarted"], PluginState.SERVING, 0, 0),
        (["loaded", "failed", "failed", "failed", "disabled"], PluginState.DISABLED, 0, 0),
        (["load_failed"], PluginState.LOAD_FAILED, 0, 0),
        (["failed"], None, 1, 0),  # a failure of a plugin never loaded: nothing to count it on
        (["load_failed", "failed"], PluginState.LOAD_FAILED, 1, 0),
        (["loaded", "disabled", "restarted"], PluginState.DISABLED, 1, 0),
    ],
)
def test_a_plugins_state_follows_its_reports(
    events: list[str], expected_state: PluginState | None, rejected: int, duplicates: int
) -> None:
    state = _loaded_model()
    for n, kind in enumerate(events):
        state, transitions = reduce(state, _report(kind, "crashed", failures=n))
        assert transitions == ()
    view = _plugin(state)
    assert (None if view is None else view.state) is expected_state
    assert state.counters.rejected_transitions == rejected
    assert state.counters.duplicate_transitions == duplicates


def test_counters_replace_the_last_ones_and_failures_and_restarts_are_kept() -> None:
    state = _loaded_model()
    state, _ = reduce(state, _report("loaded"))
    state, _ = reduce(state, _counters(delivered=5, late=1))
    state, _ = reduce(state, _report("failed", "crashed", failures=1))
    state, _ = reduce(state, _report("restarted", failures=1))
    state, _ = reduce(
        state, _counters(delivered=9, late=2, failures=1, discarded_invalid_token_id=3)
    )
    view = _plugin(state)
    assert view is not None
    assert (view.delivered, view.late, view.discarded_invalid_token_id) == (9, 2, 3)
    assert (view.failures, view.restarts, view.state) == (1, 1, PluginState.SERVING)


def test_counters_of_an_unknown_plugin_or_model_are_rejected() -> None:
    state = _loaded_model()
    state, _ = reduce(state, _counters(delivered=1))
    assert _plugin(state) is None and state.counters.rejected_transitions == 1
    (elsewhere,) = plugin_events(PluginReported(PLUGIN, "loaded", "ok", 0), LogicalId("not-loaded"))
    state, _ = reduce(state, elsewhere)
    assert state.counters.rejected_transitions == 2
