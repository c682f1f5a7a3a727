"""The plugin contract of the seeds, through the real link and real sidecars: activation with
the model and ``--plugin-config`` (an 80-byte-vtable plugin keeps working and is never
activated), outcome kinds and discard reasons told to the plugin, a window's ``stopped`` outcome
before the request's finish, and the counters handed over for the engine to send on."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.abi import DiscardReasonCode, OutcomeKindCode, SpecModeCode
from skippyctl.plugins.api import ActivationContext, DiscardReason, OutcomeKind
from tests.plugins.conftest import (
    Built,
    LinkFactory,
    Reports,
    read_activations,
    read_streams,
)

PROMPT = [10, 11, 12, 13, 10, 11]
CONTEXT = ActivationContext("tiny", 1000, 256, 2, "plugin", 8.0, "ngram_max=3 mode=fast")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_every_plugin_is_activated_with_the_model_and_its_config(
    make_link: LinkFactory, built: Built, reports: Reports, plugin_env: dict[str, str]
) -> None:
    record = Path(plugin_env["SKIPPY_PLUGIN_RECORD"])
    # garbage.so fills only the first, 80-byte vtable: never activated, still served
    link = make_link(
        [built.ngram, "contract-recorder", built.faults["garbage"]], activation=CONTEXT
    )
    assert {r.plugin for r in reports.items if r.kind == "loaded"} == {
        "ngram_plugin.so",
        "contract-recorder",
        "garbage.so",
    }
    (c_side,) = read_activations(record)
    assert (c_side.model_id, c_side.n_vocab, c_side.n_ctx_per_lane, c_side.lanes) == (
        "tiny",
        1000,
        256,
        2,
    )
    assert c_side.spec_mode == SpecModeCode.PLUGIN
    assert c_side.config == "ngram_max=3 mode=fast"
    (python_side,) = [r["activate"] for r in _records(record) if "activate" in r]
    assert python_side == {
        "model_id": "tiny",
        "n_vocab": 1000,
        "n_ctx_per_lane": 256,
        "lanes": 2,
        "spec_mode": "plugin",
        "proposal_deadline_ms": 8.0,
        "config": "ngram_max=3 mode=fast",
    }
    link.begin("r", None, PROMPT, 0)
    link.propose({"r": 4})
    assert link.counters()["garbage.so"]["queries"] == 1  # the old-vtable plugin still serves


def test_a_plugin_that_refuses_its_configuration_does_not_load(
    make_link: LinkFactory, built: Built, reports: Reports
) -> None:
    refused = ActivationContext("tiny", 1000, 256, 2, "plugin", 8.0, "refuse")
    link = make_link([built.ngram, "contract-recorder"], activation=refused)
    assert [(r.kind, r.reason) for r in reports.of("ngram_plugin.so")] == [
        ("load_failed", "activate_failed")
    ]
    assert link.counters()["ngram_plugin.so"]["disabled"] == 1
    assert reports.of("contract-recorder", "loaded")  # the other one serves


def test_an_invalid_answer_reaches_the_plugin_as_a_discard_with_its_reason(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str], reports: Reports
) -> None:
    # n_vocab 12: the example plugin's prompt-lookup proposal (ids 10..13) has ids outside it
    link = make_link([built.ngram], n_vocab=12)
    link.begin("r", None, PROMPT, 0)
    assert link.propose({"r": 4}) == {}
    link.finish("r", StopReason.EOS, GenerationFigures(generated_tokens=0))
    link.close()
    counters = link.counters()["ngram_plugin.so"]
    assert counters["discarded_invalid_token_id"] == 1
    assert counters["failures"] == 0 and counters["disabled"] == 0
    (stream,) = read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"])).values()
    assert stream.outcomes == [
        (OutcomeKindCode.DISCARDED, DiscardReasonCode.INVALID_TOKEN_ID, 4, 0)
    ]
    assert stream.finished
    assert reports.of("ngram_plugin.so", "failed") == []


def test_the_last_windows_outcome_comes_before_the_finish(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str]
) -> None:
    link = make_link([built.ngram, "contract-recorder"])
    link.begin("r", None, PROMPT, 0)
    assert link.propose({"r": 4}) == {"r": [12, 13, 10, 11]}
    link.outcome("r", 4, 4, OutcomeKind.FULL_ACCEPT)
    link.commit("r", [12, 13, 10, 11])
    link.propose({"r": 4})
    # the request stopped inside its next window: 2 of 4 accepted, then the stop
    link.outcome("r", 4, 2, OutcomeKind.STOPPED)
    link.finish("r", StopReason.EOS, GenerationFigures(generated_tokens=6))
    # an engine-side discard (a stale run-ahead) is told with its reason
    link.begin("s", None, PROMPT, 0)
    link.outcome("s", 3, 0, OutcomeKind.DISCARDED, DiscardReason.POSITION_MISMATCH)
    link.abort("s", "cancelled")
    link.close()
    record = Path(plugin_env["SKIPPY_PLUGIN_RECORD"])
    c_streams = list(read_streams(record).values())  # asserts nothing follows a finish
    assert c_streams[0].outcomes == [
        (OutcomeKindCode.FULL_ACCEPT, 0, 4, 4),
        (OutcomeKindCode.STOPPED, 0, 4, 2),
    ]
    assert c_streams[0].finished
    assert c_streams[1].outcomes == [
        (OutcomeKindCode.DISCARDED, DiscardReasonCode.POSITION_MISMATCH, 3, 0)
    ]
    python_side = [r for r in _records(record) if "outcome" in r or "finish" in r]
    kinds = [r["outcome"]["kind"] if "outcome" in r else "finish" for r in python_side]
    assert kinds == ["full_accept", "stopped", "finish", "discarded"]
    # no answer of the plugin was used for "s": the engine's discard is not counted on it
    assert link.counters()["ngram_plugin.so"]["discarded_position_mismatch"] == 0


def test_counters_are_handed_over_while_they_change(make_link: LinkFactory, built: Built) -> None:
    seen: list[tuple[str, dict[str, int]]] = []
    changed = threading.Event()

    def on_counters(plugin: str, counts: Mapping[str, int]) -> None:
        seen.append((plugin, dict(counts)))
        if counts["delivered"] >= 3:
            changed.set()

    link = make_link([built.ngram], on_counters=on_counters, counters_interval_s=0.05)
    link.begin("r", None, PROMPT, 0)
    link.commit("r", [12])
    link.finish("r", StopReason.EOS, GenerationFigures(generated_tokens=1))
    assert changed.wait(60)
    link.close()
    assert {plugin for plugin, _ in seen} == {"ngram_plugin.so"}
    # handed over only when they changed: no two equal snapshots in a row
    snapshots = [counts for _, counts in seen]
    assert all(a != b for a, b in zip(snapshots, snapshots[1:], strict=False))
    assert all(isinstance(v, int) for counts in snapshots for v in counts.values())
