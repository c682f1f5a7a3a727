"""The built-in n-gram plugin (skippyctl/plugins/builtin/ngram.py): what its index proposes from a
request's history, the plugin's per-request streams, and its entry point."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from skippyctl.plugins.api import (
    ENTRY_POINT_GROUP,
    AbortReasonCode,
    Plugin,
    PluginReceipt,
    ProposalQuery,
    RequestIds,
)
from skippyctl.plugins.builtin.ngram import (
    AGREEMENT_CAP,
    NgramIndex,
    NgramPlugin,
    SharedNgrams,
    StreamGap,
)
from tests.plugins.conftest import ROOT


def _index(history: list[int], **bounds: int) -> NgramIndex:
    return NgramIndex(history, **bounds)


def test_a_single_token_match_is_not_enough() -> None:
    # "5" occurred before (followed by 6), but the 2-gram "9 5" did not.
    assert _index([5, 6, 7, 9, 5]).propose(3) == []
    assert _index([5, 6, 7, 9, 5], ngram_min=1).propose(2) == [6, 7]


def test_the_longest_earlier_match_of_the_suffix_proposes_what_followed_it() -> None:
    # ... 1 2 3 9 ... 7 2 3 4 ... 2 3: the 2-gram "2 3" last occurred before 4.
    index = _index([1, 2, 3, 9, 5, 7, 2, 3, 4, 6, 8])
    index.commit(0, [2, 3])
    assert index.propose(3) == [4, 6, 8]
    # A longer match wins over a more recent shorter one: "7 2 3" occurred once, before 4.
    assert _index([7, 2, 3, 4, 5, 2, 3, 9, 9, 7, 2, 3]).propose(2) == [4, 5]


def test_nothing_is_proposed_without_an_earlier_occurrence() -> None:
    index = _index([1, 2, 3, 4])
    assert index.propose(4) == []
    assert index.propose(0) == []
    assert _index([]).propose(4) == []


def test_a_recent_match_continues_its_cycle_past_the_end_of_the_history() -> None:
    assert _index([5, 6, 5, 6]).propose(5) == [5, 6, 5, 6, 5]
    assert _index([8, 8, 8]).propose(3) == [8, 8, 8]
    assert _index([10, 11, 12] * 2).propose(7) == [10, 11, 12, 10, 11, 12, 10]


def test_the_limit_caps_the_draft() -> None:
    index = _index([1, 2, 3, 4, 5, 1, 2])
    assert index.propose(2) == [3, 4]
    assert len(index.propose(50)) == 50


def test_bounds_are_checked_when_the_plugin_is_made() -> None:
    with pytest.raises(ValueError, match="ngram"):
        NgramIndex([], ngram_min=3, ngram_max=2)
    with pytest.raises(ValueError, match="ngram"):
        NgramPlugin(ngram_min=0)


def test_a_run_that_leaves_a_hole_in_the_stream_is_refused() -> None:
    index = _index([1, 2])
    index.commit(0, [3, 4])
    with pytest.raises(StreamGap):
        index.commit(1, [9])  # overlaps
    with pytest.raises(StreamGap):
        index.commit(3, [9])  # skips token 2
    index.commit(2, [5])
    assert index.committed == 3


def test_the_plugin_keeps_one_history_per_request_and_applies_a_querys_pending_run() -> None:
    plugin = NgramPlugin()
    assert isinstance(plugin, Plugin)
    a, b = RequestIds(1), RequestIds(2, session=7)
    plugin.begin(a, (1, 2, 3, 1), 0)
    plugin.begin(b, (9, 8, 7), 0)
    plugin.commit(a, 0, (2,))
    # a: 1 2 3 1 2 → "1 2" followed by 3 before; the pending 3 makes it "2 3" → 1 2 3 ...
    assert plugin.propose(ProposalQuery(a, 2, 0, 1, ())) == [3, 1]
    assert plugin.propose(ProposalQuery(a, 4, 0, 1, (3,))) == [1, 2, 3, 1]
    assert plugin.propose(ProposalQuery(b, 4, 0, 0, ())) is None  # nothing to look up
    with pytest.raises(StreamGap):
        plugin.propose(ProposalQuery(b, 4, 0, 5, (1,)))
    assert plugin.requests() == 2
    plugin.finish(a, 2, (), PluginReceipt())
    plugin.abort(b, AbortReasonCode.CANCELLED)
    assert plugin.requests() == 0


def test_the_project_declares_the_entry_point_ngram() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[ENTRY_POINT_GROUP]["ngram"] == "skippyctl.plugins.builtin.ngram:NgramPlugin"


def test_the_entry_point_makes_the_built_in_plugin(plugin_env: dict[str, str]) -> None:
    # In a fresh interpreter with the checkout's declared entry points as an install has them.
    code = (
        "from skippyctl.plugins.api import load_entry_point; "
        "print(type(load_entry_point('ngram')).__qualname__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=plugin_env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "NgramPlugin"


def test_a_request_proposes_what_followed_its_last_ngram_in_another_request() -> None:
    """Text one request wrote is proposed to the next from its first matching n-gram on, where
    the request's own history has nothing yet; the pool is bounded, oldest first."""
    shared = SharedNgrams(limit=64)
    first = NgramIndex([1, 2, 3, 4, 5, 6, 7, 8, 9], shared=shared)
    assert first.propose(4) == []  # its own n-grams never propose from itself through the pool
    second = NgramIndex([20, 2, 3, 4, 5], shared=shared)
    assert second.propose(3) == [6, 7, 8]
    small = SharedNgrams(limit=2)
    NgramIndex([1, 2, 3, 4, 5, 6, 7], shared=small)
    assert len(small) == 2  # (2, 3, 4, 5) and (3, 4, 5, 6): (1, 2, 3, 4) went first
    assert NgramIndex([9, 3, 4, 5, 6], shared=small).propose(1) == [7]
    assert NgramIndex([8, 2, 3, 4, 5], shared=small).propose(1) == []  # forgotten since


def test_a_proposal_says_how_far_back_its_source_agrees_with_the_text() -> None:
    """The matched n-gram and as far back as both texts stay equal: 3 where the text before
    the match differs, 20 for a passage copied from its start, the cap for a long one, the
    other request's text for a proposal from the pool, 0 without a proposal."""
    index = NgramIndex([5, 1, 2, 3, 4, 9, 8, 2, 3, 4])
    assert index.propose(2) == [9, 8] and index.agreement == 3
    passage = list(range(100, 140))
    copying = NgramIndex([*passage, 1, *passage[:20]])
    assert copying.propose(4) == passage[20:24] and copying.agreement == 20
    long_text = [7 * i % 1000 for i in range(400)]
    assert NgramIndex([*long_text, 1, *long_text[:300]]).propose(1) == [long_text[300]]
    assert NgramIndex([*long_text, 1, *long_text[:300]]).agreement == 0  # not asked yet
    capped = NgramIndex([*long_text, 1, *long_text[:300]])
    capped.propose(1)
    assert capped.agreement == AGREEMENT_CAP
    shared = SharedNgrams()
    NgramIndex([1, 2, 3, 4, 5, 6, 7, 8, 9], shared=shared)
    pooled = NgramIndex([20, 2, 3, 4, 5], shared=shared)
    assert pooled.propose(3) == [6, 7, 8] and pooled.agreement == 4
    alone = NgramIndex([1, 2, 3])
    assert alone.propose(3) == [] and alone.agreement == 0
