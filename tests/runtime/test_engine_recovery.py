"""An engine killed while it serves is restarted by the runtime under the load's restart
policy: the request it was running ends with a reason, the requests waiting for it are served by
the restarted engine, and a model that keeps dying ends failed. In-process host and scheduler,
real engines on tiny.gguf, killed with SIGKILL (the only processes signalled are this test's
own engines).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions, RestartPolicy
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.reducer.state import ModelState
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.recovery import RESTART_LIMIT, RestartBook
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle, TextChunk
from skippyctl.runtime.scheduler import Scheduler

WAIT_S = 60.0
MODEL = LogicalId("tiny")


class Runtime:
    def __init__(self, settings: RuntimeSettings | None = None, backoff_s: float = 0.05) -> None:
        self.host = RuntimeHost(settings=settings).start()
        self.scheduler = Scheduler(self.host).start()
        self.scheduler.restarts = RestartBook(first_backoff_s=backoff_s)
        self.watch = self.host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
        self.seen: list[Event] = []

    def load(self, artifact: Path, **options: object) -> None:
        handle = self.scheduler.load(LoadOptions(str(artifact), alias="tiny", **options))  # type: ignore[arg-type]
        assert handle.problem is None
        self.wait_for(lambda e: e.id is EventId.MODEL_AVAILABLE)

    def wait_for(self, match: Callable[[Event], bool], timeout_s: float = WAIT_S) -> Event:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            item = self.watch.get(0.1)
            if item is None:
                continue
            self.seen.append(item.event)
            if match(item.event):
                return item.event
        raise AssertionError("the awaited event did not come")

    def wait(self, event_id: EventId) -> Event:
        return self.wait_for(lambda e: e.id is event_id)

    def submit(self, max_tokens: int) -> RequestHandle:
        params = GenerationParams(prompt="Once upon a time", max_tokens=max_tokens, timeout_s=60)
        handle, rejection = self.scheduler.generate("tiny", params)
        assert rejection is None and self.scheduler.enqueue(handle) is None
        return handle

    def kill_engine(self) -> None:
        os.kill(self.host.engine_pids()["tiny"], signal.SIGKILL)

    def model_state(self) -> ModelState:
        view = self.host.pipeline.state.models[MODEL]
        return view.state

    def ids(self) -> list[EventId]:
        return [e.id for e in self.seen]

    def close(self) -> None:
        self.scheduler.shutdown()
        self.host.shutdown()


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    # Every llama_decode takes 20 ms more: a 200-token request is still running when killed.
    made = Runtime(RuntimeSettings(test_decode_delay_ms=20))
    try:
        yield made
    finally:
        made.close()


def finished(handle: RequestHandle) -> Finished:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        chunk = handle.next_chunk_blocking(0.1)
        if isinstance(chunk, Finished):
            return chunk
    raise AssertionError(f"{handle.request_id} got no Finished")


def first_text(handle: RequestHandle) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if isinstance(handle.next_chunk_blocking(0.1), TextChunk):
            return
    raise AssertionError(f"{handle.request_id} streamed nothing")


def test_a_killed_engine_is_restarted_and_the_queued_request_is_served(
    runtime: Runtime, fixture_dir: Path
) -> None:
    runtime.load(fixture_dir / "tiny.gguf", lanes=1)
    streaming = runtime.submit(max_tokens=200)
    waiting = runtime.submit(max_tokens=4)  # one lane: it waits behind the stream
    first_text(streaming)
    runtime.kill_engine()

    cut = finished(streaming)
    assert (cut.outcome, cut.reason) == ("failed", ReasonCode.PROCESS_CRASH)
    served = finished(waiting)
    assert served.outcome == "completed", served
    completed = runtime.wait(EventId.MODEL_RECOVERY_COMPLETED)
    assert completed.outcome is Outcome.SUCCESS
    assert completed.summary_value(SummaryKey.ATTEMPT) == 1

    story = [
        i
        for i in runtime.ids()
        if i
        in {
            EventId.ENGINE_PROCESS_CRASHED,
            EventId.MODEL_UNAVAILABLE,
            EventId.MODEL_RECOVERY_STARTED,
            EventId.MODEL_LOAD_REQUESTED,
            EventId.MODEL_AVAILABLE,
            EventId.MODEL_RECOVERY_COMPLETED,
        }
    ]
    assert story == [
        EventId.MODEL_LOAD_REQUESTED,  # the operator's load
        EventId.MODEL_AVAILABLE,
        EventId.ENGINE_PROCESS_CRASHED,
        EventId.MODEL_UNAVAILABLE,
        EventId.MODEL_RECOVERY_STARTED,
        EventId.MODEL_LOAD_REQUESTED,  # the restart
        EventId.MODEL_AVAILABLE,
        EventId.MODEL_RECOVERY_COMPLETED,
    ]
    started = next(e for e in runtime.seen if e.id is EventId.MODEL_RECOVERY_STARTED)
    assert started.summary_value(SummaryKey.RETRY_DELAY_MS) == 50
    view = runtime.host.pipeline.state.models[MODEL]
    assert (view.state, view.restarts, view.recovery_attempt) == (ModelState.AVAILABLE, 1, None)
    # The restarted engine serves new requests as the first did.
    assert finished(runtime.submit(max_tokens=4)).outcome == "completed"


def test_a_request_during_the_backoff_waits_for_the_restart(
    fixture_dir: Path,
) -> None:
    slow = Runtime(backoff_s=1.0)
    try:
        slow.load(fixture_dir / "tiny.gguf")
        slow.kill_engine()
        slow.wait(EventId.MODEL_RECOVERY_STARTED)
        demand = slow.scheduler.demand("tiny")
        assert demand is not None  # not a 404 or 503: it waits for the restart
        server = demand.future.result(WAIT_S)
        slow.scheduler.stop_waiting(demand)
        assert server.ready.done() and server.accepting
        handle = slow.submit(max_tokens=4)
        assert finished(handle).outcome == "completed"
    finally:
        slow.close()


def test_an_engine_that_keeps_dying_ends_failed_after_the_policy_limit(
    runtime: Runtime, fixture_dir: Path
) -> None:
    runtime.load(fixture_dir / "tiny.gguf")
    for attempt in range(1, RESTART_LIMIT + 1):
        runtime.kill_engine()
        done = runtime.wait(EventId.MODEL_RECOVERY_COMPLETED)
        assert done.summary_value(SummaryKey.ATTEMPT) == attempt
    runtime.kill_engine()
    failed = runtime.wait(EventId.MODEL_RECOVERY_FAILED)
    assert (failed.outcome, failed.reason_code) == (Outcome.FAILURE, ReasonCode.CRASH_LOOP)
    deadline = time.monotonic() + 5
    while runtime.model_state() is not ModelState.FAILED:
        assert time.monotonic() < deadline, runtime.model_state()
        time.sleep(0.02)
    view = runtime.host.pipeline.state.models[MODEL]
    assert (view.reason_code, view.restarts) == (ReasonCode.CRASH_LOOP, RESTART_LIMIT)
    # The operator's own load starts a fresh count.
    runtime.load(fixture_dir / "tiny.gguf")
    runtime.kill_engine()
    assert runtime.wait(EventId.MODEL_RECOVERY_COMPLETED).summary_value(SummaryKey.ATTEMPT) == 1


def test_a_restart_that_cannot_load_ends_failed_and_fails_what_waited(
    runtime: Runtime, fixture_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "tiny.gguf"
    shutil.copyfile(fixture_dir / "tiny.gguf", copy)
    runtime.load(copy, lanes=1)
    streaming = runtime.submit(max_tokens=200)
    waiting = runtime.submit(max_tokens=4)
    first_text(streaming)
    copy.unlink()  # every restart's load fails now
    runtime.kill_engine()
    failed = runtime.wait(EventId.MODEL_RECOVERY_FAILED)
    assert failed.reason_code is ReasonCode.CRASH_LOOP
    assert failed.summary_value(SummaryKey.ATTEMPT) == RESTART_LIMIT
    assert runtime.ids().count(EventId.MODEL_LOAD_FAILED) == RESTART_LIMIT
    ended = finished(waiting)
    assert (ended.outcome, ended.reason) == ("failed", ReasonCode.CRASH_LOOP)
    deadline = time.monotonic() + 5
    while runtime.host.pipeline.state.models[MODEL].reason_code is not ReasonCode.CRASH_LOOP:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert runtime.model_state() is ModelState.FAILED


def test_a_session_whose_kv_died_with_its_engine_is_failed(
    runtime: Runtime, fixture_dir: Path
) -> None:
    runtime.load(fixture_dir / "tiny.gguf")
    params = GenerationParams(prompt="Once upon a time", max_tokens=4, timeout_s=60)
    handle, rejection = runtime.scheduler.generate("tiny", params, session_key="a-conversation")
    assert rejection is None and runtime.scheduler.enqueue(handle) is None
    assert finished(handle).outcome == "completed"
    session = handle.session_id
    assert session is not None
    runtime.kill_engine()
    failed = runtime.wait(EventId.SESSION_FAILED)
    assert failed.scope.session_id == session
    assert (failed.outcome, failed.reason_code) == (Outcome.FAILURE, ReasonCode.PROCESS_CRASH)
    runtime.wait(EventId.MODEL_RECOVERY_COMPLETED)
    assert session not in runtime.host.pipeline.state.sessions  # not left behind as idle


def test_restart_never_leaves_the_model_unavailable(runtime: Runtime, fixture_dir: Path) -> None:
    runtime.load(fixture_dir / "tiny.gguf", restart=RestartPolicy.NEVER)
    runtime.kill_engine()
    runtime.wait(EventId.MODEL_UNAVAILABLE)
    time.sleep(1.0)  # 20 backoffs of this runtime: a restart would have begun
    while (item := runtime.watch.get(0.1)) is not None:
        runtime.seen.append(item.event)
    assert EventId.MODEL_RECOVERY_STARTED not in runtime.ids()
    assert runtime.model_state() is ModelState.UNAVAILABLE


def test_an_unload_during_the_backoff_ends_the_recovery(fixture_dir: Path) -> None:
    slow = Runtime(backoff_s=5.0)
    try:
        slow.load(fixture_dir / "tiny.gguf")
        slow.kill_engine()
        slow.wait(EventId.MODEL_RECOVERY_STARTED)
        assert slow.scheduler.unload("tiny") is not None
        slow.wait(EventId.UNLOAD_COMPLETED)
        time.sleep(0.3)
        while (item := slow.watch.get(0.1)) is not None:
            slow.seen.append(item.event)
        assert slow.ids().count(EventId.MODEL_LOAD_REQUESTED) == 1  # no restart followed
        assert EventId.MODEL_RECOVERY_FAILED not in slow.ids()
        assert slow.model_state() is ModelState.UNLOADED
    finally:
        slow.close()


def test_an_engine_that_stops_answering_is_killed_and_restarted(fixture_dir: Path) -> None:
    host = RuntimeHost().start()
    scheduler = Scheduler(host, engine_unresponsive_after_s=0.5).start()
    scheduler.restarts = RestartBook(first_backoff_s=0.05)
    stuck = Runtime.__new__(Runtime)  # the helper's waits and checks on this host
    stuck.host, stuck.scheduler, stuck.seen = host, scheduler, []
    stuck.watch = host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
    try:
        stuck.load(fixture_dir / "tiny.gguf")
        pid = host.engine_pids()["tiny"]
        os.kill(pid, signal.SIGSTOP)  # alive, and silent: no pong ever comes
        crashed = stuck.wait(EventId.ENGINE_PROCESS_CRASHED)
        assert crashed.reason_code is ReasonCode.TIMEOUT
        assert crashed.summary_value(SummaryKey.EXIT_SIGNAL) == signal.SIGKILL
        stuck.wait(EventId.MODEL_RECOVERY_COMPLETED)
        assert host.engine_pids()["tiny"] != pid
        assert finished(stuck.submit(max_tokens=4)).outcome == "completed"
        ids = stuck.ids()
        assert ids.index(EventId.MODEL_DEGRADED) < ids.index(EventId.ENGINE_PROCESS_CRASHED)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        stuck.close()
