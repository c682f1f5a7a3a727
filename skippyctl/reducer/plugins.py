"""A model's serving plugins (``serving_plugin_*``): each plugin's state, failures, restarts and
delivery counters, kept in its model's view (``ModelView.plugins``, by plugin id).

The allowed moves are the rows of `PLUGIN_MOVES` (reducer.moves); the handlers look each event
up there and make the field updates. An event about a model the view does not know, or without
a plugin id, is rejected. `serving_plugin_observed` (progress) is no transition: it replaces the
counters of a plugin that is serving or disabled (the counts of a disabled plugin are its last
ones); for an unknown plugin it is rejected. A model loaded again starts with no plugins (its
view is made afresh), so each load counts afresh.

    serving plugin              from → to
    serving_plugin_loaded       absent | any other → serving
    serving_plugin_restarted    serving → same — restarts counted
    serving_plugin_failed       serving → same — failures counted
    serving_plugin_disabled     absent | any other → disabled
    serving_plugin_load_failed  absent | any other → load_failed
    serving_plugin_observed     any but load_failed → same — counters replaced
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, put, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.moves import ABSENT, SAME, Move, MoveTable, entering
from skippyctl.reducer.state import ModelView, PluginState, PluginView, RuntimeView

_E = EventId
_P = PluginState

PLUGIN_MOVES: Final[MoveTable[PluginState]] = MoveTable(
    "serving plugin",
    PluginState,
    (
        Move(entering(_P.SERVING), _E.SERVING_PLUGIN_LOADED, _P.SERVING),
        Move(frozenset({_P.SERVING}), _E.SERVING_PLUGIN_RESTARTED, SAME, note="restarts counted"),
        Move(frozenset({_P.SERVING}), _E.SERVING_PLUGIN_FAILED, SAME, note="failures counted"),
        Move(entering(_P.DISABLED), _E.SERVING_PLUGIN_DISABLED, _P.DISABLED),
        Move(entering(_P.LOAD_FAILED), _E.SERVING_PLUGIN_LOAD_FAILED, _P.LOAD_FAILED),
        Move(
            frozenset({_P.SERVING, _P.DISABLED}),
            _E.SERVING_PLUGIN_OBSERVED,
            SAME,
            note="counters replaced",
        ),
    ),
)
MOVE_TABLES: Final = (PLUGIN_MOVES,)

COUNTER_KEYS: Final[tuple[tuple[str, SummaryKey], ...]] = (
    ("delivered", SummaryKey.PLUGIN_DELIVERED),
    ("deferred", SummaryKey.PLUGIN_DEFERRED),
    ("dropped", SummaryKey.PLUGIN_DROPPED),
    ("late", SummaryKey.PLUGIN_LATE),
    ("failures", SummaryKey.PLUGIN_FAILURES),
    ("discarded_invalid_token_count", SummaryKey.PLUGIN_DISCARDED_INVALID_TOKEN_COUNT),
    ("discarded_invalid_token_id", SummaryKey.PLUGIN_DISCARDED_INVALID_TOKEN_ID),
    ("discarded_position_mismatch", SummaryKey.PLUGIN_DISCARDED_POSITION_MISMATCH),
    ("discarded_execution_failed", SummaryKey.PLUGIN_DISCARDED_EXECUTION_FAILED),
)
"""A ``PluginView`` counter and the ``serving_plugin_observed`` summary that carries it."""


def _store(state: RuntimeView, model: ModelView, plugin: PluginView) -> RuntimeView:
    others = tuple(p for p in model.plugins if p.plugin_id != plugin.plugin_id)
    plugins = tuple(sorted((*others, plugin), key=lambda p: p.plugin_id))
    return evolve(state, models=put(state.models, model.model_id, evolve(model, plugins=plugins)))


def on_plugin(state: RuntimeView, event: Event) -> Step:
    model_id, plugin_id = event.scope.model_id, event.scope.plugin_id
    model = None if model_id is None else state.models.get(model_id)
    if model is None or plugin_id is None:
        return reject(state)
    current = next((p for p in model.plugins if p.plugin_id == plugin_id), None)
    now = ABSENT if current is None else current.state
    row = PLUGIN_MOVES.find(event.id, now)
    if row is None:
        return reject(state, duplicate=PLUGIN_MOVES.repeats(event.id, now))
    view = current or PluginView(plugin_id=plugin_id, state=_P.SERVING)
    if event.id is _E.SERVING_PLUGIN_OBSERVED:
        counts = {name: event.summary_value(key) for name, key in COUNTER_KEYS}
        view = evolve(view, **{k: int(v) for k, v in counts.items() if v is not None})
    else:
        failures = event.summary_value(SummaryKey.COUNT)
        view = evolve(
            view,
            state=view.state if row.target is SAME else row.target,
            reason_code=event.reason_code or view.reason_code,
            failures=view.failures if failures is None else int(failures),
            restarts=view.restarts + (event.id is _E.SERVING_PLUGIN_RESTARTED),
        )
    return _store(state, model, view), NO_TRANSITIONS


HANDLERS: Final[dict[EventId, Handler]] = {event_id: on_plugin for event_id in PLUGIN_MOVES.events}
