"""One split model's topology: its stages, the plan, and what the host says about them.

A load with ``--stage HOST:PORT`` (remote or separately started `stage serve` workers) and/or
``--local-stages N`` (stage workers this host starts for the model) gets a :class:`Topology`,
built by the host before any engine exists. Contract:

- ``assemble`` (the load's thread, before the engine): starts the local stages
  (``StageSupervisor`` on loopback, port 0, ``local_stage_threads(N)`` threads each, ``--mem``
  when given), waits until each is ready or failed; probes every stage with a plain-Python ggml
  RPC HELLO + GET_DEVICE_MEMORY (``stages/probe.py``; in parallel, ``PROBE_TIMEOUT_S`` each,
  connection closed before the engine connects: a stage serves one client at a time); plans the
  layers (``stages/plan.py``); returns what the engine's ``Load`` needs. It raises
  :class:`TopologyRefused` with the load's reason — ``stage_unavailable`` (a stage cannot be
  reached or failed to start), ``incompatible_abi_or_feature_set`` (its HELLO names another
  major version), ``resource_allocation_failure`` (the plan does not fit),
  ``invalid_configuration`` (more stages than layers, a local ``--mem`` beyond what the device
  has) — after saying so as events. A cancel of the load (``cancel``: the API's cancel, or its
  ``--timeout``, which runs from before the assembly) refuses it at its next check, within
  ``CANCEL_POLL_S`` while it waits for a local stage or the probes, with ``cancellation`` (the
  topology's ``topology_unavailable`` then has outcome ``cancelled``) or ``timeout``. No ggml
  client call ever runs in the host: ggml aborts the process whose endpoint goes away.
- Events (host producer, scope ``topology_id``, ``stage_id`` = ``stage-<hash of host:port>``,
  the same id `stage serve` reports, and ``stage_index``; never an address): local stages' own
  ``stage_starting``/``stage_ready``/``stage_stopping``/``stage_stopped``/``stage_failed``;
  ``topology_assembling`` once the plan fits (summaries ``stages``, ``layers``,
  ``model_size_bytes``, ``offered_bytes``, ``planned_bytes``), then one ``stage_loading`` per
  stage carrying its share (``layer_start``, ``layer_count``, ``planned_bytes``,
  ``offered_bytes``); ``stage_ready`` per stage when the engine's split load returned,
  ``topology_ready`` when its serving context exists. A failure: ``stage_unavailable`` for
  each stage at fault, then ``topology_unavailable`` with the reason. While the load is under
  way every event also carries the load's operation id.
- ``replan`` (``load --replan``): a listed stage that cannot be reached (``StageUnreachable``;
  an incompatible one still refuses the load) gets its ``stage_unavailable`` as above, then is
  left out: the plan is made over the stages that remain, and ``topology_assembling`` and the
  ``stage_loading`` events describe that plan (``stages`` counts the remaining ones). A stage's
  ``stage_index`` is always its position in the load's list (the ``--stage`` endpoints, then the
  local stages), so a left-out stage keeps its own and the remaining ones keep theirs. When no
  stage remains the load is refused with ``stage_unavailable`` as without ``replan``.
- ``engine_crashed`` (the engine's reader thread, after the engine died unasked): the
  connections are free again, so every stage is probed; each that does not answer (or a local
  stage whose worker ended) gets ``stage_unavailable``, and ``topology_unavailable`` follows
  with ``stage_unavailable`` — returned so requests and the crash are reported with it — or
  ``process_crash`` when every stage still answers.
- ``close`` (unload, a failed load, the model loaded again, host shutdown): stops the local
  stages (their ``stage_stopping``/``stage_stopped``) and ends the topology with
  ``topology_unavailable`` if it has not ended yet. Idempotent; returns once every local worker
  is reaped.

- Links (the engine's connection to each stage, ``engine/links.py``): ``engine_link`` keeps the
  latest figures per stage. ``engine_loaded`` (ok) emits, per stage, ``stage_ready`` then
  ``downstream_connection_established`` (ggml connected and the first round trips came back),
  both with the figures measured right after the load (summaries ``link_rtt_ms``,
  ``link_p95_ms``, ``link_jitter_ms``). When ``engine_crashed`` finds a stage gone it emits
  ``downstream_connection_lost`` for it before ``stage_unavailable``. The engine probes idle
  links too (each probe is a ggml call), so a remote stage dying while the engine is idle ends
  the engine within a probe interval and is attributed then. How the figures are reported
  (``stage_link_observed``) and judged against ``link_p95_threshold_ms`` (``stage_degraded``,
  ``topology_degraded``, with hysteresis) is ``runtime/topology_links.py``'s contract; the
  stage records and the local stage workers are ``runtime/topology_stages.py``'s.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.acquisition.artifacts import split_parts
from skippyctl.config.endpoints import Endpoint
from skippyctl.config.load_options import DEFAULT_STAGE_LINK_P95_MS
from skippyctl.engine.protocol_commands import StagePlan
from skippyctl.engine.protocol_messages import Link
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event, summaries
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.runtime.topology_links import LINK_REPORT_INTERVAL_S, TopologyLinks
from skippyctl.runtime.topology_stages import (
    LOCAL_HOST,
    LOCAL_STAGE_READY_TIMEOUT_S,
    LocalStage,
    TopologyStage,
    local_stage_threads,
)
from skippyctl.stages import plan as stage_plan
from skippyctl.stages import ports
from skippyctl.stages.probe import (
    PROBE_TIMEOUT_S,
    StageIncompatible,
    StageProbe,
    StageUnreachable,
    probe,
)
from skippyctl.stages.stage_supervisor import StageOptions

CANCEL_POLL_S: Final = 0.05
"""How often an assembly that waits (a local stage, the probes) looks for a cancel."""


class TopologyRefused(Exception):
    """The topology cannot serve the load; ``reason`` is the load's reason code."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Assembled:
    """What the engine's Load needs for a split load."""

    stages: tuple[StagePlan, ...]
    gpu_layers: int


