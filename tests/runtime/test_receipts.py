"""The receipt book and how a receipt is made from a request's terminal (no engine runs)."""

from __future__ import annotations

import pytest

from skippyctl.events.envelope import LogicalId
from skippyctl.events.figures import GenerationFigures
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.receipts import ReceiptBook, receipt_of
from skippyctl.runtime.requests import Finished, GenerationParams, RequestHandle


def _handle(
    request: str, received_ns: int = 1_000_000, admitted_ns: int | None = None
) -> RequestHandle:
    handle = RequestHandle(
        request_id=LogicalId(request),
        model_id=LogicalId("tiny"),
        session_id=None,
        params=GenerationParams(prompt="p"),
        received_mono_ns=received_ns,
    )
    handle.admitted_mono_ns = admitted_ns
    return handle


def test_a_receipt_times_the_queue_until_the_engine_got_the_request() -> None:
    figures = GenerationFigures(
        prompt_tokens=5,
        reused_tokens=2,
        generated_tokens=3,
        prefill_ms=1.5,
        ttft_ms=4.0,
        decode_ms=6.0,
    )
    finished = Finished("completed", None, "length", figures)
    receipt = receipt_of(_handle("req-1", 1_000_000, 3_000_000), finished, 21_000_000)
    assert (receipt.queue_ms, receipt.total_ms) == (2.0, 20.0)
    assert receipt.figures is figures  # carried unchanged
    document = receipt.document()
    assert (document["prompt_tokens"], document["reused_tokens"]) == (5, 2)
    assert document["generated_tokens"] == 3
    assert document["ttft_ms"] == 4.0 and document["speculative"]["mode"] == "off"
    never = receipt_of(
        _handle("req-2"), Finished("rejected", ReasonCode.MISSING_ARTIFACT, None), 9_000_000
    )
    assert never.queue_ms == never.total_ms == 8.0
    assert never.document()["reason_code"] == "missing_artifact"


def test_the_book_keeps_the_latest_receipts_and_counts_what_it_evicted() -> None:
    book = ReceiptBook(capacity=2)
    for n in range(3):
        book.record(receipt_of(_handle(f"req-{n}"), Finished("completed", None, "eos"), 2_000_000))
    assert book.get("req-0") is None and book.evicted == 1
    assert book.get("req-2") is not None and len(book) == 2
    assert book.get("nonsense with spaces") is None
    with pytest.raises(ValueError, match="capacity"):
        ReceiptBook(capacity=0)


def test_the_terminal_reaches_the_receipt_hook_once_before_the_caller_sees_it() -> None:
    seen: list[str] = []
    handle = _handle("req-9")
    handle.on_finished = lambda h, f: seen.append(f"hook:{f.outcome}")
    assert handle.deliver(Finished("completed", None, "eos"))
    assert not handle.deliver(Finished("failed", None, None))  # a second terminal is dropped
    chunk = handle.next_chunk_blocking(1.0)
    assert isinstance(chunk, Finished) and seen == ["hook:completed"]


def test_a_receipt_counts_tool_calls_noted_after_the_terminal_and_never_names_them() -> None:
    book = ReceiptBook(capacity=1)
    book.record(receipt_of(_handle("req-t"), Finished("completed", None, "eos"), 2_000_000))
    plain = book.get("req-t")
    assert plain is not None and (plain.document()["tools"], plain.document()["tool_calls"]) == (
        0,
        0,
    )
    book.note_tool_calls("req-t", 2)
    noted = book.get("req-t")
    assert noted is not None and noted.document()["tool_calls"] == 2
    assert noted.total_ms == plain.total_ms  # the rest of the receipt is unchanged
    book.record(receipt_of(_handle("req-u"), Finished("completed", None, "eos"), 2_000_000))
    book.note_tool_calls("req-t", 5)  # evicted: stays evicted
    assert book.get("req-t") is None and len(book) == 1
