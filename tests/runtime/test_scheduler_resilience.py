"""The scheduler keeps deadlines and watches its engine whatever the engine does; no request can
break the control channel. In-process host and scheduler, a real engine on tiny.gguf.

The only processes signalled here are the engines of the host this test started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.load_options import LoadOptions, RestartPolicy
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.engine.channel import MAX_MESSAGE_BYTES
from skippyctl.engine.protocol_commands import Ping
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle
from skippyctl.runtime.scheduler import ModelServer, Scheduler

WAIT_S = 30.0
REQUEST_TERMINALS = {
    EventId.REQUEST_COMPLETED,
    EventId.REQUEST_CANCELLED,
    EventId.REQUEST_TIMED_OUT,
    EventId.REQUEST_FAILED,
    EventId.REQUEST_REJECTED,
}


class Runtime:
    def __init__(
        self,
        fixture_dir: Path,
        lanes: int,
        unresponsive_s: float = 0.5,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.host = RuntimeHost(settings=settings).start()
        self.scheduler = Scheduler(self.host, engine_unresponsive_after_s=unresponsive_s).start()
        self.watch = self.host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
        # Restart never: these tests stop the engine and let it go on (under on-failure the
        # host would kill a stopped engine a window after reporting it; test_engine_recovery).
        options = LoadOptions(
            str(fixture_dir / "tiny.gguf"), lanes=lanes, restart=RestartPolicy.NEVER
        )
        handle = self.scheduler.load(options)
        self.wait_event(EventId.MODEL_AVAILABLE)
        assert handle.model_id == LogicalId("tiny")
        self.seen: list[Event] = []

    def wait_event(self, event_id: EventId, timeout_s: float = WAIT_S) -> Event:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            item = self.watch.get(0.1)
            if item is None:
                continue
            if hasattr(self, "seen"):
                self.seen.append(item.event)
            if item.event.id is event_id:
                return item.event
        raise AssertionError(f"{event_id} not seen")

    def drain_events(self) -> list[Event]:
        while (item := self.watch.get(0.2)) is not None:
            self.seen.append(item.event)
        return self.seen

    def server(self) -> ModelServer:
        server = self.scheduler.server("tiny")
        assert server is not None
        return server

    def engine_pid(self) -> int:
        return self.host.engine_pids()["tiny"]

    def submit(self, **params: Any) -> RequestHandle:
        handle, rejection = self.scheduler.generate("tiny", GenerationParams(**params))
        assert rejection is None
        assert self.scheduler.enqueue(handle) is None
        return handle

    def close(self) -> None:
        self.scheduler.shutdown()
        self.host.shutdown()


@contextlib.contextmanager
def _running(running: Runtime) -> Iterator[Runtime]:
    try:
        yield running
    finally:
        # Never leave a stopped engine behind, whatever failed.
        for pid in running.host.engine_pids().values():
            os.kill(pid, signal.SIGCONT)
        running.close()


@pytest.fixture
def runtime(fixture_dir: Path) -> Iterator[Runtime]:
    with _running(Runtime(fixture_dir, lanes=1)) as running:
        yield running


def finished(handle: RequestHandle, timeout_s: float = WAIT_S) -> Finished:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        chunk = handle.next_chunk_blocking(0.1)
        if isinstance(chunk, Finished):
            return chunk
    raise AssertionError(f"{handle.request_id} got no Finished")


def process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def stop(pid: int) -> None:
    """SIGSTOP lands asynchronously: return once the process is really stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + WAIT_S
    while process_state(pid) != "T":
        assert time.monotonic() < deadline, "the engine never stopped"
        time.sleep(0.01)


