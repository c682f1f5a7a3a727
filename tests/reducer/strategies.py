"""Hypothesis strategies shared by the reducer's property tests."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Progress, Scope, make_event, summaries
from skippyctl.events.reasons import ProgressUnit

ALL_IDS = list(EventId)


@st.composite
def any_event(draw: st.DrawFn, ids: Sequence[LogicalId]) -> Event:
    """Any event id, with every scope field and the operation id drawn from ``ids`` or none,
    an optional progress and a few summaries."""

    def maybe() -> LogicalId | None:
        return draw(st.one_of(st.none(), st.sampled_from(list(ids))))

    scope = Scope(
        model_id=maybe(),
        topology_id=maybe(),
        stage_id=maybe(),
        session_id=maybe(),
        request_id=maybe(),
        device_id=maybe(),
    )
    progress = draw(
        st.one_of(
            st.none(),
            st.builds(Progress, st.integers(0, 100), st.none(), st.just(ProgressUnit.STEPS)),
        )
    )
    values = draw(
        st.dictionaries(
            st.sampled_from(["context_tokens", "lanes", "count", "queue_depth"]), st.integers(0, 9)
        )
    )
    return make_event(
        draw(st.sampled_from(ALL_IDS)),
        operation_id=maybe(),
        scope=scope,
        progress=progress,
        summaries=summaries(**values),
    )
