"""Native facts → typed domain events.

Enum values stay raw until here. What each kind becomes (event id, reconciled terminal, level
state, reason, `native_kind` summary) is read from the native kind table
(`skippyctl.events.native_kinds`); every lookup here, the numpy ones included, derives from it.
Each fact is correlated to its logical operation and model through the binding the host
registered when it started the operation (`OperationBound`); per-operation sequence evidence
(first, contiguous, gap, duplicate/out-of-order) is computed here from the native sequence
numbers. A gap that the ring's own coalescing does not explain is recorded as its
own diagnostic event. Unknown kinds and categories are counted, never raised.

`adapt_batch` is the pipeline's path over a drained batch's numpy columns: the same per-operation
evidence, computed per batch, and the diagnostic class folded (ARCHITECTURE §3: diagnostics are
droppable, sampled, counted) — per operation and kind, the first diagnostic fact of a batch
becomes an event whose `count` summary says how many facts it stands for; the others are counted
as `sampled`. Sequence gaps are reported once per operation per batch (`count` = gaps). Level
states (the table's `level_state` kinds: cache pressure crossed/cleared, device ready/degraded/
unavailable/recovered) are duplicate-coalesced (spec: "State transitions: … duplicate
coalescing"): a fact that repeats the operation's previous fact in the batch — same kind,
contiguous sequence, so nothing in between was lost — is folded into the first of its run, whose
`count` summary says how many facts it stands for, and counted as `coalesced`. Every transition
between different states, and the state after the batch, are kept; the reducer ignored such
repeats anyway (`duplicate_transitions`). Terminal facts, other state facts and progress facts
(progress is already latest-value coalesced in the ring) each become an event. So a diagnostic
storm or a re-reported state costs the pipeline per batch, not per fact.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    NativeStamp,
    NumericSummary,
    Progress,
    Scope,
    SequenceEvidence,
    make_event,
    summaries,
)
from skippyctl.events.native_kinds import (
    KINDS_SHARING_AN_EVENT,
    NATIVE_KINDS,
    Handling,
    NativeKindSpec,
)
from skippyctl.events.reasons import Producer, ProgressUnit, ReasonCode
from skippyctl.native.abi import Category, FailureCode, Lane
from skippyctl.native.abi import ProgressUnit as NativeProgressUnit
from skippyctl.pipeline.authority import OperationBound


class NativeFactLike(Protocol):
    """The fields of a drained native record the adapter reads (skippyctl.native.ingress)."""

    @property
    def operation_id(self) -> int: ...
    @property
    def category(self) -> int: ...
    @property
    def kind(self) -> int: ...
    @property
    def sequence(self) -> int: ...
    @property
    def timestamp_mono_ns(self) -> int: ...
    @property
    def progress_current(self) -> int: ...
    @property
    def progress_total(self) -> int: ...
    @property
    def progress_unit(self) -> int: ...
    @property
    def failure_code(self) -> int: ...
    @property
    def detail(self) -> bytes: ...
    @property
    def numeric_summaries(self) -> tuple[int, int, int, int] | None: ...
    @property
    def coalesced_count(self) -> int: ...


class FactColumns(Protocol):
    """A drained batch with numpy columns (skippyctl.native.ingress.FactBatch)."""

    @property
    def operation_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def sequences(self) -> npt.NDArray[np.uint64]: ...
    @property
    def kinds(self) -> npt.NDArray[np.uint32]: ...
    @property
    def categories(self) -> npt.NDArray[np.uint32]: ...
    @property
    def lanes(self) -> npt.NDArray[np.uint32]: ...
    @property
    def coalesced_counts(self) -> npt.NDArray[np.uint64]: ...
    @property
    def timestamps_mono_ns(self) -> npt.NDArray[np.uint64]: ...
    @property
    def progress_units(self) -> npt.NDArray[np.uint32]: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> NativeFactLike: ...


KNOWN_CATEGORIES: Final = frozenset(int(category) for category in Category)

# Every lookup below derives from the native kind table (skippyctl.events.native_kinds).
_SPECS: Final[dict[int, NativeKindSpec]] = {int(spec.kind): spec for spec in NATIVE_KINDS}
# Kinds that report a level (on/off, a health state) rather than an occurrence: a contiguous
# repeat says nothing new. Occurrences (context approaching its limit, exhaustion, OOM, failures)
# are counted by the reducer and never folded.
LEVEL_STATE_KINDS: Final = frozenset(
    kind for kind, spec in _SPECS.items() if spec.handling is Handling.LEVEL_STATE
)
# Kinds whose event id is shared (phase changes): their events carry the native kind.
_TAGGED_KINDS: Final = frozenset(int(kind) for kind in KINDS_SHARING_AN_EVENT)

FAILURE_CODE_TO_REASON: Final[dict[int, ReasonCode]] = {
    FailureCode.NONE: ReasonCode.UNKNOWN_FAILURE,
    FailureCode.INVALID_ARGUMENT: ReasonCode.INVALID_CONFIGURATION,
    FailureCode.IO_ERROR: ReasonCode.ARTIFACT_IO_FAILURE,
    FailureCode.MODEL_ERROR: ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE,
    FailureCode.RUNTIME_ERROR: ReasonCode.INTERNAL_RUNTIME_FAILURE,
    FailureCode.BACKEND_ERROR: ReasonCode.BACKEND_INITIALIZATION_FAILURE,
    FailureCode.CANCELLED: ReasonCode.CANCELLATION,
    FailureCode.INTERNAL_ERROR: ReasonCode.INTERNAL_RUNTIME_FAILURE,
}

PROGRESS_UNITS: Final[dict[int, ProgressUnit]] = {
    NativeProgressUnit.NONE: ProgressUnit.NONE,
    NativeProgressUnit.BYTES: ProgressUnit.BYTES,
    NativeProgressUnit.ITEMS: ProgressUnit.ITEMS,
    NativeProgressUnit.TENSORS: ProgressUnit.TENSORS,
    NativeProgressUnit.STEPS: ProgressUnit.STEPS,
}

_DEVICE_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._:+=-]+")
MAX_TRACKED_OPERATIONS: Final = 4096
# skippy_lane: which ring a record was drained from.
DIAGNOSTIC_LANE: Final = int(Lane.DIAGNOSTIC)
# Lookups by index (the last slot stands for every larger value). np.isin and np.unique are
# avoided on this path: they import numpy.ma (~15 ms) at their first call.
_KIND_IS_KNOWN: Final = np.zeros(max(_SPECS) + 2, dtype=bool)
_KIND_IS_KNOWN[list(_SPECS)] = True
_KIND_LOOKUP_LAST: Final = len(_KIND_IS_KNOWN) - 1
_KIND_IS_LEVEL_STATE: Final = np.zeros_like(_KIND_IS_KNOWN)
_KIND_IS_LEVEL_STATE[list(LEVEL_STATE_KINDS)] = True
# Kinds whose event takes nothing from the record but its kind, sequence and clock (no device,
# no failure code): with no progress unit either, the record is not decoded.
_KIND_IS_PLAIN: Final = np.zeros_like(_KIND_IS_KNOWN)
_KIND_IS_PLAIN[
    [
        kind
        for kind, spec in _SPECS.items()
        if spec.event is not EventId.BACKEND_DEVICE_SELECTED and not spec.reason_from_failure_code
    ]
] = True
_UNIT_IS_NONE: Final = np.ones(max(PROGRESS_UNITS) + 2, dtype=bool)
_UNIT_IS_NONE[
    [unit for unit, mapped in PROGRESS_UNITS.items() if mapped is not ProgressUnit.NONE]
] = False
_UNIT_LOOKUP_LAST: Final = len(_UNIT_IS_NONE) - 1
_CATEGORY_IS_KNOWN: Final = np.zeros(max(KNOWN_CATEGORIES) + 2, dtype=bool)
_CATEGORY_IS_KNOWN[list(KNOWN_CATEGORIES)] = True
_CATEGORY_LOOKUP_LAST: Final = len(_CATEGORY_IS_KNOWN) - 1
_EVIDENCE_BY_CODE: Final = (
    SequenceEvidence.FIRST,
    SequenceEvidence.CONTIGUOUS,
    SequenceEvidence.GAP,
    SequenceEvidence.DUPLICATE_OR_OUT_OF_ORDER,
)
_FIRST, _CONTIGUOUS, _GAP, _DUPLICATE = range(4)


def device_id_from_detail(detail: bytes) -> LogicalId | None:
    """A device's logical id from its ggml name ("CPU", "CUDA0"); bounded and sanitised."""
    text = detail.decode("utf-8", "replace").strip()
    cleaned = _DEVICE_NAME_UNSAFE.sub("_", text).strip("._:+=-")[:32]
    if not cleaned or not cleaned[0].isalnum():
        return None
    return LogicalId(cleaned)


