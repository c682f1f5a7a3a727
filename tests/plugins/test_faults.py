"""Plugins that sleep past every deadline, answer garbage, crash (C) or raise (Python): the link
keeps answering, discards late and invalid answers and counts them by reason without counting
them as failures (the plugin contract: such a plugin stays enabled), reports real failures and
disables the plugin after repeated ones, other plugins keep working, token ids never reach a
report or a counter, and nothing is left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.link import PluginLink
from skippyctl.plugins.sidecar_supervisor import DISABLE_AFTER_FAILURES, PluginReport
from tests.plugins.conftest import (
    Built,
    LinkFactory,
    Reports,
    assert_no_sidecars,
    read_streams,
)

PROMPT = [10, 11, 12, 13, 10, 11]
GOOD_PROPOSAL = [12, 13, 10, 11]


def _round(link: PluginLink, n: int) -> dict[str, list[int]]:
    """One request's life with one proposal query; returns the proposals."""
    name = f"q-{n}"
    link.begin(name, "s", PROMPT, 0)
    proposals = link.propose({name: 4})
    link.commit(name, [12])
    link.finish(name, StopReason.EOS, GenerationFigures(generated_tokens=1))
    return proposals


def _no_tokens_in(reports: list[PluginReport]) -> None:
    """Reports carry names, kinds, reason words and counts only."""
    for report in reports:
        assert "canary" not in repr(report)
        assert "/" not in report.plugin
        assert report.reason.replace("_", "").isalnum()


def test_a_plugin_late_on_every_query_is_discarded_counted_and_stays_enabled(
    make_link: LinkFactory, built: Built, reports: Reports, plugin_env: dict[str, str]
) -> None:
    # the sleepy plugin sleeps 300 ms per query; the deadline is 20 ms
    link = make_link([built.faults["sleepy"], built.ngram], deadline_ms=20.0)
    rounds = 2 * DISABLE_AFTER_FAILURES + 2  # more than enough failures to disable it, were they
    for n in range(rounds):
        proposals = _round(link, n)
        # the late plugin's answer (always [1]) is never used; the good one still answers,
        # or is itself late on a loaded machine — either way nothing late is in the result
        assert proposals in ({f"q-{n}": GOOD_PROPOSAL}, {})
    sleepy = link.counters()["sleepy.so"]
    assert sleepy["late"] == rounds  # each query discarded for its deadline, and counted
    assert sleepy["queries"] == rounds
    assert sleepy["proposals"] == 0
    assert sleepy["failures"] == 0
    assert sleepy["disabled"] == 0
    assert reports.of("sleepy.so", "failed") == []
    assert reports.of("sleepy.so", "disabled") == []
    # still asked: a late plugin is not a failing one
    before = link.counters()["sleepy.so"]["queries"]
    _round(link, 99)
    assert link.counters()["sleepy.so"]["queries"] == before + 1
    assert link.counters()["ngram_plugin.so"]["disabled"] == 0
    _no_tokens_in(reports.items)


def test_a_plugin_only_sometimes_late_keeps_running(
    make_link: LinkFactory, built: Built, reports: Reports
) -> None:
    """Late answers (made by stopping the sidecar) are discards, then answers in time are used
    again."""
    link = make_link([built.ngram], deadline_ms=100.0)
    (pid,) = link.sidecar_pids()
    for cycle in range(3):
        os.kill(pid, signal.SIGSTOP)
        try:
            for n in range(3):
                assert _round(link, 100 * cycle + n) == {}
        finally:
            os.kill(pid, signal.SIGCONT)
        # answered in time again (a 100 ms deadline: the resumed sidecar catches up in far less)
        assert _round(link, 100 * cycle + 50) == {f"q-{100 * cycle + 50}": GOOD_PROPOSAL}
    counters = link.counters()["ngram_plugin.so"]
    assert counters["late"] >= 9
    assert counters["failures"] == 0
    assert counters["disabled"] == 0
    assert reports.of("ngram_plugin.so", "failed") == []


def test_garbage_token_ids_are_discarded_by_reason_and_the_plugin_stays_enabled(
    make_link: LinkFactory, built: Built, reports: Reports
) -> None:
    link = make_link([built.faults["garbage"], built.ngram], n_vocab=100)
    rounds = 3 * DISABLE_AFTER_FAILURES  # each kind of garbage as often as would have disabled it
    for n in range(rounds):
        # >= n_vocab, negative, over capacity: each answer discarded whole; the good one wins
        assert _round(link, n) == {f"q-{n}": GOOD_PROPOSAL}
    garbage = link.counters()["garbage.so"]
    assert garbage["proposals"] == 0
    # the plugin's calls cycle: beyond the vocabulary, negative, over capacity
    assert garbage["discarded_invalid_token_id"] == 2 * DISABLE_AFTER_FAILURES
    assert garbage["discarded_invalid_token_count"] == DISABLE_AFTER_FAILURES
    assert garbage["failures"] == 0
    assert garbage["disabled"] == 0
    assert reports.of("garbage.so", "failed") == []
    assert reports.of("garbage.so", "disabled") == []
    assert link.counters()["garbage.so"]["queries"] == rounds  # still asked every round
    assert link.counters()["ngram_plugin.so"]["failures"] == 0


