"""The stages of one split load's topology: the record the topology keeps per stage, and the
stage workers it starts on this host.

Contract:

- :class:`TopologyStage` is one listed stage (a ``--stage`` endpoint or a local stage): its
  endpoint, its ``stage_id`` (``stage-<hash of host:port>``, the id `stage serve` reports), its
  ``index`` (its position in the load's list, the ``stage_index`` of its events, kept when
  ``replan`` leaves other stages out), its share of the plan, and the engine's latest link
  figures with what ``runtime/topology_links.py`` decided about them. The topology
  (``runtime/topology.py``) owns the records; the link judgement updates their link fields.
- :class:`LocalStage` is a stage worker this host started for one topology: a
  ``StageSupervisor`` (``stages/stage_supervisor.py``) on its own thread, its events handed to
  the topology as they come. ``settled`` is set once it is ready or ended before it was;
  ``close`` stops it and returns once its worker is reaped (idempotent).
- Local stages listen on loopback (``LOCAL_HOST``, port 0) with ``local_stage_threads(N)``
  threads each; the topology waits at most ``LOCAL_STAGE_READY_TIMEOUT_S`` for each to settle.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from skippyctl.config.endpoints import Endpoint
from skippyctl.engine.protocol_messages import Link
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.stages import plan as stage_plan
from skippyctl.stages.stage_supervisor import (
    STARTUP_TIMEOUT_S,
    StageOptions,
    StageOutcome,
    StageRefused,
    StageSupervisor,
)

LOCAL_STAGE_READY_TIMEOUT_S: Final = STARTUP_TIMEOUT_S + 10.0
LOCAL_HOST: Final = "127.0.0.1"


def local_stage_threads(count: int, cpus: int | None = None) -> int:
    """Threads of each of ``count`` local stages: the CPUs shared by the stages and the engine
    (which keeps one share for what stays on its CPU), at least one."""
    return max(1, (cpus if cpus is not None else (os.cpu_count() or 1)) // (count + 1))


class LocalStage:
    """A stage worker this host started for one topology (its supervisor on a thread)."""

    def __init__(self, options: StageOptions, emit: Callable[[Event], None]) -> None:
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.settled = threading.Event()
        """Ready, or ended before it was ready."""
        self.outcome: StageOutcome | None = None
        self.refused: StageRefused | None = None
        self._emit = emit
        self.supervisor = StageSupervisor(options, self._on_event, python=sys.executable)
        self.thread = threading.Thread(target=self._run, name="skippy-stage", daemon=True)

    def _on_event(self, event: Event) -> None:
        self._emit(event)
        if event.id is EventId.STAGE_READY:
            self.ready.set()
        if event.id in (EventId.STAGE_READY, EventId.STAGE_FAILED, EventId.STAGE_STOPPED):
            self.settled.set()

    def _run(self) -> None:
        try:
            self.outcome = self.supervisor.run(self.stop)
        except StageRefused as refused:
            self.refused = refused
        finally:
            self.settled.set()

    @property
    def ended(self) -> bool:
        return not self.thread.is_alive() and self.settled.is_set()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


@dataclass(slots=True, eq=False)
class TopologyStage:
    """One stage of a topology (module docstring); mutable, owned by its topology."""

    endpoint: Endpoint
    stage_id: LogicalId
    index: int
    """Its position in the load's list: the ``stage_index`` of its events."""
    local: LocalStage | None = None
    share: stage_plan.StageShare | None = None
    link: Link | None = None
    """The engine's latest figures of its connection to this stage."""
    link_probes: int = 0
    """How many figures the engine sent for this link (the progress of ``stage_link_observed``)."""
    link_reported_s: float | None = None
    """When its figures were last reported (monotonic seconds)."""
    link_degraded: bool = False
