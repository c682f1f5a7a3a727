"""StageSupervisor in this process, with a real worker process."""

from __future__ import annotations

import socket
import threading

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.stages.stage_supervisor import StageOptions, StageSupervisor
from tests.stages.helpers import alive, kill_quietly


def test_stop_ends_in_stage_stopped_and_reaps_the_worker() -> None:
    stop = threading.Event()
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        if event.id is EventId.STAGE_READY:
            stop.set()

    supervisor = StageSupervisor(StageOptions(port=0, threads=1), emit)
    try:
        outcome = supervisor.run(stop)
    finally:
        if supervisor.worker_pid is not None:
            kill_quietly(supervisor.worker_pid)
    assert [e.id for e in events] == [
        EventId.STAGE_STARTING,
        EventId.STAGE_READY,
        EventId.STAGE_STOPPING,
        EventId.STAGE_STOPPED,
    ]
    assert outcome.reason is None and outcome.event.outcome is Outcome.SUCCESS
    assert [e.state.current for e in events if e.state] == [
        "starting",
        "ready",
        "stopping",
        "stopped",
    ]
    assert {e.summary_value(SummaryKey.PORT) for e in events} == {supervisor.port}
    assert supervisor.worker_pid is not None and not alive(supervisor.worker_pid)


def test_a_stranger_listening_first_on_the_reserved_port_is_not_taken_for_the_stage() -> None:
    # The one race a reservation cannot close: another process binds with SO_REUSEADDR and
    # listens before ggml does. ggml's bind then fails; the probe's connection is accepted by
    # the stranger, which must not count as the stage being ready.
    stranger = socket.socket()
    stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        if event.id is EventId.STAGE_STARTING:  # reserved, worker not started yet
            stranger.bind(("127.0.0.1", supervisor.port))
            stranger.listen(8)

    supervisor = StageSupervisor(StageOptions(port=0, threads=1), emit)
    try:
        outcome = supervisor.run(threading.Event())
    finally:
        stranger.close()
        if supervisor.worker_pid is not None:
            kill_quietly(supervisor.worker_pid)
    assert [e.id for e in events] == [EventId.STAGE_STARTING, EventId.STAGE_FAILED]
    assert outcome.reason is ReasonCode.RESOURCE_ALLOCATION_FAILURE
    assert "in use" in outcome.message