def test_a_stopped_engine_cannot_hold_a_request_past_its_deadline(runtime: Runtime) -> None:
    pid = runtime.engine_pid()
    stop(pid)
    try:
        handle = runtime.submit(prompt="The quick brown fox", max_tokens=8, timeout_s=1.0)
        end = finished(handle)
        # Ordering, not timing: the terminal arrived while the engine was still stopped.
        assert process_state(pid) == "T"
        assert (end.outcome, end.reason, end.stop_reason) == (
            "timed_out",
            ReasonCode.TIMEOUT,
            "timeout",
        )
        degraded = runtime.wait_event(EventId.MODEL_DEGRADED)
        assert degraded.scope.model_id == "tiny" and degraded.reason_code is ReasonCode.TIMEOUT
        assert runtime.server().counts() == (0, 0)  # the host lane is free again
    finally:
        os.kill(pid, signal.SIGCONT)
    runtime.wait_event(EventId.MODEL_RECOVERY_COMPLETED)
    # The engine's late gen_done for the first request is ignored; the next one is served.
    after = runtime.submit(prompt="The quick brown fox", max_tokens=4, timeout_s=20.0)
    assert finished(after).outcome == "completed"
    events = runtime.drain_events()
    first = [e for e in events if e.scope.request_id == handle.request_id]
    assert [e.id for e in first if e.id in REQUEST_TERMINALS] == [EventId.REQUEST_TIMED_OUT]
    assert [e.id for e in first if e.id is EventId.GENERATION_TIMED_OUT] == [
        EventId.GENERATION_TIMED_OUT
    ]
    assert not any(e.id is EventId.GENERATION_CANCELLED for e in first)
    # Each episode is reported once and closed once (a loaded machine may add episodes).
    episodes = [
        e.id for e in events if e.id in (EventId.MODEL_DEGRADED, EventId.MODEL_RECOVERY_COMPLETED)
    ]
    assert episodes == [EventId.MODEL_DEGRADED, EventId.MODEL_RECOVERY_COMPLETED] * (
        len(episodes) // 2
    )
    assert runtime.server().counts() == (0, 0)


def test_commands_for_a_stopped_engine_never_block_and_arrive_whole_and_in_order(
    runtime: Runtime,
) -> None:
    """More command bytes than the socket holds: the first go out from the caller's thread,
    the socket fills (a frame may be cut in two), the rest wait in the writer's queue — and
    after SIGCONT the engine reads every frame intact and answers each."""
    engine = runtime.host.engine_for(LogicalId("tiny"))
    assert engine is not None
    pid = engine.pid
    pings = 40_000  # ~1 MB of frames, several times a socketpair's buffers
    stop(pid)
    try:
        before = engine.pongs
        for number in range(pings):
            assert engine.send(Ping(1_000_000 + number))
        assert engine._commands.queued > 0  # the socket was full: the writer holds the rest
        assert process_state(pid) == "T"
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + WAIT_S
    while engine.pongs < before + pings:
        assert time.monotonic() < deadline, (engine.pongs - before, pings)
        time.sleep(0.05)
    assert engine.protocol_errors == 0 and engine.pid == pid
    assert finished(runtime.submit(prompt="after", max_tokens=2)).outcome == "completed"


def test_a_request_queued_behind_a_stopped_engine_still_ends_at_its_deadline(
    runtime: Runtime,
) -> None:
    pid = runtime.engine_pid()
    stop(pid)
    try:
        running = runtime.submit(prompt="one", max_tokens=8, timeout_s=5.0)
        queued = runtime.submit(prompt="two", max_tokens=8, timeout_s=1.0)
        assert finished(queued).outcome == "timed_out"
        assert finished(running).outcome == "timed_out"
        assert process_state(pid) == "T"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert finished(runtime.submit(prompt="three", max_tokens=2)).outcome == "completed"


def test_engine_and_host_deadlines_racing_still_give_one_terminal(fixture_dir: Path) -> None:
    slow = RuntimeSettings(test_decode_delay_ms=20)  # long enough to hit the deadline
    running = Runtime(fixture_dir, lanes=2, settings=slow)
    try:
        handles = [running.submit(prompt="tick", max_tokens=400, timeout_s=0.3) for _ in range(6)]
        ends = [finished(h) for h in handles]
        assert all(e.outcome in ("timed_out", "completed") for e in ends)
        assert any(e.outcome == "timed_out" for e in ends)
        assert finished(running.submit(prompt="after", max_tokens=2)).outcome == "completed"
        events = running.drain_events()
        for handle in handles:
            terminals = [
                e.id
                for e in events
                if e.scope.request_id == handle.request_id and e.id in REQUEST_TERMINALS
            ]
            assert len(terminals) == 1, (handle.request_id, terminals)
        assert running.server().counts() == (0, 0)
    finally:
        running.close()


def test_a_request_whose_command_exceeds_the_frame_limit_is_refused_alone(
    runtime: Runtime,
) -> None:
    prompt = "x" * MAX_MESSAGE_BYTES  # a real 64 MiB prompt: the frame cannot carry it
    handle, rejection = runtime.scheduler.generate("tiny", GenerationParams(prompt=prompt))
    assert rejection is None
    refused = runtime.scheduler.enqueue(handle)
    assert refused is not None
    assert (refused.status, refused.reason) == (400, ReasonCode.CONTEXT_EXHAUSTED)
    end = finished(handle)
    assert (end.outcome, end.reason) == ("rejected", ReasonCode.CONTEXT_EXHAUSTED)
    assert finished(runtime.submit(prompt="small", max_tokens=2)).outcome == "completed"


