"""Stages and topologies, projected onto backend-neutral model availability.

The allowed moves are the rows of `STAGE_MOVES` and `TOPOLOGY_MOVES` (reducer.moves); the
handlers look each event up there and make the field updates. A repeat of a stage's or
topology's state is a counted duplicate; a link event that does not change its flag is one too.
Besides its state, a stage keeps its share of the plan (``layer_start``, ``layer_count``,
``planned_bytes``, ``offered_bytes``: the summaries of its ``stage_loading``; cleared when the
stage shows up in another topology) and its last reason; a topology keeps its plan (``stages``,
``layers``, ``planned_bytes``, ``offered_bytes`` of ``topology_assembling``) and its last reason.
A topology's new state is then projected onto the models it serves by
models.on_topology_changed (the `topology_*` rows of models.MOVES). An accepted stage or link
event that carries link figures (summaries `link_rtt_ms`, `link_p95_ms`, `link_jitter_ms`)
replaces the stage's figures with them; one without keeps the figures it had.

`stage_link_observed` (progress: the count of probes of that link) is no transition: it replaces
the figures of a stage that is known and not gone (stopped or failed) and keeps its probe count
(forgotten when the stage shows up in another topology: each load counts afresh); a count not
above the one kept is a counted duplicate, an unknown or gone stage a rejected one. That is what
makes the figures in the state document, `ps` and the Stages pane live between link transitions.

    stage                            from → to
    stage_starting                   absent | any other → starting
    stage_loading                    absent | any other → loading
    stage_ready                      absent | any other → ready
    stage_degraded                   absent | any other → degraded
    stage_unavailable                absent | any other → unavailable
    stage_stopping                   absent | any other → stopping
    stage_stopped                    absent | any other → stopped
    stage_failed                     absent | any other → failed
    upstream_connection_lost         ready → degraded — link flag cleared
      downstream_connection_lost
    upstream_connection_lost         any but ready → same — link flag cleared
      downstream_connection_lost
    upstream_connection_established  degraded → ready — link flag set; once both links are up
      upstream_connection_recovered
      downstream_connection_established
      downstream_connection_recovered
    upstream_connection_established  any but degraded → same — link flag set
      upstream_connection_recovered
      downstream_connection_established
      downstream_connection_recovered

    topology              from → to
    topology_assembling   absent | any other → assembling
    topology_ready        absent | any other → ready
    topology_degraded     absent | any other → degraded
    topology_unavailable  absent | any other → unavailable
"""

from __future__ import annotations

from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.reducer.common import NO_TRANSITIONS, Handler, Step, bounded_put, count, reject
from skippyctl.reducer.immutable import evolve
from skippyctl.reducer.models import on_topology_changed
from skippyctl.reducer.moves import ABSENT, SAME, Effect, Move, MoveTable, all_but, entering, moves
from skippyctl.reducer.state import (
    MAX_STAGES,
    MAX_TOPOLOGIES,
    RuntimeView,
    StageState,
    StageView,
    TopologyState,
    TopologyView,
)

_E = EventId
_S = StageState
_T = TopologyState
_LOST: Final = (_E.UPSTREAM_CONNECTION_LOST, _E.DOWNSTREAM_CONNECTION_LOST)
_UP: Final = (
    _E.UPSTREAM_CONNECTION_ESTABLISHED,
    _E.UPSTREAM_CONNECTION_RECOVERED,
    _E.DOWNSTREAM_CONNECTION_ESTABLISHED,
    _E.DOWNSTREAM_CONNECTION_RECOVERED,
)


STAGE_MOVES: Final[MoveTable[StageState]] = MoveTable(
    "stage",
    StageState,
    (
        Move(entering(_S.STARTING), _E.STAGE_STARTING, _S.STARTING),
        Move(entering(_S.LOADING), _E.STAGE_LOADING, _S.LOADING),
        Move(entering(_S.READY), _E.STAGE_READY, _S.READY),
        Move(entering(_S.DEGRADED), _E.STAGE_DEGRADED, _S.DEGRADED),
        Move(entering(_S.UNAVAILABLE), _E.STAGE_UNAVAILABLE, _S.UNAVAILABLE),
        Move(entering(_S.STOPPING), _E.STAGE_STOPPING, _S.STOPPING),
        Move(entering(_S.STOPPED), _E.STAGE_STOPPED, _S.STOPPED),
        Move(entering(_S.FAILED), _E.STAGE_FAILED, _S.FAILED),
        *moves({_S.READY}, _LOST, _S.DEGRADED, note="link flag cleared"),
        *moves(all_but(_S.READY), _LOST, SAME, note="link flag cleared"),
        *moves({_S.DEGRADED}, _UP, _S.READY, note="link flag set; once both links are up"),
        *moves(all_but(_S.DEGRADED), _UP, SAME, note="link flag set"),
    ),
)


