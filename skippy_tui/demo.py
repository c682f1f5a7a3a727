"""Deterministic event scenarios for demos, screenshots and tests.

Every event carries a fixed wall and monotonic time (`T0_NS` plus an offset), so a dashboard fed
one of these renders the same on every machine. Each scenario is a list of events in stream order,
including the reducer transitions (`model_available`, `node_*`) a runtime's `--json` stream
carries; the dashboard logs those but derives state with its own reducer.

Scenarios: `loading` (a model reading its weights), `available`, `failed` (a second model whose
load failed), `sessions` (sessions and requests in every state), `pressure` (drops and lag under
load), `topology` (a model split over three stages, one link lost), `flood(n)` (many events).
`script(events, delay_s)` turns a scenario into a `ScriptedSource` script; `demo_script()` is a
paced tour of all of them for `python -m skippy_tui --demo`.

For the fleet dashboard, `fleet()` is three runtimes' items (`FLEET_NODES`: one serving, one
restarted and serving sessions, one unreachable) and `fleet_script(pace_s)` their script for
`python -m skippy_tui --demo --fleet`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from skippy_tui.fleet_source import FleetSourceItem, NodeDown, NodeGap, NodeItem, NodeUp
from skippy_tui.sources import DecodeSkipped, SourceItem
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    NumericSummary,
    Progress,
    Scope,
    StateChange,
    make_event,
    summaries,
)
from skippyctl.events.reasons import Outcome, Producer, ProgressUnit, ReasonCode
from skippyctl.output.codec import SkipReason

T0_NS: Final = 1_768_467_600_000_000_000  # 2026-01-15T09:00:00Z
MONO0_NS: Final = 5_000_000_000
MS: Final = 1_000_000

TINY: Final = LogicalId("tiny")
BROKEN: Final = LogicalId("broken")
BIG: Final = LogicalId("big-split")
CPU: Final = LogicalId("CPU")
GIB: Final = 1024**3


class Clock:
    """Hands out fixed timestamps: `stamp(ms)` at `ms` after T0, `stamp()` a step after the last."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self.now_ms = start_ms

    def stamp(self, ms: float | None = None, step_ms: float = 1.0) -> tuple[int, int]:
        self.now_ms = ms if ms is not None else self.now_ms + step_ms
        offset = round(self.now_ms * 1000) * 1000  # whole microseconds, as records carry
        return T0_NS + offset, MONO0_NS + offset


def ev(
    clock: Clock,
    event_id: EventId,
    *,
    at_ms: float | None = None,
    step_ms: float = 1.0,
    producer: Producer = Producer.RUNTIME,
    op: str | None = None,
    model: LogicalId | None = None,
    session: str | None = None,
    request: str | None = None,
    device: LogicalId | None = None,
    topology: str | None = None,
    stage: str | None = None,
    stage_index: int | None = None,
    state: tuple[str | None, str] | None = None,
    progress: tuple[int, int | None, ProgressUnit] | None = None,
    outcome: Outcome | None = None,
    reason: ReasonCode | None = None,
    duration_ms: float | None = None,
    numbers: tuple[NumericSummary, ...] = (),
) -> Event:
    """One event stamped by `clock` (a terse `make_event` for scenarios)."""
    wall_ns, mono_ns = clock.stamp(at_ms, step_ms)
    return make_event(
        event_id,
        producer,
        operation_id=LogicalId(op) if op is not None else None,
        scope=Scope(
            model_id=model,
            topology_id=LogicalId(topology) if topology is not None else None,
            stage_id=LogicalId(stage) if stage is not None else None,
            stage_index=stage_index,
            session_id=LogicalId(session) if session is not None else None,
            request_id=LogicalId(request) if request is not None else None,
            device_id=device,
        ),
        state=StateChange(previous=state[0], current=state[1]) if state is not None else None,
        progress=Progress(*progress) if progress is not None else None,
        outcome=outcome,
        reason_code=reason,
        duration_ms=duration_ms,
        summaries=numbers,
        wall_ns=wall_ns,
        mono_ns=mono_ns,
    )


