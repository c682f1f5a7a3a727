"""Generation receipts: what each request cost and how it ended, kept after it ended.

A :class:`Receipt` is built from a request's terminal (:class:`~skippyctl.runtime.requests.
Finished`, which carries the engine's own figures when the engine finished it) and the host's
timestamps on its handle, at the moment the terminal is delivered — the one path every request
ends through, completed, rejected, cancelled, timed out or failed. :class:`ReceiptBook` keeps the
latest ``capacity`` receipts, oldest evicted first; ``GET /api/runtime/requests/{id}/receipt``
and ``generate --json`` read it.

Contract of a receipt (its ``document`` is the JSON of the API and of ``generate --json``'s
``receipt`` record; fields are added, never renamed):

- identities are the runtime's opaque logical ids (request, model, session); never the client's
  session key, a prompt-derived value, a path or a token id;
- counts: ``prompt_tokens``, ``reused_tokens`` (prompt tokens whose KV was already there: a
  session's or another request's prefix), ``generated_tokens`` (without an end-of-generation
  token);
- timings in ms: ``queue_ms`` (received → handed to the engine; a request that never got there
  spent its whole life queued), ``prefill_ms``, ``ttft_ms``, ``decode_ms`` (first to last
  sampled token), ``total_ms`` (received → terminal); a figure that does not apply is null;
- ``speculative``: the proposal figures: ``mode`` (``off``: every count is 0; ``ngram``;
  ``plugin``), ``windows`` (steps that verified proposals), ``proposed``, ``accepted``
  (committed, each a decode step saved), ``rejected`` (proposed − accepted: their KV was
  dropped), ``late`` (plugin proposal queries answered after their deadline, dropped unused;
  0 with the built-in n-gram proposer, which answers within the step) and ``discarded``
  (run-ahead proposals, ``--spec-runahead-tokens``, dropped unexecuted after the window before
  them diverged).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from skippyctl.events.envelope import LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.runtime.requests import Finished, RequestHandle

DEFAULT_RECEIPTS: Final = 1024
"""Receipts kept per runtime (a few hundred bytes each)."""


@dataclass(frozen=True, slots=True)
class SpeculativeFigures:
    mode: str = "off"
    windows: int = 0
    """Decode steps in which the request verified proposed tokens."""
    proposed: int = 0
    accepted: int = 0
    rejected: int = 0
    late: int = 0
    """Proposal queries answered after their deadline (their proposals were not used)."""
    discarded: int = 0
    """Run-ahead tokens dropped unexecuted after a verify rejected an earlier window."""


@dataclass(frozen=True, slots=True)
class Receipt:
    request_id: LogicalId
    model_id: LogicalId
    session_id: LogicalId | None
    outcome: str
    reason_code: ReasonCode | None
    stop_reason: str | None
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    queue_ms: float
    prefill_ms: float | None
    ttft_ms: float | None
    decode_ms: float | None
    total_ms: float
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    shared_decode_steps: int
    max_batch: int
    speculative: SpeculativeFigures = field(default_factory=SpeculativeFigures)

    def document(self) -> dict[str, Any]:
        spec = self.speculative
        return {
            "request_id": str(self.request_id),
            "model_id": str(self.model_id),
            "session_id": None if self.session_id is None else str(self.session_id),
            "outcome": self.outcome,
            "reason_code": None if self.reason_code is None else self.reason_code.value,
            "stop_reason": self.stop_reason,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "generated_tokens": self.generated_tokens,
            "queue_ms": self.queue_ms,
            "prefill_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "decode_ms": self.decode_ms,
            "total_ms": self.total_ms,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "shared_decode_steps": self.shared_decode_steps,
            "max_batch": self.max_batch,
            "speculative": {
                "mode": spec.mode,
                "windows": spec.windows,
                "proposed": spec.proposed,
                "accepted": spec.accepted,
                "rejected": spec.rejected,
                "late": spec.late,
                "discarded": spec.discarded,
            },
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
        prompt_tokens=finished.prompt_tokens,
        reused_tokens=finished.reused_tokens,
        generated_tokens=finished.completion_tokens,
        queue_ms=_ms(handle.received_mono_ns, ended_mono_ns if admitted is None else admitted),
        prefill_ms=finished.prefill_ms,
        ttft_ms=finished.ttft_ms,
        decode_ms=finished.decode_ms,
        total_ms=_ms(handle.received_mono_ns, ended_mono_ns),
        prefill_tokens_per_s=finished.prefill_tokens_per_s,
        decode_tokens_per_s=finished.decode_tokens_per_s,
        shared_decode_steps=finished.shared_steps,
        max_batch=finished.max_batch,
        speculative=SpeculativeFigures(
            mode=finished.spec_mode,
            windows=finished.spec_windows,
            proposed=finished.spec_proposed,
            accepted=finished.spec_accepted,
            rejected=finished.spec_proposed - finished.spec_accepted,
            late=finished.spec_late,
            discarded=finished.spec_discarded,
        ),
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

    def get(self, request_id: str) -> Receipt | None:
        """The receipt of ``request_id``; None for an unknown, running or evicted request (and
        for a string that cannot be an id)."""
        with self._lock:
            return self._receipts.get(request_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._receipts)