TOPOLOGY_MOVES: Final[MoveTable[TopologyState]] = MoveTable(
    "topology",
    TopologyState,
    (
        Move(entering(_T.ASSEMBLING), _E.TOPOLOGY_ASSEMBLING, _T.ASSEMBLING),
        Move(entering(_T.READY), _E.TOPOLOGY_READY, _T.READY),
        Move(entering(_T.DEGRADED), _E.TOPOLOGY_DEGRADED, _T.DEGRADED),
        Move(entering(_T.UNAVAILABLE), _E.TOPOLOGY_UNAVAILABLE, _T.UNAVAILABLE),
    ),
)
MOVE_TABLES: Final = (STAGE_MOVES, TOPOLOGY_MOVES)

_GONE: Final = frozenset({StageState.STOPPED, StageState.FAILED})

# Which link flag a link event sets, and to what.
_LINKS: Final[dict[EventId, tuple[str, bool]]] = {
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: ("upstream_connected", True),
    EventId.UPSTREAM_CONNECTION_RECOVERED: ("upstream_connected", True),
    EventId.UPSTREAM_CONNECTION_LOST: ("upstream_connected", False),
    EventId.DOWNSTREAM_CONNECTION_ESTABLISHED: ("downstream_connected", True),
    EventId.DOWNSTREAM_CONNECTION_RECOVERED: ("downstream_connected", True),
    EventId.DOWNSTREAM_CONNECTION_LOST: ("downstream_connected", False),
}


_SHARE_KEYS: Final = (
    ("layer_start", SummaryKey.LAYER_START),
    ("layer_count", SummaryKey.LAYER_COUNT),
    ("planned_bytes", SummaryKey.PLANNED_BYTES),
    ("offered_bytes", SummaryKey.OFFERED_BYTES),
)
"""A stage's share of the plan: its ``stage_loading`` summaries (``stage_ready`` restates the
layers); a summary an event does not carry keeps the value known."""


def _share(event: Event, view: StageView) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for field_name, key in _SHARE_KEYS:
        value = event.summary_value(key)
        out[field_name] = getattr(view, field_name) if value is None else int(value)
    return out


def _with_link(view: StageView, event: Event) -> StageView:
    """The link figures the event carries, if any (all three replace the old ones together)."""
    rtt = event.summary_value(SummaryKey.LINK_RTT_MS)
    if rtt is None:
        return view
    p95 = event.summary_value(SummaryKey.LINK_P95_MS)
    jitter = event.summary_value(SummaryKey.LINK_JITTER_MS)
    return evolve(
        view,
        link_rtt_ms=float(rtt),
        link_p95_ms=None if p95 is None else float(p95),
        link_jitter_ms=None if jitter is None else float(jitter),
    )


def _store_stage(state: RuntimeView, view: StageView) -> RuntimeView | None:
    placed = bounded_put(
        state.stages,
        view.stage_id,
        view,
        MAX_STAGES,
        lambda s: s.state in _GONE,
        lambda s: s.updated_mono_ns,
    )
    if placed is None:
        return None
    stages, evicted = placed
    return count(evolve(state, stages=stages), evicted_stages=evicted)