def startup(clock: Clock) -> list[Event]:
    return [
        ev(
            clock,
            EventId.NATIVE_LIBRARY_LOADED,
            at_ms=0,
            numbers=summaries(abi_version=1, feature_bits=16777216),
        ),
        ev(clock, EventId.RUNTIME_INITIALIZED, outcome=Outcome.SUCCESS),
        ev(clock, EventId.NODE_UNAVAILABLE, state=("starting", "unavailable")),
    ]


def loading_events(
    clock: Clock, model: LogicalId = TINY, op: str = "load-1", upto: int = 639
) -> list[Event]:
    """A load up to `upto`/1000 of its weights (no terminal yet)."""
    events = [
        ev(clock, EventId.MODEL_LOAD_REQUESTED, op=op, model=model, numbers=summaries(lanes=4)),
        ev(clock, EventId.NODE_STARTING, state=("unavailable", "starting")),
        ev(clock, EventId.ENGINE_PROCESS_STARTED, model=model, step_ms=480),
        ev(clock, EventId.MODEL_LOAD_STARTED, producer=Producer.NATIVE, op=op, model=model),
        ev(
            clock,
            EventId.BACKEND_DEVICE_SELECTED,
            producer=Producer.NATIVE,
            op=op,
            model=model,
            device=CPU,
            numbers=summaries(
                memory_free_bytes=int(23.5 * GIB), memory_total_bytes=int(31.2 * GIB)
            ),
        ),
    ]
    for current in (0, 160, 319, 480, 639, 800, 1000):
        if current > upto:
            break
        events.append(
            ev(
                clock,
                EventId.MODEL_LOAD_PROGRESS,
                producer=Producer.NATIVE,
                op=op,
                model=model,
                progress=(current, 1000, ProgressUnit.STEPS),
                step_ms=40,
            )
        )
    return events


def completion_events(clock: Clock, model: LogicalId = TINY, op: str = "load-1") -> list[Event]:
    """From weights loaded to available (with the runtime's own transitions)."""
    return [
        ev(
            clock,
            EventId.NATIVE_MODEL_LOAD_COMPLETED,
            producer=Producer.NATIVE,
            op=op,
            model=model,
            outcome=Outcome.SUCCESS,
            duration_ms=212.0,
            numbers=summaries(model_size_bytes=410880, parameters=205120),
        ),
        ev(
            clock,
            EventId.NATIVE_MODEL_LOADED,
            op=op,
            model=model,
            device=CPU,
            state=("loading", "initializing"),
        ),
        ev(clock, EventId.SERVING_BACKEND_INITIALIZATION_STARTED, op=op, model=model),
        ev(
            clock,
            EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
            op=op,
            model=model,
            outcome=Outcome.SUCCESS,
            numbers=summaries(context_tokens=4096, lanes=4),
            step_ms=30,
        ),
        ev(
            clock,
            EventId.MODEL_AVAILABLE,
            op=op,
            model=model,
            device=CPU,
            outcome=Outcome.SUCCESS,
            state=("initializing", "available"),
            duration_ms=812.0,
            numbers=summaries(context_tokens=4096, lanes=4),
        ),
        ev(clock, EventId.NODE_ACCEPTING_REQUESTS, state=("starting", "accepting")),
        ev(
            clock,
            EventId.KV_CACHE_INITIALIZATION_COMPLETED,
            producer=Producer.NATIVE,
            model=model,
            numbers=summaries(kv_cells_total=4096),
        ),
    ]


def loading() -> list[Event]:
    clock = Clock()
    return startup(clock) + loading_events(clock)


def available() -> list[Event]:
    clock = Clock()
    return startup(clock) + loading_events(clock, upto=1000) + completion_events(clock)


