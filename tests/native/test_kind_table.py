"""The native kind table agrees with the C layer: the kinds the trampoline knows are the table's,
and each travels in the ring its delivery class names (real library, real trampoline)."""

from __future__ import annotations

import pytest

from skippyctl.events.native_kinds import NATIVE_KINDS, NativeKind, NativeKindSpec
from skippyctl.events.reasons import DeliveryClass
from skippyctl.native import EngineAdapter, SharedIngress, abi
from tests.native.helpers import drain_records, emit, make_event

LANE_OF: dict[DeliveryClass, abi.Lane] = {
    DeliveryClass.TERMINAL: abi.Lane.TERMINAL,
    DeliveryClass.STATE_TRANSITION: abi.Lane.TERMINAL,
    DeliveryClass.PROGRESS: abi.Lane.PROGRESS,
    DeliveryClass.DIAGNOSTIC: abi.Lane.DIAGNOSTIC,
}


def test_the_abi_kind_enum_is_the_tables() -> None:
    assert abi.Kind is NativeKind


@pytest.mark.parametrize("spec", NATIVE_KINDS, ids=lambda spec: spec.kind.name)
def test_each_kind_arrives_known_in_the_ring_of_its_delivery_class(
    adapter: EngineAdapter, ingress: SharedIngress, spec: NativeKindSpec
) -> None:
    emit(adapter, make_event(kind=spec.kind, progress_current=1))
    [fact] = drain_records(ingress)
    assert fact.kind == spec.kind
    assert not fact.unknown_kind
    assert fact.lane == LANE_OF[spec.delivery]


@pytest.mark.parametrize("kind", [0, 6, 99, 105, 199, 205, 299, 309, 399, 405, 499, 505, 9999])
def test_kinds_outside_the_table_are_unknown_to_the_trampoline(
    adapter: EngineAdapter, ingress: SharedIngress, kind: int
) -> None:
    emit(adapter, make_event(kind=kind))
    [fact] = drain_records(ingress)
    assert fact.unknown_kind
    assert fact.lane == abi.Lane.DIAGNOSTIC