def model_layers(path: Path) -> int:
    """``<arch>.block_count`` from the GGUF metadata (of the first part of a split set)."""
    from skippyctl.acquisition.gguf_metadata import read_metadata

    header = read_metadata(path)  # GgufMetadataError is a ValueError
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("the model has no general.architecture")
    count = header.get(f"{arch}.block_count")
    if not isinstance(count, int):
        raise ValueError("the model has no block_count")
    return count


def model_bytes(path: Path) -> int:
    parts = split_parts(path) or [path]
    return sum(part.stat().st_size for part in parts)


class Topology:
    """The stages of one split load (see the module docstring). Thread-safe."""

    def __init__(
        self,
        topology_id: LogicalId,
        model_id: LogicalId,
        operation_id: LogicalId,
        submit: Callable[[Event], object],
        endpoints: tuple[Endpoint, ...] = (),
        local_stages: int = 0,
        local_stage_mem_mib: int | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        *,
        replan: bool = False,
        lost_stages: set[LogicalId] | None = None,
        link_p95_threshold_ms: float = DEFAULT_STAGE_LINK_P95_MS,
        link_report_interval_s: float = LINK_REPORT_INTERVAL_S,
    ) -> None:
        self.topology_id = topology_id
        self.model_id = model_id
        self.operation_id = operation_id
        self._submit = submit
        self._endpoints = endpoints
        self._local_count = local_stages
        self._local_mem_mib = local_stage_mem_mib
        self._probe_timeout_s = probe_timeout_s
        self._replan = replan
        self._lost_stages = set() if lost_stages is None else lost_stages
        """Shared with the host across loads: stages an engine lost and no load reached since."""
        self._links = TopologyLinks(self._emit, link_p95_threshold_ms, link_report_interval_s)
        self._serving = False
        self._stages: list[TopologyStage] = []
        """The stages of the plan (all listed ones, less those ``replan`` left out)."""
        self._left_out: list[TopologyStage] = []
        self._lock = threading.Lock()
        self._loading = True
        self._ended = False
        self._closed = False
        self._cancelled = threading.Event()
        self.cancel_reason: ReasonCode | None = None
        """Why the load was cancelled (``cancel``): while assembling, the assembly is refused
        with it; after, the host hands it to the engine's load."""

    # -- events ---------------------------------------------------------------------------------
    def _stamp(self, event: Event, index: int | None) -> Event:
        """A local stage's own event, placed in this topology."""
        scope = dataclasses.replace(event.scope, topology_id=self.topology_id, stage_index=index)
        operation = self.operation_id if self._loading else event.operation_id
        return dataclasses.replace(event, scope=scope, operation_id=operation)

    def _emit(self, event_id: EventId, stage: TopologyStage | None = None, **fields: Any) -> None:
        if stage is not None:
            scope = Scope(
                topology_id=self.topology_id,
                stage_id=stage.stage_id,
                stage_index=stage.index,
            )
        else:
            scope = Scope(model_id=self.model_id, topology_id=self.topology_id)
        self._submit(
            make_event(
                event_id,
                operation_id=self.operation_id if self._loading else None,
                scope=scope,
                **fields,
            )
        )

    def _end(self, reason: ReasonCode | None, outcome: Outcome | None = Outcome.FAILURE) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._serving = False
        self._emit(EventId.TOPOLOGY_UNAVAILABLE, outcome=outcome, reason_code=reason)
        self._loading = False

    def _refuse(self, reason: ReasonCode, message: str) -> TopologyRefused:
        cancelled = reason is ReasonCode.CANCELLATION
        self._end(reason, Outcome.CANCELLED if cancelled else Outcome.FAILURE)
        return TopologyRefused(reason, message)

    # -- cancellation ---------------------------------------------------------------------------
    def cancel(self, reason: ReasonCode) -> None:
        """The load was cancelled (the API's cancel, ``--timeout``): an assembly under way is
        refused with ``reason`` at its next check — within ``CANCEL_POLL_S`` while it waits for
        a local stage or a probe — instead of running to its own timeouts."""
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
        self._cancelled.set()

    def _check_cancelled(self) -> None:
        reason = self.cancel_reason
        if reason is not None:
            what = "timed out" if reason is ReasonCode.TIMEOUT else "was cancelled"
            raise self._refuse(reason, f"the load {what} while its topology assembled")

    def _wait_or_cancel(self, done: threading.Event, timeout_s: float) -> None:
        """Wait for ``done`` up to ``timeout_s``; raise at once when the load is cancelled."""
        deadline = time.monotonic() + timeout_s
        while not done.is_set() and (left := deadline - time.monotonic()) > 0:
            if self._cancelled.wait(min(CANCEL_POLL_S, left)):
                break
        self._check_cancelled()

    # -- assembly -------------------------------------------------------------------------------
    def assemble(self, path: Path) -> Assembled:
        """Local stages started, every stage probed, the layers planned (module docstring)."""
        for index, endpoint in enumerate(self._endpoints):
            stage_id = ports.stage_id_for(endpoint.host, endpoint.port)
            self._stages.append(TopologyStage(endpoint, stage_id, index))
        self._check_cancelled()
        self._start_local_stages()
        probes = self._probe_all()
        self._check_cancelled()
        failed = [
            (s, p) for s, p in zip(self._stages, probes, strict=True) if isinstance(p, Exception)
        ]
        for stage, error in failed:
            reason = (
                ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                if isinstance(error, StageIncompatible)
                else ReasonCode.STAGE_UNAVAILABLE
            )
            self._emit(
                EventId.STAGE_UNAVAILABLE, stage, outcome=Outcome.FAILURE, reason_code=reason
            )
        replannable = not any(isinstance(e, StageIncompatible) for _, e in failed)
        if failed and self._replan and replannable and len(failed) < len(self._stages):
            # Plan onto the stages that remain (module docstring, ``replan``).
            lost = {id(s) for s, _ in failed}
            self._left_out = [s for s in self._stages if id(s) in lost]
            kept = [(s, p) for s, p in zip(self._stages, probes, strict=True) if id(s) not in lost]
            self._stages = [s for s, _ in kept]
            probes = [p for _, p in kept]
            failed = []
        if failed:
            incompatible = [e for _, e in failed if isinstance(e, StageIncompatible)]
            index, error = next(
                (s.index, e) for s, e in failed if not incompatible or e in incompatible
            )
            reason = (
                ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                if incompatible
                else ReasonCode.STAGE_UNAVAILABLE
            )
            raise self._refuse(reason, f"stage {index + 1}: {error}")
        offered = []
        for stage, found in zip(self._stages, probes, strict=True):
            assert isinstance(found, StageProbe)
            limit = stage.local.supervisor.memory_limit_bytes if stage.local else None
            offered.append(limit if limit is not None else found.free_bytes)
        try:
            n_layer = model_layers(path)
            size = model_bytes(path)
        except (OSError, ValueError) as error:
            raise self._refuse(
                ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE,
                f"cannot read the model's layer count ({type(error).__name__})",
            ) from error
        try:
            layer_plan = stage_plan.plan_layers(n_layer, size, offered)
        except stage_plan.PlanRefused as refused:
            raise self._refuse(ReasonCode.INVALID_CONFIGURATION, str(refused)) from refused
        for stage, share in zip(self._stages, layer_plan.shares, strict=True):
            stage.share = share
        self._emit(
            EventId.TOPOLOGY_ASSEMBLING,
            summaries=summaries(
                stages=len(self._stages),
                layers=n_layer,
                model_size_bytes=size,
                offered_bytes=sum(offered),
                planned_bytes=sum(s.needed_bytes for s in layer_plan.shares),
            ),
        )
        if not layer_plan.fits:
            short = [i + 1 for i, s in enumerate(layer_plan.shares) if not s.fits]
            first = layer_plan.shares[short[0] - 1]
            raise self._refuse(
                ReasonCode.RESOURCE_ALLOCATION_FAILURE,
                f"the plan does not fit: stage {short[0]} offers "
                f"{first.offered_bytes // 2**20} MiB, its share needs "
                f"{first.needed_bytes // 2**20} MiB (layers, +{stage_plan.WEIGHT_MARGIN:.0%}, "
                f"+{stage_plan.STAGE_RESERVE_BYTES // 2**20} MiB reserve)",
            )
        for stage in self._stages:
            planned = stage.share
            assert planned is not None
            self._emit(
                EventId.STAGE_LOADING,
                stage,
                summaries=summaries(
                    layer_start=planned.layer_start,
                    layer_count=planned.layer_count,
                    planned_bytes=planned.planned_bytes,
                    offered_bytes=planned.offered_bytes,
                ),
            )
        split = stage_plan.tensor_split(layer_plan)
        plans = tuple(
            StagePlan(str(stage.endpoint), weight)
            for stage, weight in zip(self._stages, split, strict=True)
        )
        return Assembled(plans, gpu_layers=n_layer + 1)

    def _start_local_stages(self) -> None:
        if self._local_count <= 0:
            return
        threads = local_stage_threads(self._local_count)
        started: list[LocalStage] = []
        for _ in range(self._local_count):
            index = len(self._stages)
            local = LocalStage(
                StageOptions(
                    host=LOCAL_HOST,
                    port=0,
                    threads=threads,
                    memory_limit_mib=self._local_mem_mib,
                ),
                self._local_emitter(index),
            )
            # The id is known once the port is reserved; a placeholder until then.
            placeholder = TopologyStage(Endpoint(LOCAL_HOST, 0), LogicalId("stage"), index, local)
            self._stages.append(placeholder)
            local.thread.start()
            started.append(local)
        for position, local in enumerate(started):
            stage = self._stages[len(self._stages) - len(started) + position]
            self._wait_or_cancel(local.settled, LOCAL_STAGE_READY_TIMEOUT_S)
            supervisor = local.supervisor
            if supervisor.stage_id is not None:
                stage.stage_id = supervisor.stage_id
                stage.endpoint = Endpoint(LOCAL_HOST, supervisor.port)
            if not local.ready.is_set():
                local.close()  # it ended (or never got ready): reap it, read how it ended
                if local.refused is not None:
                    raise self._refuse(
                        local.refused.reason, f"local stage: {local.refused.message}"
                    )
                outcome = local.outcome
                reason = ReasonCode.STAGE_UNAVAILABLE
                if outcome is not None and outcome.reason is ReasonCode.INVALID_CONFIGURATION:
                    reason = ReasonCode.INVALID_CONFIGURATION
                detail = outcome.message if outcome is not None else "it did not get ready"
                raise self._refuse(reason, f"local stage {position + 1}: {detail}")

    def _local_emitter(self, index: int) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            self._submit(self._stamp(event, index))

        return emit

    def _probe_one(self, stage: TopologyStage) -> StageProbe | Exception:
        try:
            return probe(stage.endpoint.host, stage.endpoint.port, self._probe_timeout_s)
        except (StageUnreachable, StageIncompatible) as error:
            return error

    def _probe_all(self) -> list[StageProbe | Exception]:
        """Every stage probed in parallel; a cancel stops the wait (each probe still ends
        within its timeout on its own thread, and closes its connection)."""
        pool = ThreadPoolExecutor(
            max_workers=max(1, len(self._stages)), thread_name_prefix="skippy-stage-probe"
        )
        try:
            futures = [pool.submit(self._probe_one, stage) for stage in self._stages]
            while wait(futures, timeout=CANCEL_POLL_S).not_done:
                self._check_cancelled()
            return [future.result() for future in futures]
        finally:
            pool.shutdown(wait=False)

    # -- the engine's reports (its reader thread) -----------------------------------------------
    def engine_loaded(self, ok: bool) -> None:
        if not ok:
            self._end(ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE)
            return
        for stage in self._stages:
            share = stage.share
            self._emit(
                EventId.STAGE_READY,
                stage,
                summaries=summaries(
                    layer_start=None if share is None else share.layer_start,
                    layer_count=None if share is None else share.layer_count,
                )
                + self._links.summaries(stage),
            )
            recovered = stage.stage_id in self._lost_stages
            self._lost_stages.discard(stage.stage_id)
            self._emit(
                EventId.DOWNSTREAM_CONNECTION_RECOVERED
                if recovered
                else EventId.DOWNSTREAM_CONNECTION_ESTABLISHED,
                stage,
                outcome=Outcome.SUCCESS,
                summaries=self._links.summaries(stage),
            )

    def engine_serving(self, ok: bool) -> None:
        if not ok:
            self._end(ReasonCode.BACKEND_INITIALIZATION_FAILURE)
            return
        self._emit(
            EventId.TOPOLOGY_READY,
            outcome=Outcome.SUCCESS,
            summaries=summaries(stages=len(self._stages)),
        )
        self._loading = False
        with self._lock:
            self._serving = not self._ended
            stages = list(self._stages) if self._serving else []
        for stage in stages:  # figures that arrived before the context existed
            self._links.judge(stage, self._stages)

    def links(self) -> tuple[Link | None, ...]:
        """The latest link figures of each stage, in stage order (for operators and tests)."""
        return tuple(stage.link for stage in self._stages)

    def engine_link(self, link: Link) -> None:
        """The engine's figures of its connection to stage ``link.stage`` (its reader thread):
        kept, and reported and judged (``runtime/topology_links.py``)."""
        if not 0 <= link.stage < len(self._stages):
            return
        stage = self._stages[link.stage]
        stage.link = link
        with self._lock:
            ended = self._ended
            serving = self._serving and not ended
        if ended:  # a late report of a topology that is gone: its stages are no longer live
            return
        self._links.observe(stage, self._stages, serving=serving)

    def engine_crashed(self) -> ReasonCode | None:
        """Which stages are gone now that the engine died (module docstring)."""
        probes = self._probe_all()
        lost = [
            stage
            for stage, found in zip(self._stages, probes, strict=True)
            if isinstance(found, Exception) or (stage.local is not None and stage.local.ended)
        ]
        with self._lock:
            self._serving = False
        for stage in lost:
            self._lost_stages.add(stage.stage_id)
            self._emit(
                EventId.DOWNSTREAM_CONNECTION_LOST,
                stage,
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.STAGE_UNAVAILABLE,
                summaries=self._links.summaries(stage),
            )
            self._emit(
                EventId.STAGE_UNAVAILABLE,
                stage,
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.STAGE_UNAVAILABLE,
            )
        reason = ReasonCode.STAGE_UNAVAILABLE if lost else ReasonCode.PROCESS_CRASH
        self._end(reason)
        return ReasonCode.STAGE_UNAVAILABLE if lost else None

    # -- the end --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the local stages; end the topology if it has not ended (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._loading = False
        for stage in [*self._stages, *self._left_out]:
            if stage.local is not None:
                stage.local.close()
        self._end(None, outcome=None)