def failed() -> list[Event]:
    """`tiny` available, then `broken` fails to load (llama.cpp cannot read the file)."""
    events = available()
    clock = _continue(events)
    events += [
        ev(clock, EventId.MODEL_LOAD_REQUESTED, op="load-2", model=BROKEN, step_ms=500),
        ev(clock, EventId.ENGINE_PROCESS_STARTED, model=BROKEN, step_ms=450),
        ev(clock, EventId.MODEL_LOAD_STARTED, producer=Producer.NATIVE, op="load-2", model=BROKEN),
        ev(
            clock,
            EventId.MODEL_LOAD_FAILED,
            producer=Producer.RECONCILED,
            op="load-2",
            model=BROKEN,
            outcome=Outcome.FAILURE,
            reason=ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE,
            duration_ms=3.2,
        ),
    ]
    return events


def _request(
    clock: Clock, request: str, session: str, stage: str, prompt: int, generated: int
) -> list[Event]:
    """A request on `session` that got as far as `stage` (queued, prefill or decode)."""
    events = [ev(clock, EventId.REQUEST_RECEIVED, model=TINY, session=session, request=request)]
    if stage == "queued":
        events.append(
            ev(
                clock,
                EventId.REQUEST_QUEUED,
                model=TINY,
                session=session,
                request=request,
                numbers=summaries(queue_depth=2),
            )
        )
        return events
    events += [
        ev(
            clock,
            EventId.REQUEST_ADMITTED,
            model=TINY,
            session=session,
            request=request,
            numbers=summaries(queue_wait_ms=14.5),
        ),
        ev(clock, EventId.SESSION_ACTIVE, model=TINY, session=session),
        ev(
            clock,
            EventId.PREFILL_STARTED,
            model=TINY,
            session=session,
            request=request,
            numbers=summaries(prompt_tokens=prompt),
        ),
    ]
    if stage == "prefill":
        return events
    events += [
        ev(
            clock,
            EventId.FIRST_TOKEN_PRODUCED,
            model=TINY,
            session=session,
            request=request,
            numbers=summaries(time_to_first_token_ms=182.0),
            step_ms=180,
        ),
        ev(
            clock,
            EventId.GENERATION_PROGRESS,
            model=TINY,
            session=session,
            request=request,
            progress=(generated, None, ProgressUnit.TOKENS),
            step_ms=400,
        ),
    ]
    return events


def _continue(events: list[Event]) -> Clock:
    return Clock((events[-1].wall_ns - T0_NS) / MS)


def sessions() -> list[Event]:
    """Four sessions on four lanes: two decoding, one in prefill, one idle; two requests queued."""
    events = available()
    clock = _continue(events)
    for lane, session in enumerate(("s-alpha", "s-bravo", "s-charlie", "s-delta")):
        events.append(
            ev(
                clock,
                EventId.SESSION_CREATED,
                model=TINY,
                session=session,
                numbers=summaries(lanes=lane, context_tokens=1024),
                step_ms=100,
            )
        )
    # A finished request gives the model a decode rate.
    events += _request(clock, "req-0001", "s-delta", "decode", 96, 64)
    events += [
        ev(
            clock,
            EventId.GENERATION_COMPLETED,
            model=TINY,
            session="s-delta",
            request="req-0001",
            outcome=Outcome.SUCCESS,
            numbers=summaries(generated_tokens=128, decode_tokens_per_s=41.7),
        ),
        ev(
            clock,
            EventId.REQUEST_COMPLETED,
            model=TINY,
            session="s-delta",
            request="req-0001",
            outcome=Outcome.SUCCESS,
            duration_ms=3260.0,
        ),
        ev(clock, EventId.SESSION_IDLE, model=TINY, session="s-delta"),
    ]
    events += _request(clock, "req-0002", "s-alpha", "decode", 512, 87)
    events += _request(clock, "req-0003", "s-bravo", "decode", 1310, 12)
    events += _request(clock, "req-0004", "s-charlie", "prefill", 2048, 0)
    events += _request(clock, "req-0005", "s-alpha", "queued", 0, 0)
    events += _request(clock, "req-0006", "s-delta", "queued", 0, 0)
    return events


