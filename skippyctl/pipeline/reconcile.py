"""The reconciler: exactly one terminal per operation, decided by authoritative return values.

Rules (spec "Authority"):
- A native terminal (FINISHED / FAILED_HANDLED) is held until the engine's return value arrives.
  The return decides: a native "finished" never overrides a failed return, a native failure never
  overrides a success; a disagreement is counted (`conflicts`) and the event says `reconciled`.
- A missing native terminal (dropped, or an old runtime without events) is filled from the return
  with producer `reconciled`. So is a missing native "started".
- A host cancellation or timeout recorded before the return decides the failure's reason.
- An engine that exits while operations are in flight gives each exactly one terminal with
  `process_crash` (or the timeout/cancellation the host had asked for, or the reason the host
  attributed the crash to: `stage_unavailable` when a stage of its split model is gone).
- Terminals after the first for an operation are dropped and counted (`duplicate_terminals`).
- An engine's observed events (`Observed`: load phases, devices, allocations) pass through in
  order, except those of an operation that already has its terminal.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    NativeStamp,
    Scope,
    make_event,
    settings,
    summaries,
)
from skippyctl.events.reasons import Outcome, Producer, ReasonCode
from skippyctl.pipeline.authority import (
    Authoritative,
    CancelRequested,
    ContextBegun,
    ContextReturned,
    EngineExited,
    LoadBegun,
    LoadReturned,
    Observed,
    OperationBound,
    OperationRejected,
)
from skippyctl.pipeline.native_adapter import AdaptedFact

MAX_OPERATIONS: Final = 4096
HOST_ENGINE_KEY: Final = "host"
"""Operations the host settled itself (refused before any engine existed)."""


@dataclass(slots=True)
class _Operation:
    binding: OperationBound
    started: bool = False
    native_terminal: Event | None = None
    cancel_reason: ReasonCode | None = None
    load_returned: bool = False
    terminal_emitted: bool = False


@dataclass(slots=True)
class ReconcilerCounters:
    conflicts: int = 0
    filled_from_return: int = 0
    duplicate_terminals: int = 0
    crash_terminals: int = 0
    unknown_operations: int = 0


class Reconciler:
    """Owned by the pipeline thread. Every method returns the events to reduce and dispatch."""

    def __init__(self) -> None:
        self._operations: OrderedDict[LogicalId, _Operation] = OrderedDict()
        self._engine_models: dict[str, LogicalId] = {}
        self.counters = ReconcilerCounters()

    def in_flight(self) -> list[LogicalId]:
        return [op for op, track in self._operations.items() if not track.terminal_emitted]

    # -- native facts ---------------------------------------------------------------------------
    def on_native(self, adapted: AdaptedFact) -> list[Event]:
        event = adapted.event
        track = self._operations.get(event.operation_id) if event.operation_id else None
        if track is not None and track.terminal_emitted:
            if adapted.needs_authority:
                self.counters.duplicate_terminals += 1
            return []  # nothing of an ended operation is dispatched after its terminal
        if adapted.needs_authority:
            if track is None:
                self.counters.unknown_operations += 1
                return []
            track.native_terminal = event
            return []
        if track is not None and event.id is EventId.MODEL_LOAD_STARTED:
            if track.started:
                return []
            track.started = True
        return [event]

    # -- authoritative facts --------------------------------------------------------------------
    def model_of_engine(self, engine_key: str) -> LogicalId | None:
        """The model an engine serves (or loads), until its exit is reconciled."""
        return self._engine_models.get(engine_key)

    def on_authority(self, item: Authoritative) -> list[Event]:
        match item:
            case OperationBound():
                self._operations[item.operation_id] = _Operation(item)
                if item.engine_key != HOST_ENGINE_KEY:
                    self._engine_models[item.engine_key] = item.model_id
                while len(self._operations) > MAX_OPERATIONS:
                    self._operations.popitem(last=False)
                return []
            case LoadBegun():
                return self._load_begun(item)
            case LoadReturned():
                return self._load_returned(item)
            case ContextBegun():
                return self._context_begun(item)
            case ContextReturned():
                return self._context_returned(item)
            case CancelRequested():
                track = self._operations.get(item.operation_id)
                if track is not None and track.cancel_reason is None:
                    track.cancel_reason = item.reason
                return []
            case OperationRejected():
                track = self._operations.get(item.operation_id)
                if track is None:
                    return []
                return self._terminal(track, self._failure_event(track, item.reason, None))
            case EngineExited():
                return self._engine_exited(item)
            case Observed():
                # Passed on in order; nothing of an operation is dispatched after its terminal.
                operation = item.event.operation_id
                track = self._operations.get(operation) if operation is not None else None
                return [] if track is not None and track.terminal_emitted else [item.event]

    def _load_begun(self, item: LoadBegun) -> list[Event]:
        track = self._operations.get(item.operation_id)
        if track is None or track.started or track.terminal_emitted:
            return []
        track.started = True
        return [
            make_event(
                EventId.MODEL_LOAD_STARTED,
                Producer.RECONCILED,
                operation_id=track.binding.operation_id,
                scope=Scope(model_id=track.binding.model_id),
            )
        ]

    def _load_returned(self, item: LoadReturned) -> list[Event]:
        track = self._operations.get(item.operation_id)
        if track is None or track.terminal_emitted or track.load_returned:
            self.counters.duplicate_terminals += track is not None
            return []
        track.load_returned = True
        native = track.native_terminal
        native_success = native is not None and native.id is EventId.NATIVE_MODEL_LOAD_COMPLETED
        if item.ok:
            if native is not None and not native_success:
                self.counters.conflicts += 1
            if native is None:
                self.counters.filled_from_return += 1
            return [
                make_event(
                    EventId.NATIVE_MODEL_LOAD_COMPLETED,
                    Producer.NATIVE if native_success else Producer.RECONCILED,
                    operation_id=track.binding.operation_id,
                    scope=Scope(model_id=track.binding.model_id),
                    native=native.native if native_success and native is not None else None,
                    outcome=Outcome.SUCCESS,
                    duration_ms=item.duration_ms,
                    summaries=summaries(
                        model_size_bytes=item.model_size_bytes,
                        parameters=item.parameters,
                        layers=item.layers,
                        context_train_tokens=item.context_train_tokens,
                        vocab_size=item.vocab_size,
                        files=item.files,
                    ),
                    settings=settings(item.chat_template),
                )
            ]
        if native_success:
            self.counters.conflicts += 1
        if native is None:
            self.counters.filled_from_return += 1
        reason = track.cancel_reason or item.reason or ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE
        stamp = native.native if native is not None and not native_success else None
        return self._terminal(track, self._failure_event(track, reason, stamp, item.duration_ms))

    def _context_begun(self, item: ContextBegun) -> list[Event]:
        track = self._operations.get(item.operation_id)
        if track is None or track.terminal_emitted:
            return []
        return [
            make_event(
                EventId.SERVING_BACKEND_INITIALIZATION_STARTED,
                operation_id=track.binding.operation_id,
                scope=Scope(model_id=track.binding.model_id),
            )
        ]

    def _context_returned(self, item: ContextReturned) -> list[Event]:
        track = self._operations.get(item.operation_id)
        if track is None or track.terminal_emitted:
            return []
        scope = Scope(model_id=track.binding.model_id)
        if item.ok and track.cancel_reason is None:
            track.terminal_emitted = True
            return [
                make_event(
                    EventId.SERVING_BACKEND_INITIALIZATION_COMPLETED,
                    operation_id=track.binding.operation_id,
                    scope=scope,
                    outcome=Outcome.SUCCESS,
                    summaries=summaries(
                        context_tokens=item.context_tokens,
                        lanes=item.lanes,
                        context_tokens_per_lane=item.context_tokens_per_lane,
                        batch_tokens=item.batch_tokens,
                        threads=item.threads,
                        flash_attention=(
                            None if item.flash_attention is None else int(item.flash_attention)
                        ),
                        batch_invariant=(
                            None if item.batch_invariant is None else int(item.batch_invariant)
                        ),
                    ),
                )
            ]
        reason = track.cancel_reason or item.reason or ReasonCode.BACKEND_INITIALIZATION_FAILURE
        events: list[Event] = []
        if not item.ok:
            events.append(
                make_event(
                    EventId.SERVING_BACKEND_INITIALIZATION_FAILED,
                    operation_id=track.binding.operation_id,
                    scope=scope,
                    outcome=Outcome.FAILURE,
                    reason_code=reason,
                )
            )
        return events + self._terminal(track, self._failure_event(track, reason, None))

    def _engine_exited(self, item: EngineExited) -> list[Event]:
        events: list[Event] = []
        model_id = self._engine_models.pop(item.engine_key, None)
        for track in self._operations.values():
            if track.binding.engine_key != item.engine_key or track.terminal_emitted:
                continue
            if item.crashed:
                self.counters.crash_terminals += 1
            reason = track.cancel_reason or (
                (item.reason or ReasonCode.PROCESS_CRASH)
                if item.crashed
                else ReasonCode.INTERNAL_RUNTIME_FAILURE
            )
            events += self._terminal(track, self._failure_event(track, reason, None))
        if item.engine_key == HOST_ENGINE_KEY:
            return events
        events.append(
            make_event(
                EventId.ENGINE_PROCESS_CRASHED if item.crashed else EventId.ENGINE_PROCESS_EXITED,
                Producer.RECONCILED if item.crashed else Producer.RUNTIME,
                scope=Scope(model_id=model_id),
                outcome=Outcome.FAILURE if item.crashed else Outcome.SUCCESS,
                reason_code=(item.reason or ReasonCode.PROCESS_CRASH) if item.crashed else None,
                summaries=summaries(exit_status=item.exit_status, exit_signal=item.exit_signal),
            )
        )
        return events

    # -- helpers --------------------------------------------------------------------------------
    def _terminal(self, track: _Operation, event: Event) -> list[Event]:
        if track.terminal_emitted:
            self.counters.duplicate_terminals += 1
            return []
        track.terminal_emitted = True
        return [event]

    @staticmethod
    def _failure_event(
        track: _Operation,
        reason: ReasonCode,
        stamp: NativeStamp | None,
        duration_ms: float | None = None,
    ) -> Event:
        cancelled = reason is ReasonCode.CANCELLATION
        return make_event(
            EventId.MODEL_LOAD_CANCELLED if cancelled else EventId.MODEL_LOAD_FAILED,
            Producer.NATIVE if stamp is not None else Producer.RECONCILED,
            operation_id=track.binding.operation_id,
            scope=Scope(model_id=track.binding.model_id),
            native=stamp,
            outcome=Outcome.CANCELLED if cancelled else Outcome.FAILURE,
            reason_code=reason,
            duration_ms=duration_ms,
        )
