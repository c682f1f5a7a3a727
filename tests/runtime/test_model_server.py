"""Per-model admission alone, through the EngineLink Protocol (runtime/model_server.py).

The engine here is :class:`InMemoryEngine`, a test double: it runs nothing, records the commands
admission sends, and the test plays the engine's side by handing the server the messages a real
engine would send. The same paths on a real engine (tiny.gguf, SIGSTOP, racing deadlines) are
tests/runtime/test_scheduler_resilience.py and tests/api.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from skippyctl.config.load_options import LoadOptions, RestartPolicy
from skippyctl.engine.protocol_commands import Cancel, Command, Generate
from skippyctl.engine.protocol_messages import (
    GenDone,
    GenStarted,
    GenText,
    Kv,
    KvChange,
    SessionChange,
    SessionChanged,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import BatchingMode, Event, LogicalId, StopReason, SummaryKey
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import CacheResult, GenerationOutcome, Outcome, ReasonCode
from skippyctl.runtime.model_server import HOST_DEADLINE_GRACE_S, Liveness, ModelServer
from skippyctl.runtime.observations import ServingEvents
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle, TextChunk

MODEL = LogicalId("m")
SECOND_NS = 1_000_000_000


class InMemoryEngine:
    """EngineLink test double: records commands; `alive=False` makes sends fail (engine gone)."""

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.serving = True
        self.alive = True
        self.silent_s = 0.0
        self.pings = 0
        self.aborts = 0
        self.killed = False
        self._answer: ModelServer | None = None

    def send(self, command: Command) -> bool:
        self.commands.append(command)
        if isinstance(command, Cancel) and self._answer is not None:
            # Play the engine: a cancelled request ends with its cancelled terminal.
            self._answer.on_engine_message(
                self,
                done(
                    command.request_id,
                    outcome=GenerationOutcome.CANCELLED,
                    reason=ReasonCode.CANCELLATION,
                    stop_reason=StopReason.CANCELLED,
                ),
            )
        return self.alive

    def answer_cancels(self, server: ModelServer) -> None:
        self._answer = server

    def silent_for_s(self, now_ns: int | None = None) -> float:
        return self.silent_s

    def ping(self) -> bool:
        self.pings += 1
        return True

    def abort_decode(self) -> None:
        self.aborts += 1

    def kill_unresponsive(self) -> None:
        self.killed = True

    def generated(self) -> list[str]:
        return [c.request_id for c in self.commands if isinstance(c, Generate)]

    def cancelled(self) -> list[str]:
        return [c.request_id for c in self.commands if isinstance(c, Cancel)]


@dataclass
class Owner:
    released: list[LogicalId] = field(default_factory=list)
    exited: list[ModelServer] = field(default_factory=list)

    def session_released(self, handle: RequestHandle) -> None:
        self.released.append(handle.request_id)

    def server_exited(self, server: ModelServer, crashed: bool) -> bool:
        self.exited.append(server)
        return False  # no restart: the recovery's tests run real engines


@dataclass
class Harness:
    server: ModelServer
    engine: InMemoryEngine
    owner: Owner
    events: list[Event]
    count: int = 0

    def request(self, session: str | None = None, **params: Any) -> RequestHandle:
        self.count += 1
        params.setdefault("prompt", "hi")
        return RequestHandle(
            request_id=LogicalId(f"req-{self.count}"),
            model_id=MODEL,
            session_id=None if session is None else LogicalId(session),
            params=GenerationParams(**params),
            received_mono_ns=time.monotonic_ns(),
        )

    def ids(self, request: RequestHandle | None = None) -> list[EventId]:
        return [
            e.id for e in self.events if request is None or e.scope.request_id == request.request_id
        ]

    def terminals(self, request: RequestHandle) -> list[EventId]:
        return [i for i in self.ids(request) if i.value.startswith("request_") and i in TERMINALS]


TERMINALS = {
    EventId.REQUEST_COMPLETED,
    EventId.REQUEST_CANCELLED,
    EventId.REQUEST_TIMED_OUT,
    EventId.REQUEST_FAILED,
    EventId.REQUEST_REJECTED,
}


def harness(lanes: int = 1, max_queue: int = 2, serving_events: bool = True) -> Harness:
    events: list[Event] = []
    owner = Owner()
    server = ModelServer(
        MODEL,
        lanes,
        max_queue,
        ServingEvents(events.append, serving_events),
        Liveness(heartbeat_interval_s=0.25, unresponsive_after_s=1.0),
        owner,
    )
    engine = InMemoryEngine()
    server.engine = engine
    return Harness(server, engine, owner, events)


def chunks(handle: RequestHandle) -> list[TextChunk | Finished]:
    found: list[TextChunk | Finished] = []
    while (chunk := handle.next_chunk_blocking(0)) is not None:
        found.append(chunk)
    return found


def done(request_id: str, **fields: Any) -> GenDone:
    """The engine's terminal: completed/eos unless ``fields`` say otherwise; the fields that
    are figures go into its figures (a refused request's, so far)."""
    base = GenDone.refused(request_id, ReasonCode.INTERNAL_RUNTIME_FAILURE)
    figures = {
        k: fields.pop(k) for k in list(fields) if k in GenerationFigures.__dataclass_fields__
    }
    values = {f: getattr(base, f) for f in GenDone.__dataclass_fields__}
    values.update(outcome=GenerationOutcome.COMPLETED, reason=None, stop_reason=StopReason.EOS)
    values.update(fields, figures=dataclasses.replace(base.figures, **figures))
    return GenDone(**values)


def test_at_most_lanes_run_the_queue_is_bounded_and_beyond_it_a_request_is_429() -> None:
    h = harness(lanes=1, max_queue=1)
    running, queued, refused = h.request(), h.request(), h.request()
    assert h.server.submit(running) is None
    assert h.server.submit(queued) is None
    rejection = h.server.submit(refused)
    assert rejection is not None
    assert (rejection.status, rejection.reason, rejection.retry_after_s) == (
        429,
        ReasonCode.RESERVATION_EXHAUSTED,
        1,
    )
    assert h.engine.generated() == ["req-1"]
    assert h.server.counts() == (1, 1)
    assert chunks(refused) == [Finished("rejected", ReasonCode.RESERVATION_EXHAUSTED, None)]
    assert h.ids(queued) == [EventId.REQUEST_RECEIVED, EventId.REQUEST_QUEUED]
    rejected = next(e for e in h.events if e.id is EventId.REQUEST_REJECTED)
    assert rejected.outcome is Outcome.REJECTED and rejected.scope.request_id == "req-3"


def test_the_engines_terminal_ends_the_request_once_and_starts_the_next() -> None:
    h = harness(lanes=1)
    first, second = h.request(), h.request()
    h.server.submit(first)
    h.server.submit(second)
    h.server.on_engine_message(h.engine, GenText("req-1", "hello"))
    h.server.on_engine_message(
        h.engine, done("req-1", prompt_tokens=4, generated_tokens=2, shared_decode_steps=1)
    )
    h.server.on_engine_message(h.engine, done("req-1"))  # a duplicate: nobody's any more
    text, finished = chunks(first)
    assert text == TextChunk("hello")
    # The terminal carries the engine's own figures on (the request's receipt is made of them).
    assert finished == Finished(
        GenerationOutcome.COMPLETED,
        None,
        "eos",
        GenerationFigures(
            prompt_tokens=4,
            generated_tokens=2,
            prefill_ms=0.0,
            decode_ms=0.0,
            shared_decode_steps=1,
        ),
    )
    assert h.engine.generated() == ["req-1", "req-2"]
    assert h.terminals(first) == [EventId.REQUEST_COMPLETED]
    assert h.ids(first) == [
        EventId.REQUEST_RECEIVED,
        EventId.REQUEST_ADMITTED,
        EventId.REQUEST_EXECUTION_STARTED,
        EventId.STOP_CONDITION_REACHED,
        EventId.GENERATION_COMPLETED,
        EventId.REQUEST_COMPLETED,
    ]
    completed = next(e for e in h.events if e.id is EventId.GENERATION_COMPLETED)
    assert completed.batching is BatchingMode.CONTINUOUS  # it shared a step
    assert h.owner.released == [LogicalId("req-1")]


def test_a_request_running_past_its_deadline_is_ended_by_the_host_late_messages_ignored() -> None:
    h = harness(lanes=1)
    late = h.request(timeout_s=1.0)
    behind = h.request()
    h.server.submit(late)
    h.server.submit(behind)
    deadline_ns = late.received_mono_ns + int((1.0 + HOST_DEADLINE_GRACE_S) * SECOND_NS)
    h.server.expire_running(deadline_ns - 1)
    assert h.server.counts() == (1, 1)  # not yet
    h.server.expire_running(deadline_ns)
    assert chunks(late) == [Finished(GenerationOutcome.TIMED_OUT, ReasonCode.TIMEOUT, "timeout")]
    assert h.engine.cancelled() == ["req-1"]
    assert h.engine.generated() == ["req-1", "req-2"]  # its host lane went to the next one
    h.server.on_engine_message(h.engine, done("req-1"))  # the engine's own, too late
    h.server.on_engine_message(h.engine, GenText("req-1", "late text"))
    assert chunks(late) == []
    assert h.terminals(late) == [EventId.REQUEST_TIMED_OUT]
    assert EventId.GENERATION_TIMED_OUT in h.ids(late)
    assert EventId.GENERATION_COMPLETED not in h.ids(late)


def test_a_queued_request_past_its_deadline_times_out_without_reaching_the_engine() -> None:
    h = harness(lanes=1)
    h.server.submit(h.request())
    waiting = h.request(timeout_s=0.5)
    h.server.submit(waiting)
    assert h.server.next_deadline_ns() == waiting.received_mono_ns + SECOND_NS // 2
    h.server.expire_queued(waiting.received_mono_ns + SECOND_NS)
    assert chunks(waiting) == [Finished(GenerationOutcome.TIMED_OUT, ReasonCode.TIMEOUT, None)]
    assert h.engine.generated() == ["req-1"]
    assert h.terminals(waiting) == [EventId.REQUEST_TIMED_OUT]


def test_cancel_ends_a_queued_request_here_and_asks_the_engine_for_a_running_one() -> None:
    h = harness(lanes=1)
    running, queued = h.request(), h.request()
    h.server.submit(running)
    h.server.submit(queued)
    h.server.cancel("req-2")
    assert chunks(queued) == [Finished(GenerationOutcome.CANCELLED, ReasonCode.CANCELLATION, None)]
    h.server.cancel("req-1")
    assert h.engine.cancelled() == ["req-1"]
    assert chunks(running) == []  # its terminal is the engine's (cancelled GenDone)


def test_an_engine_crash_fails_everything_with_process_crash() -> None:
    h = harness(lanes=1)
    running, queued = h.request(), h.request()
    h.server.submit(running)
    h.server.submit(queued)
    h.server.on_engine_exit(h.engine, crashed=True)
    assert chunks(running) == [Finished("failed", ReasonCode.PROCESS_CRASH, "error")]
    assert chunks(queued) == [Finished("failed", ReasonCode.PROCESS_CRASH, None)]
    assert h.terminals(running) == h.terminals(queued) == [EventId.REQUEST_FAILED]
    assert h.owner.exited == [h.server]
    refused = h.server.submit(h.request())
    assert refused is not None and (refused.status, refused.reason) == (
        503,
        ReasonCode.STAGE_UNAVAILABLE,
    )


def test_a_command_json_cannot_carry_is_refused_at_admission() -> None:
    h = harness()
    handle = h.request(seed=1 << 70)
    refused = h.server.submit(handle)
    assert refused is not None and (refused.status, refused.reason) == (
        400,
        ReasonCode.INVALID_CONFIGURATION,
    )
    assert h.engine.commands == []
    assert chunks(handle) == [Finished("rejected", ReasonCode.INVALID_CONFIGURATION, None)]


def test_a_silent_engine_is_pinged_then_degraded_once_then_recovered() -> None:
    h = harness()
    h.engine.silent_s = 0.1
    h.server.check_engine(0)
    assert h.engine.pings == 0
    h.engine.silent_s = 0.3
    h.server.check_engine(1)
    assert h.engine.pings == 1
    h.engine.silent_s = 1.5
    h.server.check_engine(2 * SECOND_NS)
    h.server.check_engine(3 * SECOND_NS)
    h.engine.silent_s = 0.0
    h.server.check_engine(4 * SECOND_NS)
    episodes = [e for e in h.events if e.scope.request_id is None]
    assert [e.id for e in episodes] == [
        EventId.MODEL_DEGRADED,
        EventId.MODEL_RECOVERY_STARTED,
        EventId.MODEL_RECOVERY_COMPLETED,
    ]
    assert episodes[0].reason_code is ReasonCode.TIMEOUT
    assert episodes[2].duration_ms == 2000.0


def test_an_engine_that_exits_while_silent_ends_its_recovery_as_failed() -> None:
    h = harness()
    h.engine.silent_s = 1.5
    h.server.check_engine(2 * SECOND_NS)
    h.server.on_engine_exit(h.engine, crashed=True)
    episodes = [e.id for e in h.events if e.scope.request_id is None]
    assert episodes[:3] == [
        EventId.MODEL_DEGRADED,
        EventId.MODEL_RECOVERY_STARTED,
        EventId.MODEL_RECOVERY_FAILED,
    ]
    failed = next(e for e in h.events if e.id is EventId.MODEL_RECOVERY_FAILED)
    assert failed.reason_code is ReasonCode.PROCESS_CRASH
    # An engine that exits while it answers has nothing to recover from.
    calm = harness()
    calm.server.on_engine_exit(calm.engine, crashed=True)
    assert EventId.MODEL_RECOVERY_FAILED not in [e.id for e in calm.events]


@pytest.mark.parametrize("policy", list(RestartPolicy))
def test_an_engine_silent_a_whole_window_after_degraded_is_killed_when_it_may_restart(
    policy: RestartPolicy,
) -> None:
    h = harness()
    h.server.options = LoadOptions("tiny.gguf", restart=policy)
    h.engine.silent_s = 1.5  # past unresponsive_after_s (1 s): degraded
    h.server.check_engine(2 * SECOND_NS)
    assert not h.engine.killed
    h.engine.silent_s = 2.5  # still silent a whole window later
    h.server.check_engine(3 * SECOND_NS)
    assert h.engine.killed is (policy is RestartPolicy.ON_FAILURE)


def test_with_serving_events_off_only_availability_is_reported() -> None:
    h = harness(serving_events=False)
    handle = h.request()
    h.server.submit(handle)
    h.server.on_engine_message(h.engine, done("req-1"))
    h.engine.silent_s = 5.0
    h.server.check_engine(SECOND_NS)
    assert [e.id for e in h.events] == [EventId.MODEL_DEGRADED, EventId.MODEL_RECOVERY_STARTED]
    assert chunks(handle) == [
        Finished(
            GenerationOutcome.COMPLETED,
            None,
            "eos",
            GenerationFigures(prefill_ms=0.0, decode_ms=0.0),
        )
    ]


def test_observations_become_events_in_table_order_and_foreign_ones_are_ignored() -> None:
    h = harness()
    handle = h.request(session="s-1")
    h.server.submit(handle)
    h.server.on_engine_message(h.engine, GenStarted("req-1", 0, "s-1", 9, 8, CacheResult.HIT))
    h.server.on_engine_message(h.engine, GenStarted("req-99", 0, None, 9, 0, CacheResult.NONE))
    assert h.ids(handle)[-6:] == [
        EventId.PROMPT_PROCESSING_STARTED,
        EventId.TOKENIZATION_COMPLETED,
        EventId.CACHE_LOOKUP_HIT,
        EventId.PROMPT_CACHE_RESTORE_HIT,
        EventId.SESSION_ACTIVE,
        EventId.PREFILL_STARTED,
    ]
    assert not any(e.scope.request_id == "req-99" for e in h.events)
    h.server.on_engine_message(h.engine, Kv(KvChange.PRESSURE_CROSSED, 90, 100))
    h.server.on_engine_message(
        h.engine, SessionChanged("s-1", SessionChange.EVICTED, 0, 12, "pressure", 1500.0)
    )
    h.server.on_engine_message(h.engine, SessionChanged("s-1", SessionChange.REUSED, 0, 12))
    facts = [e.id for e in h.events if e.scope.request_id is None]
    # An eviction drops the session's cells: the session is reset and the KV trimmed.
    assert facts == [EventId.CACHE_PRESSURE_CROSSED, EventId.SESSION_RESET, EventId.CACHE_TRIMMED]
    reset = next(e for e in h.events if e.id is EventId.SESSION_RESET)
    assert (reset.reason_code, reset.duration_ms) == (ReasonCode.RESERVATION_EXHAUSTED, 1500.0)


def test_a_forced_drain_cancels_queued_here_and_running_in_the_engine() -> None:
    h = harness(lanes=1)
    h.engine.answer_cancels(h.server)
    running, queued = h.request(), h.request()
    h.server.submit(running)
    h.server.submit(queued)
    assert h.server.drain(force=True, drain_timeout_s=30.0) == 2
    assert h.engine.aborts == 1  # a decode in flight is stopped, not waited for
    assert h.engine.cancelled() == ["req-1"]
    assert chunks(queued) == [Finished(GenerationOutcome.CANCELLED, ReasonCode.CANCELLATION, None)]
    (ended,) = chunks(running)
    assert isinstance(ended, Finished) and ended.outcome == GenerationOutcome.CANCELLED
    assert h.server.counts() == (0, 0) and not h.server.accepting
    assert h.engine.generated() == ["req-1"]  # nothing started while draining


def _idle_events(h: Harness) -> list[EventId]:
    kinds = {EventId.MODEL_IDLE_TIMER_STARTED, EventId.MODEL_IDLE_TIMER_CLEARED}
    return [e.id for e in h.events if e.id in kinds]


def test_an_idle_model_announces_its_ttl_and_is_claimed_once_it_runs_out() -> None:
    h = harness()
    h.server.ttl_s = 5.0
    h.server.on_engine_serving(h.engine, 1)
    started = next(e for e in h.events if e.id is EventId.MODEL_IDLE_TIMER_STARTED)
    assert started.summary_value(SummaryKey.IDLE_TTL_MS) == 5000
    expiry = h.server.idle_expiry_ns()
    assert expiry is not None
    assert not h.server.claim_idle_expired(expiry - 1)
    # A request stops the timer; while it runs nothing is claimed.
    running = h.request()
    assert h.server.submit(running) is None
    assert h.server.idle_expiry_ns() is None
    assert not h.server.claim_idle_expired(expiry + 10**12)
    h.server.on_engine_message(h.engine, done("req-1"))
    assert _idle_events(h) == [
        EventId.MODEL_IDLE_TIMER_STARTED,
        EventId.MODEL_IDLE_TIMER_CLEARED,
        EventId.MODEL_IDLE_TIMER_STARTED,
    ]
    later = h.server.idle_expiry_ns()
    assert later is not None and h.server.claim_idle_expired(later)
    # Claimed: admission stopped in the same step; the next request is refused.
    assert not h.server.accepting
    refused = h.server.submit(h.request())
    assert refused is not None and refused.status == 503


def test_a_requests_keep_alive_sets_the_idle_time_after_it() -> None:
    h = harness()
    h.server.on_engine_serving(h.engine, 1)
    assert h.server.idle_expiry_ns() is None and _idle_events(h) == []  # no TTL: never
    h.server.submit(h.request(keep_alive_s=0.0))
    h.server.on_engine_message(h.engine, done("req-1"))
    since = h.server.idle_since_ns
    assert since is not None and h.server.idle_expiry_ns() == since
    h.server.submit(h.request())  # without keep_alive: the model's TTL again (never)
    h.server.on_engine_message(h.engine, done("req-2"))
    assert h.server.idle_expiry_ns() is None


def test_a_pinned_model_is_never_claimed() -> None:
    h = harness()
    h.server.ttl_s = 0.0
    h.server.pinned = True
    h.server.on_engine_serving(h.engine, 1)
    assert _idle_events(h) == []
    assert not h.server.claim_idle_expired(time.monotonic_ns() + 10**12)
    assert not h.server.claim_for_eviction()
    assert h.server.accepting


def test_requests_that_waited_for_the_load_arrive_before_it_can_be_claimed() -> None:
    h = harness()
    h.server.ttl_s = 0.0
    h.server.on_engine_serving(h.engine, 1)
    h.server.expect_arrivals(1)
    assert not h.server.claim_for_eviction()
    assert not h.server.claim_idle_expired(time.monotonic_ns())
    h.server.submit(h.request())  # the one that waited
    h.server.on_engine_message(h.engine, done("req-1"))
    assert h.server.claim_for_eviction()
