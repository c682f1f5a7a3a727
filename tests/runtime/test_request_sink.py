"""A request's text sink (runtime/requests.py `RequestHandle.attach_sink`): when it may be
attached, what it takes, and that the caller's queue gets everything it does not — in order,
with the terminal always last and the sink closed before it."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from skippyctl.events.envelope import LogicalId
from skippyctl.runtime.requests import (
    Finished,
    GenerationParams,
    RequestHandle,
    TextChunk,
    TokenLogprob,
)


@dataclass
class RecordingSink:
    """A sink that keeps what it is given; `capacity` chunks, then it refuses (as a socket
    sink does once the socket took a chunk only in part)."""

    capacity: int = 1_000
    written: list[str] = field(default_factory=list)
    closed: int = 0

    def write(self, text: str) -> bool:
        if self.closed or len(self.written) >= self.capacity:
            return False
        self.written.append(text)
        return True

    def close(self) -> None:
        self.closed += 1


def _handle() -> RequestHandle:
    return RequestHandle(
        request_id=LogicalId("req-1"),
        model_id=LogicalId("m"),
        session_id=None,
        params=GenerationParams(prompt="hi"),
        received_mono_ns=time.monotonic_ns(),
    )


def _done() -> Finished:
    return Finished("completed", None, "length")


async def _drain(handle: RequestHandle) -> list[object]:
    taken: list[object] = []
    while not taken or not isinstance(taken[-1], Finished):
        taken.append(await asyncio.wait_for(handle.next_chunk(), 5))
    return taken


def _from_thread(*chunks: object, handle: RequestHandle) -> None:
    """Deliver `chunks` from another thread, as the engine reader does."""

    def run() -> None:
        for chunk in chunks:
            assert isinstance(chunk, TextChunk | Finished)
            handle.deliver(chunk)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def test_an_attached_sink_takes_the_text_and_the_terminal_still_reaches_the_caller() -> None:
    async def run() -> None:
        handle = _handle()
        handle.bind_loop(asyncio.get_running_loop())
        sink = RecordingSink()
        assert handle.attach_sink(sink)
        _from_thread(TextChunk("Once"), TextChunk(" upon"), _done(), handle=handle)
        assert await _drain(handle) == [_done()]
        assert sink.written == ["Once", " upon"]
        assert sink.closed == 1
        assert handle.done

    asyncio.run(run())


def test_a_sink_is_not_attached_while_a_chunk_is_on_its_way_to_the_caller() -> None:
    async def run() -> None:
        handle = _handle()
        handle.bind_loop(asyncio.get_running_loop())
        _from_thread(TextChunk("first"), handle=handle)
        sink = RecordingSink()
        # Delivered but not taken: the sink's writes would overtake it on the wire.
        assert not handle.attach_sink(sink)
        assert await handle.next_chunk() == TextChunk("first")
        assert handle.attach_sink(sink)
        _from_thread(TextChunk("second"), _done(), handle=handle)
        assert await _drain(handle) == [_done()]
        assert sink.written == ["second"]

    asyncio.run(run())


def test_no_sink_after_the_terminal_and_only_one_at_a_time() -> None:
    async def run() -> None:
        handle = _handle()
        handle.bind_loop(asyncio.get_running_loop())
        first = RecordingSink()
        assert handle.attach_sink(first)
        assert not handle.attach_sink(RecordingSink())
        _from_thread(_done(), handle=handle)
        await _drain(handle)
        assert not handle.attach_sink(RecordingSink())
        assert first.closed == 1

    asyncio.run(run())


def test_a_refusing_sink_hands_that_chunk_and_all_later_ones_to_the_caller_in_order() -> None:
    async def run() -> None:
        handle = _handle()
        handle.bind_loop(asyncio.get_running_loop())
        sink = RecordingSink(capacity=2)
        assert handle.attach_sink(sink)
        texts = [TextChunk(f"t{i}") for i in range(5)]
        _from_thread(*texts, _done(), handle=handle)
        assert await _drain(handle) == [*texts[2:], _done()]
        assert sink.written == ["t0", "t1"]
        assert sink.closed == 1  # closed when it refused, not again at the terminal

    asyncio.run(run())


def test_text_with_log_probabilities_never_goes_to_the_sink() -> None:
    async def run() -> None:
        handle = _handle()
        handle.bind_loop(asyncio.get_running_loop())
        sink = RecordingSink()
        assert handle.attach_sink(sink)
        scored = TextChunk("x", (TokenLogprob(piece=(120,), logprob=-0.5),))
        _from_thread(TextChunk("plain"), scored, TextChunk("after"), _done(), handle=handle)
        assert await _drain(handle) == [scored, TextChunk("after"), _done()]
        assert sink.written == ["plain"]
        assert sink.closed == 1

    asyncio.run(run())