def test_a_crashing_c_plugin_is_restarted_for_new_requests_then_disabled(
    make_link: LinkFactory, built: Built, reports: Reports, plugin_env: dict[str, str]
) -> None:
    link = make_link([built.faults["crashy"], built.ngram])
    for crash in range(1, DISABLE_AFTER_FAILURES + 1):
        # the crash ends the query at once (no deadline wait); the good plugin answers
        assert _round(link, crash) == {f"q-{crash}": GOOD_PROPOSAL}
        reports.wait_for("crashy.so", "failed", crash)
        if crash < DISABLE_AFTER_FAILURES:
            reports.wait_for("crashy.so", "restarted", crash)
    reports.wait_for("crashy.so", "disabled")
    crashy = link.counters()["crashy.so"]
    assert crashy["failures"] == DISABLE_AFTER_FAILURES
    assert crashy["restarts"] == DISABLE_AFTER_FAILURES - 1
    assert crashy["disabled"] == 1
    assert [r.reason for r in reports.of("crashy.so", "failed")] == ["crashed"] * 3
    assert len(link.sidecar_pids()) == 1  # only the good plugin's is left
    assert _round(link, 50) == {"q-50": GOOD_PROPOSAL}
    link.close()
    assert_no_sidecars()
    # the good plugin saw every request complete, crashes next door notwithstanding
    streams = read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"]))
    assert len(streams) == DISABLE_AFTER_FAILURES + 1
    assert all(s.finished and s.tokens == [12] for s in streams.values())


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("raising", "raised"), ("raising-lifecycle", "raised"), ("erring", "error_status")],
)
def test_a_plugin_that_raises_or_errs_is_counted_then_disabled(
    make_link: LinkFactory, built: Built, reports: Reports, spec: str, reason: str
) -> None:
    specs = [built.faults["erring"] if spec == "erring" else spec, built.ngram]
    name = "erring.so" if spec == "erring" else spec
    link = make_link(specs)
    n = 0
    while not reports.of(name, "disabled"):
        n += 1
        assert n <= DISABLE_AFTER_FAILURES  # every round fails at least once
        proposals = _round(link, n)
        assert proposals.get(f"q-{n}") in (GOOD_PROPOSAL, [7])
        if spec != "raising":
            # lifecycle faults come back asynchronously: wait for this round's
            reports.wait_for(name, "failed", min(n, DISABLE_AFTER_FAILURES))
    counters = link.counters()
    assert counters[name]["disabled"] == 1
    assert counters[name]["failures"] == DISABLE_AFTER_FAILURES
    assert {r.reason for r in reports.of(name, "failed")} == {reason}
    assert counters["ngram_plugin.so"]["failures"] == 0
    assert _round(link, 100) == {"q-100": GOOD_PROPOSAL}
    _no_tokens_in(reports.items)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("old_abi", "abi_mismatch"),
        ("/nonexistent/dir/missing.so", "not_found"),
        ("no-such-entry-point", "not_found"),
    ],
)
def test_a_plugin_that_cannot_load_is_reported_and_the_others_serve(
    make_link: LinkFactory, built: Built, reports: Reports, spec: str, reason: str
) -> None:
    path = str(built.faults["old_abi"]) if spec == "old_abi" else spec
    link = make_link([path, built.ngram])
    name = Path(path).name if path.endswith(".so") else path
    assert [(r.kind, r.reason) for r in reports.of(name)] == [("load_failed", reason)]
    assert link.counters()[name]["disabled"] == 1
    assert _round(link, 1) == {"q-1": GOOD_PROPOSAL}
    assert "/" not in "".join(link.counters())


def test_close_is_idempotent_and_reaps_every_sidecar(make_link: LinkFactory, built: Built) -> None:
    link = make_link([built.ngram, built.faults["sleepy"], "ngram-py"], deadline_ms=5.0)
    link.begin("a", None, PROMPT, 0)
    link.propose({"a": 4})  # the sleepy one is stuck in propose while we close
    pids = link.sidecar_pids()
    assert len(pids) == 3
    link.close()
    link.close()
    assert link.sidecar_pids() == []
    assert_no_sidecars()
    # a closed link answers nothing and accepts calls harmlessly
    link.begin("b", None, PROMPT, 0)
    assert link.propose({"b": 4}) == {}