def pressure() -> list[Event]:
    """Twenty busy seconds: drops from second 8 on, coalescing, sampling, a lagging subscriber."""
    events = available()
    clock = _continue(events)
    start_ms = (clock.now_ms // 1000 + 1) * 1000
    for second in range(20):
        burst = 40 + (second * 37) % 90
        for index in range(burst):
            events.append(
                ev(
                    clock,
                    EventId.CACHE_LOOKUP_HIT,
                    model=TINY,
                    at_ms=start_ms + second * 1000 + index * 900 / burst,
                )
            )
        if second >= 8:
            events.append(
                ev(
                    clock,
                    EventId.EVENTS_DROPPED_BY_CLASS,
                    at_ms=start_ms + second * 1000 + 950,
                    numbers=summaries(
                        dropped_progress=30 + second * 4, dropped_diagnostic=12 + second
                    ),
                )
            )
            events.append(
                ev(
                    clock,
                    EventId.EVENTS_COALESCED,
                    numbers=summaries(coalesced=200 + second * 10),
                    step_ms=1,
                )
            )
    events += [
        ev(
            clock,
            EventId.INGRESS_QUEUE_PRESSURE,
            numbers=summaries(queue_depth=3900, queue_capacity=4096),
        ),
        ev(clock, EventId.EVENTS_SAMPLED, numbers=summaries(sampled=418)),
        ev(clock, EventId.SUBSCRIBER_LAGGING, numbers=summaries(count=1)),
        ev(clock, EventId.SUBSCRIBER_DISCONNECTED, numbers=summaries(count=1)),
        ev(clock, EventId.UNKNOWN_NATIVE_EVENT_RECEIVED, numbers=summaries(count=3)),
        ev(clock, EventId.REDUCER_ERROR, numbers=summaries(rejected=2)),
        ev(
            clock,
            EventId.CACHE_PRESSURE_CROSSED,
            producer=Producer.NATIVE,
            model=TINY,
            numbers=summaries(kv_cells_used=3900),
        ),
    ]
    return events


def topology() -> list[Event]:
    """`big-split` served by topology `pipe-a` over three stages; stage 1's downstream link lost."""
    clock = Clock()
    events = startup(clock)
    op = "load-9"
    events += [
        ev(clock, EventId.MODEL_LOAD_REQUESTED, op=op, model=BIG, topology="pipe-a", step_ms=10),
        ev(clock, EventId.TOPOLOGY_ASSEMBLING, model=BIG, topology="pipe-a"),
    ]
    for index, stage in enumerate(("stage-0", "stage-1", "stage-2")):
        for event_id in (EventId.STAGE_STARTING, EventId.STAGE_LOADING, EventId.STAGE_READY):
            events.append(
                ev(clock, event_id, topology="pipe-a", stage=stage, stage_index=index, step_ms=60)
            )
        if index > 0:
            events.append(
                ev(clock, EventId.UPSTREAM_CONNECTION_ESTABLISHED, topology="pipe-a", stage=stage)
            )
        if index < 2:
            events.append(
                ev(clock, EventId.DOWNSTREAM_CONNECTION_ESTABLISHED, topology="pipe-a", stage=stage)
            )
    events.append(ev(clock, EventId.TOPOLOGY_READY, model=BIG, topology="pipe-a"))
    loading = loading_events(clock, model=BIG, op=op, upto=1000)
    events += [e for e in loading if e.id is not EventId.MODEL_LOAD_REQUESTED]
    events += completion_events(clock, model=BIG, op=op)
    events += [
        ev(
            clock,
            EventId.DOWNSTREAM_CONNECTION_LOST,
            topology="pipe-a",
            stage="stage-1",
            reason=ReasonCode.STAGE_UNAVAILABLE,
            step_ms=2000,
        ),
        ev(
            clock,
            EventId.TOPOLOGY_DEGRADED,
            model=BIG,
            topology="pipe-a",
            reason=ReasonCode.STAGE_UNAVAILABLE,
        ),
    ]
    return events


def flood(count: int, model: LogicalId = TINY) -> list[Event]:
    """`count` events over ten seconds after `available()`: request lifecycles (received →
    completed, six events each), cache lookups, and a drop report every 500 events."""
    events = available()
    clock = _continue(events)
    step_ms = 10_000 / max(count, 1)
    lifecycle = (
        EventId.REQUEST_RECEIVED,
        EventId.REQUEST_ADMITTED,
        EventId.PREFILL_STARTED,
        EventId.FIRST_TOKEN_PRODUCED,
        EventId.CACHE_LOOKUP_HIT,
        EventId.REQUEST_COMPLETED,
    )
    for index in range(count):
        if index % 500 == 499:
            events.append(
                ev(
                    clock,
                    EventId.EVENTS_DROPPED_BY_CLASS,
                    step_ms=step_ms,
                    numbers=summaries(dropped_progress=25, dropped_diagnostic=5),
                )
            )
            continue
        request = f"flood-{index // len(lifecycle)}"
        events.append(
            ev(
                clock,
                lifecycle[index % len(lifecycle)],
                model=model,
                request=request,
                step_ms=step_ms,
            )
        )
    return events


def script(events: Iterable[Event], delay_s: float = 0.0) -> list[tuple[float, SourceItem]]:
    """A `ScriptedSource` script delivering `events` with `delay_s` before each."""
    return [(delay_s, event) for event in events]


def demo_script(pace_s: float = 0.15) -> list[tuple[float, SourceItem]]:
    """A paced tour: a model loads and serves sessions, another fails, events come under
    pressure, a split model degrades. Scenario prefixes shared by several are played once."""
    items: list[tuple[float, SourceItem]] = []
    seen: set[tuple[int, str, str | None]] = set()

    def add(events: Sequence[Event], delay_s: float) -> None:
        for event in events:
            key = (event.wall_ns, event.id.value, event.scope.model_id)
            if key not in seen:
                seen.add(key)
                items.append((delay_s, event))

    add(failed(), pace_s)
    add(sessions(), pace_s)
    add(pressure(), 0.0)
    add(topology(), pace_s)
    return items


FLEET_NODES: Final = ("local", "gpu1", "gpu2")
FLEET_VERSION: Final = "0.1.0"


def fleet() -> list[FleetSourceItem]:
    """Three runtimes. `local` serves `tiny` (its stream once resumed past what it retained: a
    replay gap; and one record of it could not be decoded); `gpu1` was loading when its runtime
    restarted, and the new instance serves sessions; `gpu2` cannot be reached."""
    local, gpu1, gpu2 = FLEET_NODES
    items: list[FleetSourceItem] = [NodeUp(local, "rt-local", FLEET_VERSION)]
    items += [NodeItem(local, event) for event in available()]
    items.append(NodeGap(local, "evicted"))
    items.append(NodeItem(local, DecodeSkipped(SkipReason.UNKNOWN_EVENT)))
    items.append(NodeUp(gpu1, "rt-gpu1-a", FLEET_VERSION))
    items += [NodeItem(gpu1, event) for event in loading()]
    items.append(NodeDown(gpu1, "node_stream_closed", "gpu1 closed its event stream", 1, 0.25))
    items.append(NodeUp(gpu1, "rt-gpu1-b", FLEET_VERSION, restarted=True))
    items += [NodeItem(gpu1, event) for event in sessions()]
    items += [
        NodeDown(gpu2, "node_unreachable", "connection refused", attempt, wait_s)
        for attempt, wait_s in ((1, 0.25), (2, 0.5), (3, 1.0))
    ]
    return items


def fleet_script(pace_s: float = 0.0) -> list[tuple[float, FleetSourceItem]]:
    """A `FleetScriptedSource` script of `fleet()`, `pace_s` before each item."""
    return [(pace_s, item) for item in fleet()]