def on_stage(state: RuntimeView, event: Event) -> Step:
    stage_id = event.scope.stage_id
    if stage_id is None:
        return reject(state)
    current = state.stages.get(stage_id)
    now = ABSENT if current is None else current.state
    row = STAGE_MOVES.find(event.id, now)
    if row is None or isinstance(row.target, Effect):
        return reject(state, duplicate=STAGE_MOVES.repeats(event.id, now))
    target = row.target
    view = current or StageView(stage_id=stage_id, state=target)
    topology_id = event.scope.topology_id
    if topology_id is not None and view.topology_id not in (None, topology_id):
        # The same stage in another topology (a reload): the old plan's share is not its own.
        view = evolve(
            view,
            layer_start=None,
            layer_count=None,
            planned_bytes=None,
            offered_bytes=None,
            link_probes=None,
        )
    view = evolve(
        view,
        state=target,
        topology_id=topology_id or view.topology_id,
        stage_index=event.scope.stage_index
        if event.scope.stage_index is not None
        else view.stage_index,
        reason_code=event.reason_code,
        updated_mono_ns=event.mono_ns,
        **_share(event, view),
    )
    stored = _store_stage(state, _with_link(view, event))
    return reject(state) if stored is None else (stored, NO_TRANSITIONS)


def on_link(state: RuntimeView, event: Event) -> Step:
    stage_id = event.scope.stage_id
    view = None if stage_id is None else state.stages.get(stage_id)
    if view is None:
        return reject(state)
    row = STAGE_MOVES.find(event.id, view.state)
    if row is None:
        return reject(state)
    flag, connected = _LINKS[event.id]
    if getattr(view, flag) is connected:
        return reject(state, duplicate=True)
    if flag == "upstream_connected":
        updated = evolve(view, upstream_connected=connected)
    else:
        updated = evolve(view, downstream_connected=connected)
    updated = _with_link(evolve(updated, updated_mono_ns=event.mono_ns), event)
    # A lost link degrades at once; a restored one only once both links are up.
    both_up = False not in (updated.upstream_connected, updated.downstream_connected)
    if isinstance(row.target, StageState) and (not connected or both_up):
        updated = evolve(updated, state=row.target)
    stored = _store_stage(state, updated)
    return reject(state) if stored is None else (stored, NO_TRANSITIONS)


def on_link_observed(state: RuntimeView, event: Event) -> Step:
    stage_id = event.scope.stage_id
    view = None if stage_id is None else state.stages.get(stage_id)
    if view is None or view.state in _GONE or event.progress is None:
        return reject(state)
    if view.link_probes is not None and event.progress.current <= view.link_probes:
        return reject(state, duplicate=True)
    updated = _with_link(evolve(view, link_probes=event.progress.current), event)
    stored = _store_stage(state, updated)
    return reject(state) if stored is None else (stored, NO_TRANSITIONS)


_PLAN_KEYS: Final = (
    ("stages", SummaryKey.STAGES),
    ("layers", SummaryKey.LAYERS),
    ("planned_bytes", SummaryKey.PLANNED_BYTES),
    ("offered_bytes", SummaryKey.OFFERED_BYTES),
)
"""A topology's plan: its ``topology_assembling`` summaries."""


def on_topology(state: RuntimeView, event: Event) -> Step:
    topology_id = event.scope.topology_id
    if topology_id is None:
        return reject(state)
    current = state.topologies.get(topology_id)
    now = ABSENT if current is None else current.state
    row = TOPOLOGY_MOVES.find(event.id, now)
    if row is None or isinstance(row.target, Effect):
        return reject(state, duplicate=TOPOLOGY_MOVES.repeats(event.id, now))
    target = row.target
    view = current or TopologyView(topology_id=topology_id, state=target)
    plan: dict[str, int | None] = {}
    if event.id is EventId.TOPOLOGY_ASSEMBLING:  # a new plan: what an older one said is gone
        for field_name, key in _PLAN_KEYS:
            value = event.summary_value(key)
            plan[field_name] = None if value is None else int(value)
    view = evolve(
        view,
        state=target,
        model_id=event.scope.model_id or view.model_id,
        reason_code=event.reason_code,
        updated_mono_ns=event.mono_ns,
        **plan,
    )
    placed = bounded_put(
        state.topologies,
        topology_id,
        view,
        MAX_TOPOLOGIES,
        lambda t: t.state is TopologyState.UNAVAILABLE,
        lambda t: t.updated_mono_ns,
    )
    if placed is None:
        return reject(state)
    topologies, _ = placed
    return on_topology_changed(evolve(state, topologies=topologies), event, topology_id)


HANDLERS: Final[dict[EventId, Handler]] = {
    **{event_id: on_link if event_id in _LINKS else on_stage for event_id in STAGE_MOVES.events},
    **{event_id: on_topology for event_id in TOPOLOGY_MOVES.events},
    EventId.STAGE_LINK_OBSERVED: on_link_observed,
}