@dataclass(slots=True)
class _Track:
    binding: OperationBound | None
    max_sequence: int = 0


@dataclass(frozen=True, slots=True)
class AdaptedFact:
    """One adapted fact: the event, and whether the reconciler must hold it for authority."""

    event: Event
    needs_authority: bool
    native_kind: int


@dataclass(slots=True)
class AdapterCounters:
    facts: int = 0
    unknown: int = 0
    gaps: int = 0
    duplicates: int = 0
    unbound: int = 0
    sampled: int = 0
    coalesced: int = 0


class NativeAdapter:
    """Stateful per-operation correlation; owned by the pipeline thread only."""

    def __init__(self) -> None:
        self._tracks: OrderedDict[int, _Track] = OrderedDict()
        self.counters = AdapterCounters()

    def bind(self, binding: OperationBound) -> None:
        self._tracks[binding.native_operation] = _Track(binding)
        self._tracks.move_to_end(binding.native_operation)
        while len(self._tracks) > MAX_TRACKED_OPERATIONS:
            self._tracks.popitem(last=False)

    def adapt(self, fact: NativeFactLike) -> list[AdaptedFact]:
        """Turn one fact into zero or more events (a gap adds a diagnostic event)."""
        self.counters.facts += 1
        spec = _SPECS.get(fact.kind)
        if spec is None or fact.category not in KNOWN_CATEGORIES:
            self.counters.unknown += 1
            return []
        track = self._tracks.get(fact.operation_id) if fact.operation_id else None
        if track is None:
            self.counters.unbound += 1
            track = _Track(binding=None)
            if fact.operation_id:
                self._tracks[fact.operation_id] = track
        evidence, expected = self._evidence(track, fact)
        binding = track.binding
        operation_id = binding.operation_id if binding is not None else None
        model_id = binding.model_id if binding is not None else None
        out: list[AdaptedFact] = []
        if evidence is SequenceEvidence.GAP and fact.sequence - expected > fact.coalesced_count:
            self.counters.gaps += 1
            out.append(
                AdaptedFact(
                    make_event(
                        EventId.NATIVE_SEQUENCE_GAP_DETECTED,
                        Producer.NATIVE,
                        operation_id=operation_id,
                        scope=Scope(model_id=model_id),
                        summaries=summaries(
                            expected_sequence=expected, received_sequence=fact.sequence
                        ),
                    ),
                    needs_authority=False,
                    native_kind=fact.kind,
                )
            )
        elif evidence is SequenceEvidence.DUPLICATE_OR_OUT_OF_ORDER:
            self.counters.duplicates += 1
        stamp = NativeStamp(fact.timestamp_mono_ns, fact.sequence, evidence)
        out.append(
            AdaptedFact(
                self._event(spec, fact, stamp, operation_id, Scope(model_id=model_id)),
                needs_authority=spec.handling is Handling.RECONCILED_TERMINAL,
                native_kind=fact.kind,
            )
        )
        return out

    def adapt_batch(
        self, batch: FactColumns, engine_model: LogicalId | None = None
    ) -> list[AdaptedFact]:
        """Adapt a drained batch in (operation, sequence) order; see the module docstring.
        ``engine_model``: the model of the engine whose ring it came from, the scope of facts
        outside any bound operation (a fatal ggml abort while serving)."""
        total = len(batch)
        self.counters.facts += total
        kinds = batch.kinds
        categories = batch.categories
        known = (
            _KIND_IS_KNOWN[np.minimum(kinds, _KIND_LOOKUP_LAST)]
            & _CATEGORY_IS_KNOWN[np.minimum(categories, _CATEGORY_LOOKUP_LAST)]
        )
        rows = np.flatnonzero(known)
        self.counters.unknown += total - int(rows.size)
        if rows.size == 0:
            return []
        operations = batch.operation_ids[rows]
        rows = rows[np.lexsort((batch.sequences[rows], operations))]
        operations = batch.operation_ids[rows]
        # (np.r_ would import numpy.ma, ~15 ms, into the first batch of every host process)
        starts = np.flatnonzero(np.concatenate(([True], operations[1:] != operations[:-1])))
        ends = np.append(starts[1:], rows.size)
        out: list[AdaptedFact] = []
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            self._adapt_group(batch, rows[start:end], int(operations[start]), out, engine_model)
        return out

    def _adapt_group(
        self,
        batch: FactColumns,
        rows: npt.NDArray[np.intp],
        operation: int,
        out: list[AdaptedFact],
        engine_model: LogicalId | None = None,
    ) -> None:
        """One operation's facts of a batch, in sequence order."""
        count = int(rows.size)
        sequences = batch.sequences[rows].astype(np.int64)
        track = self._tracks.get(operation) if operation else None
        if track is None:
            # Counted as `adapt` does: once per new operation, per fact for operation 0.
            self.counters.unbound += 1 if operation else count
            track = _Track(binding=None)
            if operation:
                self._tracks[operation] = track
        if operation:
            codes, expected = self._batch_evidence(track, sequences)
        else:
            # Operation 0 has no track: every fact is a first (as `adapt` does).
            codes = np.zeros(count, dtype=np.int8)
            expected = sequences + 1
        binding = track.binding
        operation_id = binding.operation_id if binding is not None else None
        model_id = binding.model_id if binding is not None else engine_model

        gaps = np.flatnonzero(
            (codes == _GAP) & (sequences - expected > batch.coalesced_counts[rows].astype(np.int64))
        )
        self.counters.gaps += int(gaps.size)
        self.counters.duplicates += int(np.count_nonzero(codes == _DUPLICATE))

        represents = np.ones(count, dtype=np.int64)
        keep = np.ones(count, dtype=bool)
        if count > 1:
            self._fold_repeated_states(batch.kinds[rows], codes, keep, represents)
        diagnostic = np.flatnonzero(batch.lanes[rows] == DIAGNOSTIC_LANE)
        if diagnostic.size > 1:
            diagnostic_kinds = batch.kinds[rows[diagnostic]]
            first, folded = _first_of_each(diagnostic_kinds)
            keep[diagnostic] = False
            keep[diagnostic[first]] = True
            represents[diagnostic[first]] = folded
            self.counters.sampled += int(diagnostic.size - first.size)

        first_gap = int(gaps[0]) if gaps.size else -1
        gap_event = None
        if first_gap >= 0:
            gap_event = self._gap_event(
                batch[int(rows[first_gap])],
                int(expected[first_gap]),
                int(gaps.size),
                operation_id,
                model_id,
            )
        evidence = codes.tolist()
        # Scopes are immutable: the group's facts share one (a device fact adds its device).
        scope = Scope(model_id=model_id)
        kept = np.flatnonzero(keep)
        kept_rows = rows[kept]
        kept_kinds = batch.kinds[kept_rows]
        # Only a fact whose record adds to its kind (progress, a device, a failure code) is
        # decoded; the others' events are built from the columns.
        decode = (
            ~(
                _KIND_IS_PLAIN[np.minimum(kept_kinds, _KIND_LOOKUP_LAST)]
                & _UNIT_IS_NONE[np.minimum(batch.progress_units[kept_rows], _UNIT_LOOKUP_LAST)]
            )
        ).tolist()
        counts = represents.tolist()
        kinds = kept_kinds.tolist()
        stamps = batch.timestamps_mono_ns[kept_rows].tolist()
        fact_sequences = batch.sequences[kept_rows].tolist()
        for slot, position in enumerate(kept.tolist()):
            if gap_event is not None and position >= first_gap:
                out.append(gap_event)
                gap_event = None
            kind = kinds[slot]
            spec = _SPECS[kind]
            stamp = NativeStamp(
                stamps[slot], fact_sequences[slot], _EVIDENCE_BY_CODE[evidence[position]]
            )
            if decode[slot]:
                fact = batch[int(rows[position])]
                event = self._event(spec, fact, stamp, operation_id, scope, counts[position])
            else:
                event = _native_event(spec, kind, stamp, operation_id, scope, counts[position])
            out.append(
                AdaptedFact(
                    event,
                    needs_authority=spec.handling is Handling.RECONCILED_TERMINAL,
                    native_kind=kind,
                )
            )
        if gap_event is not None:
            out.append(gap_event)

    def _fold_repeated_states(
        self,
        kinds: npt.NDArray[np.uint32],
        codes: npt.NDArray[np.int8],
        keep: npt.NDArray[np.bool_],
        represents: npt.NDArray[np.int64],
    ) -> None:
        """Fold contiguous repeats of a level state into the first fact of their run."""
        repeat = np.zeros(kinds.size, dtype=bool)
        repeat[1:] = (
            (kinds[1:] == kinds[:-1])
            & (codes[1:] == _CONTIGUOUS)
            & _KIND_IS_LEVEL_STATE[np.minimum(kinds[1:], _KIND_LOOKUP_LAST)]
        )
        folded = int(np.count_nonzero(repeat))
        if folded == 0:
            return
        heads = np.flatnonzero(~repeat)
        keep[repeat] = False
        represents[heads] = np.diff(np.append(heads, kinds.size))
        self.counters.coalesced += folded

    @staticmethod
    def _batch_evidence(
        track: _Track, sequences: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
        """Per fact (sorted by sequence): evidence code and the sequence that was expected."""
        before = np.empty_like(sequences)
        before[0] = track.max_sequence
        if sequences.size > 1:
            before[1:] = np.maximum(np.maximum.accumulate(sequences)[:-1], track.max_sequence)
        expected = before + 1
        codes = np.full(sequences.size, _CONTIGUOUS, dtype=np.int8)
        codes[sequences > expected] = _GAP
        codes[sequences < expected] = _DUPLICATE
        codes[before == 0] = _FIRST
        track.max_sequence = max(track.max_sequence, int(sequences[-1]))
        return codes, expected

    def _gap_event(
        self,
        fact: NativeFactLike,
        expected: int,
        gaps: int,
        operation_id: LogicalId | None,
        model_id: LogicalId | None,
    ) -> AdaptedFact:
        extra = summaries(count=gaps) if gaps > 1 else ()
        return AdaptedFact(
            make_event(
                EventId.NATIVE_SEQUENCE_GAP_DETECTED,
                Producer.NATIVE,
                operation_id=operation_id,
                scope=Scope(model_id=model_id),
                summaries=summaries(expected_sequence=expected, received_sequence=fact.sequence)
                + extra,
            ),
            needs_authority=False,
            native_kind=fact.kind,
        )

    @staticmethod
    def _evidence(track: _Track, fact: NativeFactLike) -> tuple[SequenceEvidence, int]:
        expected = track.max_sequence + 1
        if track.max_sequence == 0:
            evidence = SequenceEvidence.FIRST
        elif fact.sequence == expected:
            evidence = SequenceEvidence.CONTIGUOUS
        elif fact.sequence > expected:
            evidence = SequenceEvidence.GAP
        else:
            return SequenceEvidence.DUPLICATE_OR_OUT_OF_ORDER, expected
        track.max_sequence = fact.sequence
        return evidence, expected

    @staticmethod
    def _event(
        spec: NativeKindSpec,
        fact: NativeFactLike,
        stamp: NativeStamp,
        operation_id: LogicalId | None,
        scope: Scope,
        represents: int = 1,
    ) -> Event:
        """The fact's event, in `scope` (the operation's model), with its device if it names
        one."""
        unit = PROGRESS_UNITS.get(fact.progress_unit, ProgressUnit.NONE)
        progress = None
        if unit is not ProgressUnit.NONE:
            progress = Progress(fact.progress_current, fact.progress_total or None, unit)
        figures = None
        if spec.event is EventId.BACKEND_DEVICE_SELECTED:
            device_id = device_id_from_detail(fact.detail)
            if device_id is not None:
                scope = Scope(model_id=scope.model_id, device_id=device_id)
            numbers = fact.numeric_summaries
            if numbers is not None:
                figures = summaries(
                    memory_free_bytes=numbers[0],
                    memory_total_bytes=numbers[1],
                    device_type=numbers[2],
                )
        reason = spec.reason
        if spec.reason_from_failure_code:
            reason = FAILURE_CODE_TO_REASON.get(fact.failure_code, ReasonCode.UNKNOWN_FAILURE)
        return _native_event(
            spec, fact.kind, stamp, operation_id, scope, represents, progress, reason, figures
        )


def _native_event(
    spec: NativeKindSpec,
    kind: int,
    stamp: NativeStamp,
    operation_id: LogicalId | None,
    scope: Scope,
    represents: int,
    progress: Progress | None = None,
    reason: ReasonCode | None = None,
    figures: tuple[NumericSummary, ...] | None = None,
) -> Event:
    """A native fact's event. Without `reason`, its kind's; without `figures`, the native kind
    for a kind that shares its event id; a `count` when the event stands for several facts."""
    if figures is None:
        figures = summaries(native_kind=kind) if kind in _TAGGED_KINDS else ()
    if represents > 1:
        figures = figures + summaries(count=represents)
    return make_event(
        spec.event,
        Producer.NATIVE,
        operation_id=operation_id,
        scope=scope,
        native=stamp,
        progress=progress,
        reason_code=reason if reason is not None else spec.reason,
        summaries=figures,
    )


def _first_of_each(
    values: npt.NDArray[np.uint32],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Index of each distinct value's first occurrence, and how often it occurs."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return order[starts], np.diff(np.append(starts, values.size))
