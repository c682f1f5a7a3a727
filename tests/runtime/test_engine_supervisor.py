"""The supervisor's handling of an unusable message from its engine.

A real engine cannot be made to send one (it encodes every frame with the same codec), so these
tests hand the reader's handler the error the channel raises, on an EngineProcess built without a
process (``object.__new__``): a fault that cannot be produced for real. Everything else the
supervisor does runs against real engines in test_host*.py and test_scheduler_resilience.py.
"""

from __future__ import annotations

import threading
from typing import Any

from skippyctl.engine.protocol import MalformedMessage
from skippyctl.engine.protocol_messages import GenDone, ServingMessage
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import GenerationOutcome, ReasonCode
from skippyctl.runtime.engine_supervisor import EngineProcess


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.messages: list[ServingMessage] = []

    def submit(self, event: Event) -> None:
        self.events.append(event)

    def on_engine_serving(
        self, engine: object, lanes: int, tool_call_format: object = None, pooling: object = None
    ) -> None:
        raise AssertionError("not exercised here")

    def on_engine_message(self, engine: object, message: ServingMessage) -> None:
        self.messages.append(message)

    def on_engine_exit(
        self, engine: object, crashed: bool, reason: ReasonCode | None = None
    ) -> None:
        raise AssertionError("not exercised here")


def processless(recorder: Recorder) -> EngineProcess:
    engine: Any = object.__new__(EngineProcess)
    engine.model_id = LogicalId("m")
    engine.listener = recorder
    engine.protocol_errors = 0
    engine._pipeline = recorder
    engine._ping_lock = threading.Lock()
    return engine  # type: ignore[no-any-return]


def test_an_unusable_gen_done_that_names_its_request_ends_that_request() -> None:
    recorder = Recorder()
    engine = processless(recorder)
    engine._malformed(MalformedMessage("ill-formed gen_done message", "gen_done", "req-7"))
    (failed,) = recorder.messages
    assert isinstance(failed, GenDone)
    assert (failed.request_id, failed.outcome, failed.reason) == (
        "req-7",
        GenerationOutcome.FAILED,
        ReasonCode.INTERNAL_RUNTIME_FAILURE,
    )
    assert [e.id for e in recorder.events] == [EventId.INVARIANT_PROTOCOL_VIOLATION]
    assert engine.protocol_errors == 1


def test_any_other_unusable_message_is_counted_only() -> None:
    recorder = Recorder()
    engine = processless(recorder)
    engine._malformed(MalformedMessage("control frame is not JSON"))
    engine._malformed(MalformedMessage("ill-formed gen_text message", "gen_text", "req-1"))
    assert recorder.messages == []
    assert [e.id for e in recorder.events] == [EventId.INVARIANT_PROTOCOL_VIOLATION] * 2
    assert engine.protocol_errors == 2
