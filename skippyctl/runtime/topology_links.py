"""A split model's links: the engine's figures of its connection to each stage (``link``
messages, ``engine/links.py``), reported and judged against a threshold for its topology
(``runtime/topology.py``).

Contract:

- The topology keeps the latest figures per stage (:class:`TopologyStage` ``link``) and hands
  each report to :meth:`TopologyLinks.observe` unless the topology has ended (a late report of
  a topology that is gone: its stages are no longer live); its own events carry the figures
  through :meth:`TopologyLinks.summaries` (``link_rtt_ms``, ``link_p95_ms``,
  ``link_jitter_ms``).
- While the model serves, a stage whose link p95 goes above ``threshold_ms`` (the load's
  ``--stage-link-p95-ms``) gets ``stage_degraded`` (reason ``timeout``; summaries the figures
  and ``link_p95_threshold_ms``), and once it is back below ``LINK_RECOVERY_RATIO`` × the
  threshold (hysteresis) ``stage_ready`` with the figures. The first degraded stage makes the
  topology ``topology_degraded`` (reason ``timeout``), the last one to recover
  ``topology_ready`` again; the reducer projects that onto the model (degraded, still serving —
  also when the topology is degraded before the engine's context return is reduced, since the
  host cannot order its events after that authoritative item). Only those transitions change
  state; figures that arrived before the serving context are judged when it exists.
- The figures themselves are reported as ``stage_link_observed`` (progress class: the latest
  value per stage is kept, older undelivered ones coalesce; progress ``current`` counts the
  link's figures so far, unit ``items``; summaries the figures): a stage's first figures at
  once, then at most every ``report_interval_s`` (``LINK_REPORT_INTERVAL_S`` by default), which
  keeps the state document's, ``ps``'s and the Stages pane's figures live.

Called only on the engine's reader thread (through the topology), so the per-stage link fields
need no lock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, Protocol

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import NumericSummary, Progress, summaries
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from skippyctl.runtime.topology_stages import TopologyStage

LINK_RECOVERY_RATIO: Final = 0.8
"""A degraded link is ready again once its p95 is below this fraction of the threshold."""
LINK_REPORT_INTERVAL_S: Final = 5.0
"""A stage's link figures become a ``stage_link_observed`` at most this often (its first ones at
once): live enough for ``ps`` and the dashboard, while an idle runtime's one probe a second per
stage does not fill the event replay buffer and the dashboard's log with measurements."""


class TopologyEmit(Protocol):
    """The topology's emitter: an event of the topology, or of one of its stages."""

    def __call__(
        self, event_id: EventId, stage: TopologyStage | None = None, **fields: Any
    ) -> None: ...


class TopologyLinks:
    """One topology's link reports and judgement (module docstring)."""

    def __init__(self, emit: TopologyEmit, threshold_ms: float, report_interval_s: float) -> None:
        self._emit = emit
        self.threshold_ms = threshold_ms
        self._report_interval_s = report_interval_s

    @staticmethod
    def summaries(stage: TopologyStage) -> tuple[NumericSummary, ...]:
        """The stage's latest link figures as summaries (none before its first figures)."""
        link = stage.link
        if link is None:
            return ()
        return summaries(
            link_rtt_ms=link.rtt_ms, link_p95_ms=link.p95_ms, link_jitter_ms=link.jitter_ms
        )

    def observe(
        self, stage: TopologyStage, stages: Sequence[TopologyStage], *, serving: bool
    ) -> None:
        """``stage.link`` was just replaced by the engine's new figures: count and report them,
        and while the model serves judge them (``stages``: every stage of the plan)."""
        stage.link_probes += 1
        now = time.monotonic()
        last = stage.link_reported_s
        if last is None or now - last >= self._report_interval_s:
            stage.link_reported_s = now
            self._emit(
                EventId.STAGE_LINK_OBSERVED,
                stage,
                progress=Progress(stage.link_probes, None, ProgressUnit.ITEMS),
                summaries=self.summaries(stage),
            )
        if serving:
            self.judge(stage, stages)

    def judge(self, stage: TopologyStage, stages: Sequence[TopologyStage]) -> None:
        """The stage's latest figures against the threshold, with hysteresis; the topology's
        own state follows its first degraded and its last recovered stage."""
        link = stage.link
        if link is None:
            return
        threshold = self.threshold_ms
        if not stage.link_degraded and link.p95_ms > threshold:
            stage.link_degraded = True
            self._emit(
                EventId.STAGE_DEGRADED,
                stage,
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.TIMEOUT,
                summaries=self.summaries(stage) + summaries(link_p95_threshold_ms=threshold),
            )
            if _degraded(stages) == 1:  # the first slow link degrades the topology
                self._emit(
                    EventId.TOPOLOGY_DEGRADED,
                    outcome=Outcome.FAILURE,
                    reason_code=ReasonCode.TIMEOUT,
                    summaries=summaries(stages=len(stages), count=1),
                )
        elif stage.link_degraded and link.p95_ms < threshold * LINK_RECOVERY_RATIO:
            stage.link_degraded = False
            self._emit(
                EventId.STAGE_READY,
                stage,
                outcome=Outcome.SUCCESS,
                summaries=self.summaries(stage) + summaries(link_p95_threshold_ms=threshold),
            )
            if _degraded(stages) == 0:  # the last one recovered
                self._emit(
                    EventId.TOPOLOGY_READY,
                    outcome=Outcome.SUCCESS,
                    summaries=summaries(stages=len(stages)),
                )


def _degraded(stages: Sequence[TopologyStage]) -> int:
    return sum(stage.link_degraded for stage in stages)
