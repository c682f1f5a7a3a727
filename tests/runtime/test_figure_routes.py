"""Every figure of GenerationFigures, set by the engine, reaches the request's receipt JSON and
its terminal events' records unchanged, at the keys the figures table names (a test over the
table: a figure added to the type is followed too).

The path is the real one from the engine's terminal on: the control channel's codec, the model
server (runtime/model_server.py) that claims the terminal, emits the events and delivers the
`Finished`, the receipt the scheduler records from it, and the wire codec of the events. Only
the engine is played (its GenDone is built here: the figures are chosen so that each one's value
is unique)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from skippyctl.engine.protocol import decode_engine_message, encode
from skippyctl.engine.protocol_commands import Command
from skippyctl.engine.protocol_messages import GenDone
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, StopReason
from skippyctl.events.figures import FIGURES, NO_FIGURES
from skippyctl.events.reasons import GenerationOutcome, ReasonCode
from skippyctl.output.codec import event_record
from skippyctl.runtime.model_server import Liveness, ModelServer
from skippyctl.runtime.observations import ServingEvents
from skippyctl.runtime.receipts import Receipt, receipt_of
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle
from tests.events.figure_values import every_figure_set


class _Engine:
    serving = True

    def send(self, command: Command) -> bool:
        return True

    def silent_for_s(self, now_ns: int | None = None) -> float:
        return 0.0

    def ping(self) -> bool:
        return True

    def abort_decode(self) -> None:
        pass

    def kill_unresponsive(self) -> None:
        pass


class _Owner:
    def session_released(self, handle: RequestHandle) -> None:
        pass

    def server_exited(self, server: ModelServer, crashed: bool) -> bool:
        return False


def _serve(done: GenDone) -> tuple[Receipt, list[Event]]:
    """One request through a model server whose engine ends it with ``done`` (sent over the
    control channel's codec): its receipt and its events."""
    events: list[Event] = []
    server = ModelServer(
        LogicalId("m"), 1, 1, ServingEvents(events.append), Liveness(1.0, 5.0), _Owner()
    )
    server.engine = _Engine()
    server.speculation = "plugin"
    receipts: list[Receipt] = []
    handle = RequestHandle(
        request_id=LogicalId(done.request_id),
        model_id=LogicalId("m"),
        session_id=None,
        params=GenerationParams(prompt="hi"),
        received_mono_ns=time.monotonic_ns(),
    )
    # What the scheduler does: the receipt is recorded as the terminal is delivered.
    handle.on_finished = lambda h, f: receipts.append(receipt_of(h, f, time.monotonic_ns()))
    assert server.submit(handle) is None
    server.on_engine_message(server.engine, decode_engine_message(encode(done)))
    (receipt,) = receipts
    return receipt, events


def _receipt_json(receipt: Receipt) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(receipt.document()))
    return loaded


def _summaries(events: list[Event], event_id: EventId) -> dict[str, Any]:
    (event,) = [e for e in events if e.id is event_id]
    record: dict[str, Any] = orjson.loads(orjson.dumps(event_record(event)))
    summaries: dict[str, Any] = record["summaries"]
    return summaries


def test_every_figure_reaches_the_receipt_json_and_the_terminal_events_unchanged() -> None:
    figures = every_figure_set()
    done = GenDone("req-1", GenerationOutcome.COMPLETED, None, StopReason.LENGTH, figures)
    receipt, events = _serve(done)
    assert receipt.figures == figures
    document = _receipt_json(receipt)
    generation = _summaries(events, EventId.GENERATION_COMPLETED)
    speculation = _summaries(events, EventId.SPECULATION_SUMMARIZED)
    for figure in FIGURES:
        value = getattr(figures, figure.name)
        where = document["speculative"] if figure.speculative else document
        assert where[figure.receipt] == value, figure.name
        assert generation[figure.summary.value] == value, figure.name
        if figure.speculative:
            assert speculation[figure.summary.value] == value, figure.name
    assert document["speculative"]["mode"] == "plugin"


def test_a_request_the_engine_refused_has_the_same_receipt_shape() -> None:
    done = GenDone.refused("req-2", ReasonCode.INVALID_CONFIGURATION)
    receipt, _ = _serve(done)
    document = _receipt_json(receipt)
    for figure in FIGURES:
        where = document["speculative"] if figure.speculative else document
        assert where[figure.receipt] == getattr(done.figures, figure.name), figure.name


def test_a_request_no_engine_ended_has_no_figures() -> None:
    handle = RequestHandle(
        request_id=LogicalId("req-3"),
        model_id=LogicalId("m"),
        session_id=None,
        params=GenerationParams(prompt="hi"),
        received_mono_ns=0,
    )
    finished = Finished("rejected", ReasonCode.MISSING_ARTIFACT, None)
    assert finished.figures is NO_FIGURES
    document = receipt_of(handle, finished, 1_000_000).document()
    assert document["queue_ms"] == document["total_ms"] == 1.0
    for figure in FIGURES:
        where = document["speculative"] if figure.speculative else document
        assert where[figure.receipt] == (0 if figure.count else None), figure.name
