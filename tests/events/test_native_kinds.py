"""The native kind table: the reference mapping, the per-kind rules, and the generated doc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.native_kinds import (
    KINDS_SHARING_AN_EVENT,
    NATIVE_KINDS,
    Handling,
    NativeKind,
    NativeKindSpec,
    load_phase,
    markdown_table,
    spec_of_kind,
)
from skippyctl.events.reasons import DeliveryClass, ReasonCode

DOC = Path(__file__).resolve().parents[2] / "docs" / "NATIVE_KINDS.md"
_E = EventId

# skippy-facts.md "Native kind → event id" (100 and up), and the model-open family (1-5).
REFERENCE: dict[int, EventId] = {
    1: _E.MODEL_LOAD_STARTED,
    2: _E.MODEL_LOAD_PROGRESS,
    3: _E.BACKEND_DEVICE_SELECTED,
    4: _E.NATIVE_MODEL_LOAD_COMPLETED,
    5: _E.MODEL_LOAD_FAILED,
    100: _E.MODEL_LOAD_PHASE_CHANGED,
    101: _E.MODEL_MEMORY_ALLOCATION_SUMMARY,
    102: _E.MODEL_LOAD_PHASE_CHANGED,
    103: _E.MODEL_LOAD_PHASE_CHANGED,
    104: _E.MODEL_LOAD_PHASE_CHANGED,
    200: _E.KV_CACHE_INITIALIZATION_COMPLETED,
    201: _E.CACHE_PRESSURE_CROSSED,
    202: _E.CACHE_PRESSURE_CLEARED,
    203: _E.CONTEXT_CAPACITY_APPROACHING_LIMIT,
    204: _E.CONTEXT_EXHAUSTED,
    300: _E.BACKEND_INITIALIZATION_COMPLETED,
    301: _E.DEVICE_READY,
    302: _E.DEVICE_DEGRADED,
    303: _E.DEVICE_UNAVAILABLE,
    304: _E.DEVICE_RECOVERED,
    305: _E.DEVICE_LOST,
    306: _E.RESOURCE_ALLOCATION_COMPLETED,
    307: _E.OUT_OF_MEMORY_CONDITION,
    308: _E.BACKEND_FALLBACK_ACTIVATED,
    400: _E.WARNING_RAISED,
    401: _E.WARNING_CLEARED,
    402: _E.RECOVERABLE_NATIVE_FAILURE,
    403: _E.FATAL_NATIVE_FAILURE,
    404: _E.INVARIANT_PROTOCOL_VIOLATION,
    500: _E.UNLOAD_STARTED,
    501: _E.UNLOAD_COMPLETED,
    502: _E.UNLOAD_FAILED,
    503: _E.FORCED_UNLOAD,
    504: _E.SESSION_DRAINING_STARTED,
}


def test_every_kind_has_one_row_in_header_order_with_the_reference_event() -> None:
    assert [spec.kind for spec in NATIVE_KINDS] == list(NativeKind)
    assert {int(spec.kind): spec.event for spec in NATIVE_KINDS} == REFERENCE


def test_the_rules_per_kind() -> None:
    def kinds(handling: Handling) -> set[int]:
        return {int(s.kind) for s in NATIVE_KINDS if s.handling is handling}

    assert kinds(Handling.RECONCILED_TERMINAL) == {4, 5}
    assert kinds(Handling.LEVEL_STATE) == {201, 202, 301, 302, 303, 304}
    assert {int(s.kind): s.reason for s in NATIVE_KINDS if s.reason is not None} == {
        204: ReasonCode.CONTEXT_EXHAUSTED,
        303: ReasonCode.DEVICE_UNAVAILABLE,
        307: ReasonCode.OUT_OF_MEMORY,
    }
    assert {int(s.kind) for s in NATIVE_KINDS if s.reason_from_failure_code} == {5, 305, 403, 502}
    assert {int(k) for k in KINDS_SHARING_AN_EVENT} == {100, 102, 103, 104}


def test_delivery_is_the_catalogs_and_only_warnings_are_diagnostic() -> None:
    by_class: dict[DeliveryClass, set[int]] = {}
    for spec in NATIVE_KINDS:
        by_class.setdefault(spec.delivery, set()).add(int(spec.kind))
    assert by_class[DeliveryClass.PROGRESS] == {2}
    assert by_class[DeliveryClass.DIAGNOSTIC] == {400, 401, 402}
    assert DeliveryClass.DEBUG not in by_class


def test_load_phases_for_the_dashboard() -> None:
    assert {int(s.kind): s.load_phase for s in NATIVE_KINDS if s.load_phase} == {
        100: "loading",
        101: "allocating mem",
        102: "offloading",
        103: "tokenizer ready",
        104: "aux components",
    }
    assert load_phase(103) == "tokenizer ready"
    assert load_phase(1) is None  # not a phase kind
    assert load_phase(9999) is None  # unknown to this host
    assert spec_of_kind(9999) is None
    assert spec_of_kind(201) == NATIVE_KINDS[11]


def test_a_row_is_checked_when_it_is_written() -> None:
    with pytest.raises(ValueError, match="fixed reason or one from failure_code"):
        NativeKindSpec(
            NativeKind.UNLOAD_FAILED,
            EventId.UNLOAD_FAILED,
            reason=ReasonCode.UNKNOWN_FAILURE,
            reason_from_failure_code=True,
        )
    with pytest.raises(ValueError, match="phase column"):
        NativeKindSpec(
            NativeKind.MODEL_LOAD_PHASE_CHANGED,
            EventId.MODEL_LOAD_PHASE_CHANGED,
            load_phase="x" * 16,
        )


def test_docs_native_kinds_is_the_generated_table() -> None:
    """Regenerate with the command in docs/NATIVE_KINDS.md after changing the table."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"<!-- native-kinds:begin -->\n(.*?)<!-- native-kinds:end -->", text, re.S)
    assert found is not None, "docs/NATIVE_KINDS.md lost its markers"
    assert found.group(1) == markdown_table()
