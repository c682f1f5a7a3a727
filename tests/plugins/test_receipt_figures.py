"""Every figure of GenerationFigures reaches a plugin's receipt unchanged (a test over the
figures table: a figure added to the type is followed too): through the link, the wire and a
real sidecar to a Python plugin (``PluginReceipt.figures``, and the struct fields the table maps),
through the in-process adapter, and into the C struct a C plugin gets."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import FIGURES, GenerationFigures
from skippyctl.plugins.api import (
    ABI_RECEIPT_FIELDS,
    BasePlugin,
    PluginReceipt,
    RequestIds,
    StopReasonCode,
    receipt_fields,
    receipt_from_fields,
)
from skippyctl.plugins.inprocess import InProcessPlugin
from skippyctl.plugins.sidecar import receipt_struct
from tests.events.figure_values import every_figure_set
from tests.plugins.conftest import LinkFactory


def _abi_value(value: float | None) -> float | None:
    """A figure as the struct holds it, read back (None ↔ NaN)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _assert_carries(receipt: PluginReceipt, figures: GenerationFigures) -> None:
    assert receipt.stop_reason is StopReasonCode.LENGTH
    assert receipt.figures == figures
    for figure in FIGURES:
        if figure.plugin_abi is not None:
            value = getattr(receipt, figure.plugin_abi)
            assert _abi_value(value) == getattr(figures, figure.name), figure.name


def test_every_figure_reaches_a_python_plugin_in_a_sidecar(
    make_link: LinkFactory, plugin_env: dict[str, str]
) -> None:
    figures = every_figure_set()
    link = make_link(["receipt-recorder"])
    link.begin("r", None, [1, 2, 3], 0)
    link.commit("r", [4])
    link.finish("r", StopReason.LENGTH, figures)
    link.close()  # the sidecar finishes its queue before it exits
    (line,) = Path(plugin_env["SKIPPY_PLUGIN_RECORD"]).read_text().splitlines()
    recorded: dict[str, Any] = json.loads(line)
    assert recorded["stop_reason"] == StopReasonCode.LENGTH
    assert GenerationFigures(**recorded.pop("figures")) == figures
    for figure in FIGURES:
        if figure.plugin_abi is not None:
            assert recorded[figure.plugin_abi] == getattr(figures, figure.name), figure.name


class _Keeper(BasePlugin):
    def __init__(self) -> None:
        self.receipts: list[PluginReceipt] = []

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        self.receipts.append(receipt)


def test_every_figure_reaches_an_in_process_plugin() -> None:
    figures = every_figure_set()
    keeper = _Keeper()
    plugins = InProcessPlugin(keeper, n_vocab=100)
    plugins.begin("r", None, [1], 0)
    plugins.finish("r", StopReason.LENGTH, figures)
    (receipt,) = keeper.receipts
    _assert_carries(receipt, figures)


@pytest.mark.parametrize("unmeasured", [False, True])
def test_the_c_struct_holds_every_figure_it_has_a_field_for(unmeasured: bool) -> None:
    figures = every_figure_set()
    if unmeasured:  # a measure not taken is NaN in the struct
        figures = GenerationFigures(**{f.name: 0 if f.count else None for f in FIGURES})
    receipt = PluginReceipt.of(StopReasonCode.LENGTH, figures)
    struct = receipt_struct(receipt)
    assert struct.stop_reason == StopReasonCode.LENGTH
    for figure in FIGURES:
        if figure.plugin_abi is not None:
            value = getattr(struct, figure.plugin_abi)
            assert _abi_value(value) == getattr(figures, figure.name), figure.name
    assert {f.plugin_abi for f in FIGURES if f.plugin_abi} == set(ABI_RECEIPT_FIELDS)


def test_the_abi_order_helpers_keep_their_contract() -> None:
    """``receipt_fields`` / ``receipt_from_fields`` (public, ABI order) agree with the table."""
    figures = every_figure_set()
    abi_only = GenerationFigures(
        **{f.name: getattr(figures, f.name) for f in FIGURES if f.plugin_abi is not None}
    )
    receipt = PluginReceipt.of(StopReasonCode.LENGTH, abi_only)
    flat = {name: getattr(receipt, name) for name in ABI_RECEIPT_FIELDS}
    fields = receipt_fields({"stop_reason": "length", **flat})
    assert receipt_from_fields(fields) == receipt
