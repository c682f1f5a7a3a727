"""Generation receipts: what each request cost and how it ended, kept after it ended.

A :class:`Receipt` is built from a request's terminal (:class:`~skippyctl.runtime.requests.
Finished`, which carries the engine's figures unchanged) and the host's timestamps on its
handle, at the moment the terminal is delivered — the one path every request ends through,
completed, rejected, cancelled, timed out or failed (a request no engine ended has
:data:`~skippyctl.events.figures.NO_FIGURES`). :class:`ReceiptBook` keeps the latest
``capacity`` receipts, oldest evicted first; ``GET /api/runtime/requests/{id}/receipt`` and
``generate --json`` read it.

Contract of a receipt (its ``document`` is the JSON of the API and of ``generate --json``'s
``receipt`` record; fields are added, never renamed):

- identities are the runtime's opaque logical ids (request, model, session); never the client's
  session key, a prompt-derived value, a path or a token id;
- how it ended: ``outcome``, ``reason_code``, ``stop_reason``;
- the host's timings in ms: ``queue_ms`` (the host's queue: received → handed to the engine; a
  request that never got there spent its whole life queued) and ``total_ms`` (received →
  terminal);
- the engine's figures (``skippyctl.events.figures``: ``GenerationFigures``, laid out by its
  table ``FIGURES``): ``prompt_tokens``, ``reused_tokens``, ``generated_tokens``,
  ``engine_wait_ms`` (the engine's wait for a lane, after the host's queue), ``prefill_ms``,
  ``ttft_ms``, ``decode_ms``, the rates, ``shared_decode_steps``, ``max_batch``, and
  ``speculative``: ``mode`` (the load's ``--spec``; ``off``: every count is 0) with the
  proposal counts (``windows``, ``proposed``, ``accepted``, ``rejected``, ``late``,
  ``discarded``); a figure that does not apply is null;
- what a chat request did with tools: ``tools`` (how many tools it offered the chat template; 0
  without tools or with ``tool_choice: none``) and ``tool_calls`` (how many calls were parsed
  from its reply, ``api/tool_calls.py``) — counts only, never a tool's name or arguments. The API
  parses the reply after the terminal, so it adds ``tool_calls`` with
  :meth:`ReceiptBook.note_tool_calls` before it answers the request's last byte;
- ``constraint``: ``grammar`` or ``json_schema`` when a GBNF grammar or a JSON
  ``response_format`` constrained the reply, else null (never the grammar or schema);
- ``written_by``: ``engine`` when the engine wrote the streamed reply's text to the client's
  connection itself (``api/direct_stream.py``), ``host`` when the host wrote the reply.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.events.envelope import LogicalId
from skippyctl.events.figures import NO_FIGURES, GenerationFigures, receipt_figures
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.requests import Finished, RequestHandle

DEFAULT_RECEIPTS: Final = 1024
"""Receipts kept per runtime (a few hundred bytes each)."""


@dataclass(frozen=True, slots=True)
class Receipt:
    request_id: LogicalId
    model_id: LogicalId
    session_id: LogicalId | None
    outcome: str
    reason_code: ReasonCode | None
    stop_reason: str | None
    queue_ms: float
    """The host's queue: received → handed to the engine (or → the terminal, if never)."""
    total_ms: float
    """Received → the terminal."""
    spec_mode: str = "off"
    figures: GenerationFigures = NO_FIGURES
    """The engine's figures, as its terminal carried them."""
    # -- tools
    tools: int = 0
    """Tools the request offered the chat template (0 without tools or with tool_choice none)."""
    tool_calls: int = 0
    """Tool calls parsed from the reply (0 when none were, or the reply was not parsed)."""
    # -- sampling
    constraint: str | None = None
    """``grammar`` or ``json_schema`` when one constrained the reply (never its text)."""
    written_by: str = "host"
    """``engine`` when the engine wrote the streamed text to the client itself, else ``host``."""

    def document(self) -> dict[str, Any]:
        return {
            "request_id": str(self.request_id),
            "model_id": str(self.model_id),
            "session_id": None if self.session_id is None else str(self.session_id),
            "outcome": self.outcome,
            "reason_code": None if self.reason_code is None else self.reason_code.value,
            "stop_reason": self.stop_reason,
            "queue_ms": self.queue_ms,
            "total_ms": self.total_ms,
            **receipt_figures(self.figures, self.spec_mode),
            "tools": self.tools,
            "tool_calls": self.tool_calls,
            "constraint": self.constraint,
            "written_by": self.written_by,
        }


def _ms(start_ns: int, end_ns: int) -> float:
    return round(max(0, end_ns - start_ns) / 1e6, 3)


def receipt_of(handle: RequestHandle, finished: Finished, ended_mono_ns: int) -> Receipt:
    """The receipt of ``handle``, which ended with ``finished`` at ``ended_mono_ns``."""
    admitted = handle.admitted_mono_ns
    return Receipt(
        request_id=handle.request_id,
        model_id=handle.model_id,
        session_id=handle.session_id,
        outcome=finished.outcome,
        reason_code=finished.reason,
        stop_reason=finished.stop_reason,
        queue_ms=_ms(handle.received_mono_ns, ended_mono_ns if admitted is None else admitted),
        total_ms=_ms(handle.received_mono_ns, ended_mono_ns),
        spec_mode=finished.spec_mode,
        figures=finished.figures,
        tools=len(handle.params.tools or ()),
        constraint=handle.params.constraint,
        written_by=finished.written_by,
    )


class ReceiptBook:
    """The latest receipts by request id. Thread-safe; ``record`` is O(1) under one lock."""

    def __init__(self, capacity: int = DEFAULT_RECEIPTS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._receipts: OrderedDict[str, Receipt] = OrderedDict()
        """By request id (a LogicalId is a str: a plain string looks it up)."""
        self.evicted = 0

    def record(self, receipt: Receipt) -> None:
        with self._lock:
            self._receipts[receipt.request_id] = receipt
            self._receipts.move_to_end(receipt.request_id)
            while len(self._receipts) > self.capacity:
                self._receipts.popitem(last=False)
                self.evicted += 1

    def note_tool_calls(self, request_id: str, count: int) -> None:
        """Record how many tool calls were parsed from the reply of ``request_id`` (a receipt
        already evicted stays evicted)."""
        with self._lock:
            receipt = self._receipts.get(request_id)
            if receipt is not None:
                self._receipts[request_id] = dataclasses.replace(receipt, tool_calls=count)

    def get(self, request_id: str) -> Receipt | None:
        """The receipt of ``request_id``; None for an unknown, running or evicted request (and
        for a string that cannot be an id)."""
        with self._lock:
            return self._receipts.get(request_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._receipts)
