"""The dashboard names a native load phase through the native kind table (no kind numbers of
its own)."""

from __future__ import annotations

import re
from pathlib import Path

from skippy_tui.store import phase_of
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Scope, StateChange, make_event, summaries
from skippyctl.events.native_kinds import NATIVE_KINDS, NativeKind

ROOT = Path(__file__).resolve().parents[2]


def test_each_phase_kind_of_a_phase_change_shows_its_phase() -> None:
    shown = {
        int(spec.kind): phase_of(
            make_event(
                EventId.MODEL_LOAD_PHASE_CHANGED,
                scope=Scope(),
                summaries=summaries(native_kind=int(spec.kind)),
            )
        )
        for spec in NATIVE_KINDS
        if spec.event is EventId.MODEL_LOAD_PHASE_CHANGED
    }
    assert shown == {
        NativeKind.MODEL_LOAD_PHASE_CHANGED: "loading",
        NativeKind.MODEL_LOAD_TENSORS_OFFLOADED: "offloading",
        NativeKind.MODEL_LOAD_TOKENIZER_READY: "tokenizer ready",
        NativeKind.MODEL_LOAD_AUX_COMPONENT_READY: "aux components",
    }


def test_a_phase_change_without_a_known_kind_is_plain_loading() -> None:
    plain = make_event(EventId.MODEL_LOAD_PHASE_CHANGED, scope=Scope())
    unknown = make_event(
        EventId.MODEL_LOAD_PHASE_CHANGED, scope=Scope(), summaries=summaries(native_kind=9999)
    )
    assert phase_of(plain) == phase_of(unknown) == "loading"


def test_the_store_keeps_no_native_kind_table_of_its_own() -> None:
    source = (ROOT / "skippy_tui" / "store.py").read_text(encoding="utf-8")
    assert re.search(r"\b(10[0-4])\s*:", source) is None


def test_a_phase_the_engine_observed_is_shown_by_its_name() -> None:
    for phase in ("weights loaded", "allocating ctx", "context ready"):
        observed = make_event(
            EventId.MODEL_LOAD_PHASE_CHANGED, scope=Scope(), state=StateChange(None, phase)
        )
        assert phase_of(observed) == phase
