"""The in-process plugin adapter (skippyctl/plugins/inprocess.py): the engine's serving-plugin
calls made directly on a Plugin object keep the plugin contract — a contiguous, complete
committed stream, opaque ids, validated answers, a failure that ends only its own request."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.api import (
    AbortReasonCode,
    BasePlugin,
    PluginReceipt,
    ProposalQuery,
    RequestIds,
    StopReasonCode,
)
from skippyctl.plugins.builtin.ngram import NgramPlugin
from skippyctl.plugins.inprocess import NO_DEADLINE_NS, InProcessPlugin

N_VOCAB = 100


@dataclass
class Seen:
    ids: RequestIds
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    queries: list[ProposalQuery] = field(default_factory=list)
    outcomes: list[tuple[int, int, int]] = field(default_factory=list)
    receipt: PluginReceipt | None = None
    aborted: AbortReasonCode | None = None


class Recorder(BasePlugin):
    """Records every call, checking as it goes that each run starts where the stream stands
    and that nothing follows a request's finish or abort. Proposes ``answer``."""

    def __init__(self, answer: object = None, raise_on_commit: int | None = None) -> None:
        self.seen: dict[int, Seen] = {}
        self.ended: set[int] = set()
        self.answer = answer
        self.raise_on_commit = raise_on_commit
        self.closed = False

    def _live(self, ids: RequestIds) -> Seen:
        assert ids.request not in self.ended, "a call after the request's last one"
        return self.seen[ids.request]

    def _run(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        seen = self._live(ids)
        assert start == len(seen.tokens), ("not contiguous", start, len(seen.tokens))
        seen.tokens.extend(tokens)

    def begin(self, ids: RequestIds, prompt: Sequence[int], reused: int) -> None:
        assert ids.request not in self.seen
        self.seen[ids.request] = Seen(ids, tuple(prompt))

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        if self.raise_on_commit is not None and ids.request == self.raise_on_commit:
            raise RuntimeError("boom")
        self._run(ids, start, tokens)

    def propose(self, query: ProposalQuery) -> list[int] | None:
        self._run(query.ids, query.pending_start, query.pending)
        self._live(query.ids).queries.append(query)
        return self.answer  # type: ignore[return-value]  # a wrong answer is the point of some tests

    def outcome(self, ids: RequestIds, proposed: int, accepted: int, rejected: int) -> None:
        self._live(ids).outcomes.append((proposed, accepted, rejected))

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        self._run(ids, start, suffix)
        self._live(ids).receipt = receipt
        self.ended.add(ids.request)

    def abort(self, ids: RequestIds, reason: AbortReasonCode) -> None:
        self._live(ids).aborted = reason
        self.ended.add(ids.request)

    def close(self) -> None:
        self.closed = True


def _figures(generated: int) -> GenerationFigures:
    return GenerationFigures(
        prompt_tokens=3,
        reused_tokens=1,
        generated_tokens=generated,
        engine_wait_ms=0.5,
        prefill_ms=1.0,
        ttft_ms=2.0,
        decode_ms=None,
        spec_proposed=6,
        spec_accepted=4,
        spec_rejected=2,
    )


def test_the_committed_stream_arrives_contiguous_and_complete_with_the_receipt() -> None:
    recorder = Recorder(answer=[7, 8])
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("req-a", "sess", [1, 2, 3], 1)
    plugins.commit("req-a", [4])
    plugins.commit("req-a", [])  # nothing committed: not a run
    plugins.commit("req-a", [5, 6])
    assert plugins.propose({"req-a": 3}) == {"req-a": [7, 8]}
    plugins.outcome("req-a", 2, 1)
    plugins.commit("req-a", [7, 9])
    plugins.finish("req-a", StopReason.LENGTH, _figures(5))

    (seen,) = recorder.seen.values()
    assert seen.prompt == (1, 2, 3)
    assert seen.tokens == [4, 5, 6, 7, 9]  # every committed token once, in order
    (query,) = seen.queries
    # Commits are delivered as they happen: a query never carries a pending run.
    assert (query.pending_start, query.pending, query.capacity) == (3, (), 3)
    assert query.deadline_mono_ns == NO_DEADLINE_NS
    assert seen.outcomes == [(2, 1, 1)]
    receipt = seen.receipt
    assert receipt is not None
    assert receipt.stop_reason is StopReasonCode.LENGTH and receipt.generated_tokens == 5
    assert (receipt.spec_proposed, receipt.spec_accepted, receipt.spec_rejected) == (6, 4, 2)
    assert math.isnan(receipt.decode_ms) and receipt.queue_ms == 0.5  # the engine's wait
    assert receipt.figures == _figures(5)  # every figure, by its one name
    assert plugins.requests() == 0 and plugins.failures == 0


def test_requests_and_sessions_reach_the_plugin_as_opaque_numbers() -> None:
    recorder = Recorder()
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("r-1", "alice", [1], 0)
    plugins.begin("r-2", "alice", [1], 0)
    plugins.begin("r-3", None, [1], 0)
    plugins.begin("r-3", None, [1], 0)  # begun already: ignored
    ids = [seen.ids for seen in recorder.seen.values()]
    assert len({i.request for i in ids}) == 3
    assert ids[0].session == ids[1].session is not None and ids[2].session is None
    assert all(isinstance(i.request, int) for i in ids)


@pytest.mark.parametrize(
    "answer",
    [
        [1, 2, 3, 4],  # more than the capacity
        [1, N_VOCAB],  # not a token of this model
        [-1],
        [1, "2"],  # not ids
        (1, 2),  # not a list
    ],
)
def test_an_invalid_answer_is_dropped_and_counted(answer: object) -> None:
    plugins = InProcessPlugin(Recorder(answer=answer), N_VOCAB)
    plugins.begin("r", None, [1], 0)
    assert plugins.propose({"r": 3}) == {}
    assert plugins.failures == 1


def test_nothing_is_asked_for_an_unknown_request_or_no_room() -> None:
    recorder = Recorder(answer=[1])
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("r", None, [1], 0)
    assert plugins.propose({"unknown": 4, "r": 0}) == {}
    assert all(not seen.queries for seen in recorder.seen.values())
    assert plugins.late() == frozenset()


def test_a_call_that_raises_ends_only_its_own_request_for_the_plugin() -> None:
    recorder = Recorder(answer=[5], raise_on_commit=1)  # the first request's commits raise
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("bad", None, [1], 0)
    plugins.begin("good", None, [1], 0)
    plugins.commit("bad", [2])
    plugins.commit("good", [2])
    bad, good = recorder.seen.values()
    assert bad.aborted is AbortReasonCode.ERROR  # told it is over: no stream with a hole
    assert plugins.failures == 1
    # Nothing more about it reaches the plugin (Recorder asserts on a call after the end).
    plugins.commit("bad", [3])
    assert plugins.propose({"bad": 2, "good": 2}) == {"good": [5]}
    plugins.finish("bad", StopReason.LENGTH, _figures(2))
    plugins.finish("good", StopReason.LENGTH, _figures(1))
    assert good.tokens == [2] and good.receipt is not None
    assert plugins.failures == 1


def test_close_aborts_what_is_in_flight_and_closes_the_plugin() -> None:
    recorder = Recorder()
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("r", None, [1], 0)
    plugins.close()
    (seen,) = recorder.seen.values()
    assert seen.aborted is AbortReasonCode.SHUTDOWN and recorder.closed
    plugins.close()  # idempotent: nothing left to abort
    assert plugins.failures == 0


def test_the_built_in_ngram_plugin_proposes_through_the_adapter() -> None:
    plugins = InProcessPlugin(NgramPlugin(), N_VOCAB)
    plugins.begin("r", None, [10, 11, 12, 10], 0)
    plugins.commit("r", [11])
    assert plugins.propose({"r": 4}) == {"r": [12, 10, 11, 12]}
    plugins.abort("r", "cancelled")
    assert plugins.propose({"r": 4}) == {}
    assert plugins.failures == 0
