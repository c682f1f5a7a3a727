"""Authoritative facts from the engine's return values (the control channel, not the ring).

These are not events: the reconciler turns them, together with native facts, into exactly one
terminal per operation. They travel in the engine's ordered inbox, after a final drain of that
engine's ring, so every native fact an engine wrote before returning is seen first.
"""

from __future__ import annotations

from dataclasses import dataclass

from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import ReasonCode


@dataclass(frozen=True, slots=True)
class OperationBound:
    """The host started an operation: ties the native u64 to logical ids."""

    engine_key: str
    operation_id: LogicalId
    native_operation: int
    model_id: LogicalId


@dataclass(frozen=True, slots=True)
class LoadBegun:
    operation_id: LogicalId


@dataclass(frozen=True, slots=True)
class LoadReturned:
    """llama_model_load_from_file returned: a model (ok) or NULL."""

    operation_id: LogicalId
    ok: bool
    reason: ReasonCode | None = None
    model_size_bytes: int | None = None
    parameters: int | None = None
    duration_ms: float | None = None
    layers: int | None = None
    context_train_tokens: int | None = None
    vocab_size: int | None = None
    files: int | None = None
    """GGUF files the load opened (a split set's parts, else 1)."""
    chat_template: tuple[tuple[str, str | bool], ...] = ()
    """Which chat template serves (``source``, ``sha256``, ``tool_use``): stated in the load's
    completed event and the model's state."""


@dataclass(frozen=True, slots=True)
class ContextBegun:
    operation_id: LogicalId


@dataclass(frozen=True, slots=True)
class ContextReturned:
    """llama_init_from_model returned: a usable context (ok) or NULL."""

    operation_id: LogicalId
    ok: bool
    context_tokens: int | None = None
    lanes: int | None = None
    reason: ReasonCode | None = None
    context_tokens_per_lane: int | None = None
    batch_tokens: int | None = None
    """The context's n_batch: the most tokens one decode call takes."""
    threads: int | None = None
    """The context's n_threads: the threads that decode for it."""
    flash_attention: bool | None = None
    """Whether the context uses flash attention; None when llama.cpp chose."""
    batch_invariant: bool | None = None
    """Whether a row decodes the same whatever is beside it (engine/kernels.py)."""


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """The host asked an operation to stop; `reason` is cancellation or timeout."""

    operation_id: LogicalId
    reason: ReasonCode


@dataclass(frozen=True, slots=True)
class OperationRejected:
    """The host refused an operation before any engine work (pre-checks, configuration)."""

    operation_id: LogicalId
    reason: ReasonCode


@dataclass(frozen=True, slots=True)
class EngineExited:
    """The engine process ended; `crashed` when it was not asked to stop."""

    engine_key: str
    crashed: bool
    exit_status: int | None
    exit_signal: int | None
    reason: ReasonCode | None = None
    """Why it crashed when the host could tell (``stage_unavailable``: a stage of its split
    model is gone); None: ``process_crash``."""


@dataclass(frozen=True, slots=True)
class Observed:
    """An event the engine observed (a load phase, a device, an allocation), queued with the
    engine's return values so it is reduced in order with them and after its ring's facts: a
    phase sent before ``load_returned`` is reduced while the model still loads."""

    event: Event


Authoritative = (
    OperationBound
    | LoadBegun
    | LoadReturned
    | ContextBegun
    | ContextReturned
    | CancelRequested
    | OperationRejected
    | EngineExited
    | Observed
)