def test_a_value_json_cannot_carry_is_refused_alone(runtime: Runtime) -> None:
    handle, _ = runtime.scheduler.generate("tiny", GenerationParams(prompt="hi", seed=1 << 70))
    refused = runtime.scheduler.enqueue(handle)
    assert refused is not None
    assert (refused.status, refused.reason) == (400, ReasonCode.INVALID_CONFIGURATION)
    assert finished(runtime.submit(prompt="small", max_tokens=2)).outcome == "completed"


def test_a_healthy_idle_engine_is_never_reported_degraded(fixture_dir: Path) -> None:
    runtime = Runtime(fixture_dir, lanes=1, unresponsive_s=1.0)
    try:
        _idle_engine_stays_healthy(runtime)
    finally:
        runtime.close()


def _idle_engine_stays_healthy(runtime: Runtime) -> None:
    # Idle across several unresponsive windows (1 s each; pinged every 0.25 s): pongs keep it
    # healthy.
    assert finished(runtime.submit(prompt="a", max_tokens=2)).outcome == "completed"
    engine = runtime.host.engine_for(LogicalId("tiny"))
    assert engine is not None
    answered = engine.pongs
    deadline = time.monotonic() + WAIT_S
    while engine.pongs < answered + 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.pongs >= answered + 8
    events = runtime.drain_events()
    assert not any(e.id is EventId.MODEL_DEGRADED for e in events)


LONG_PROMPT = "tick tock " * 300
"""Long enough that its prefill takes several of the engine's chunks."""


def _prefill_events(runtime: Runtime, handle: RequestHandle) -> list[Event]:
    prefill = {
        EventId.PREFILL_STARTED,
        EventId.PREFILL_COMPLETED,
        EventId.PREFILL_CANCELLED,
        EventId.PREFILL_FAILED,
    }
    return [
        e
        for e in runtime.drain_events()
        if e.scope.request_id == handle.request_id and e.id in prefill
    ]


@pytest.fixture
def slow_runtime(fixture_dir: Path) -> Iterator[Runtime]:
    """Every llama_decode of its engine takes 300 ms more: a prefill is seen in progress."""
    slow = RuntimeSettings(test_decode_delay_ms=300)
    with _running(Runtime(fixture_dir, lanes=1, settings=slow)) as running:
        yield running


def test_a_request_cancelled_during_its_prefill_ends_the_prefill_cancelled(
    slow_runtime: Runtime,
) -> None:
    handle = slow_runtime.submit(prompt=LONG_PROMPT, max_tokens=4, timeout_s=60.0)
    slow_runtime.wait_event(EventId.PREFILL_STARTED)
    slow_runtime.scheduler.cancel(handle)
    assert finished(handle).outcome == "cancelled"
    ended = _prefill_events(slow_runtime, handle)
    assert [e.id for e in ended] == [EventId.PREFILL_STARTED, EventId.PREFILL_CANCELLED]
    assert ended[-1].reason_code is ReasonCode.CANCELLATION


def test_a_request_past_its_deadline_in_prefill_ends_the_prefill_failed(
    slow_runtime: Runtime,
) -> None:
    pid = slow_runtime.engine_pid()
    handle = slow_runtime.submit(prompt=LONG_PROMPT, max_tokens=4, timeout_s=2.0)
    slow_runtime.wait_event(EventId.PREFILL_STARTED)
    stop(pid)  # the engine cannot end it: the host does, at the deadline
    try:
        assert finished(handle).outcome == "timed_out"
    finally:
        os.kill(pid, signal.SIGCONT)
    ended = _prefill_events(slow_runtime, handle)
    assert [e.id for e in ended] == [EventId.PREFILL_STARTED, EventId.PREFILL_FAILED]
    assert ended[-1].reason_code is ReasonCode.TIMEOUT


def test_an_engine_crash_during_a_prefill_ends_the_prefill_failed(slow_runtime: Runtime) -> None:
    handle = slow_runtime.submit(prompt=LONG_PROMPT, max_tokens=4, timeout_s=60.0)
    slow_runtime.wait_event(EventId.PREFILL_STARTED)
    os.kill(slow_runtime.engine_pid(), signal.SIGKILL)
    assert finished(handle).outcome == "failed"
    ended = _prefill_events(slow_runtime, handle)
    assert [e.id for e in ended] == [EventId.PREFILL_STARTED, EventId.PREFILL_FAILED]
    assert ended[-1].reason_code is ReasonCode.PROCESS_CRASH
