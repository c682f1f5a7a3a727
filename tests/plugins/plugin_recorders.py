"""A Python plugin that records what it is given, registered as an entry point by
tests/plugins/conftest.py and loaded in a real sidecar."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

from skippyctl.plugins.api import (
    ActivationContext,
    BasePlugin,
    PluginReceipt,
    ProposalOutcome,
    ProposalQuery,
    RequestIds,
)


def _json_number(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


class ReceiptRecorder(BasePlugin):
    """Each finish's receipt as one JSON line in ``$SKIPPY_PLUGIN_RECORD``: the struct fields
    (NaN as null) and, under ``figures``, every figure by its name."""

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        fields = {
            f.name: _json_number(getattr(receipt, f.name))
            for f in dataclasses.fields(receipt)
            if f.name != "figures"
        }
        fields["figures"] = dataclasses.asdict(receipt.figures)
        with open(os.environ["SKIPPY_PLUGIN_RECORD"], "a", encoding="utf-8") as record:
            record.write(json.dumps(fields) + "\n")


class ContractRecorder(BasePlugin):
    """Its activation and every outcome as JSON lines in ``$SKIPPY_PLUGIN_RECORD``
    (``{"activate": {...}}``, ``{"outcome": {...}}``); proposes ``[1]`` for every query."""

    def _write(self, record: dict[str, object]) -> None:
        with open(os.environ["SKIPPY_PLUGIN_RECORD"], "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    def activate(self, context: ActivationContext) -> None:
        self._write({"activate": dataclasses.asdict(context)})

    def propose(self, query: ProposalQuery) -> list[int] | None:
        return [1]

    def proposal_outcome(self, ids: RequestIds, outcome: ProposalOutcome) -> None:
        self._write({"outcome": dataclasses.asdict(outcome), "request": ids.request})

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        self._write({"finish": ids.request})
