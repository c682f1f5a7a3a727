"""The in-process plugin adapter (skippyctl/plugins/inprocess.py): the engine's serving-plugin
calls made directly on a Plugin object keep the plugin contract — a contiguous, complete
committed stream, opaque ids in a bounded session map, activation first, validated answers
discarded by reason (never a failure), outcome kinds, a failure that ends only its own
request."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.api import (
    AbortReasonCode,
    ActivationContext,
    BasePlugin,
    DiscardReason,
    OutcomeKind,
    PluginReceipt,
    ProposalOutcome,
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


class OutcomeRecorder(Recorder):
    """A plugin written against outcome kinds and activation: records both."""

    def __init__(self, answer: object = None, refuse_activation: bool = False) -> None:
        super().__init__(answer)
        self.full_outcomes: list[ProposalOutcome] = []
        self.activations: list[ActivationContext] = []
        self.refuse_activation = refuse_activation

    def activate(self, context: ActivationContext) -> None:
        if self.refuse_activation:
            raise ValueError("not my kind of model")
        self.activations.append(context)

    def proposal_outcome(self, ids: RequestIds, outcome: ProposalOutcome) -> None:
        self._live(ids)
        self.full_outcomes.append(outcome)


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
    plugins.outcome("req-a", 2, 1, OutcomeKind.FIRST_MISMATCH)
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
    ("answer", "reason"),
    [
        ([1, 2, 3, 4], DiscardReason.INVALID_TOKEN_COUNT),  # more than the capacity
        ([1, N_VOCAB], DiscardReason.INVALID_TOKEN_ID),  # not a token of this model
        ([-1], DiscardReason.INVALID_TOKEN_ID),
        ([1, "2"], DiscardReason.INVALID_TOKEN_ID),  # not ids
        ((1, 2), DiscardReason.INVALID_TOKEN_COUNT),  # not a list
    ],
)
def test_an_invalid_answer_is_discarded_and_counted_by_reason_not_as_a_failure(
    answer: object, reason: DiscardReason
) -> None:
    recorder = OutcomeRecorder(answer=answer)
    plugins = InProcessPlugin(recorder, N_VOCAB)
    plugins.begin("r", None, [1], 0)
    assert plugins.propose({"r": 3}) == {}
    assert plugins.failures == 0
    assert plugins.discards[reason] == 1
    assert sum(plugins.discards.values()) == 1
    # the plugin hears of it, and the request goes on for it
    (outcome,) = recorder.full_outcomes
    assert (outcome.kind, outcome.discard_reason, outcome.accepted) == (
        OutcomeKind.DISCARDED,
        reason,
        0,
    )
    assert plugins.requests() == 1


def test_outcome_kinds_reach_proposal_outcome_and_verified_windows_reach_outcome() -> None:
    full = OutcomeRecorder(answer=[1])
    old = Recorder(answer=[1])  # no proposal_outcome of its own: BasePlugin's forwards
    for plugin in (full, old):
        plugins = InProcessPlugin(plugin, N_VOCAB)
        plugins.begin("r", None, [1], 0)
        plugins.outcome("r", 4, 4, OutcomeKind.FULL_ACCEPT)
        plugins.outcome("r", 4, 1, OutcomeKind.FIRST_MISMATCH)
        plugins.outcome("r", 3, 2, OutcomeKind.STOPPED)
        plugins.outcome("r", 5, 0, OutcomeKind.DISCARDED, DiscardReason.POSITION_MISMATCH)
        assert plugins.discards[DiscardReason.POSITION_MISMATCH] == 1
        assert plugins.failures == 0
    assert [(o.kind, o.proposed, o.accepted) for o in full.full_outcomes] == [
        (OutcomeKind.FULL_ACCEPT, 4, 4),
        (OutcomeKind.FIRST_MISMATCH, 4, 1),
        (OutcomeKind.STOPPED, 3, 2),
        (OutcomeKind.DISCARDED, 5, 0),
    ]
    # a plugin without proposal_outcome sees the verified windows only, as before kinds existed
    (seen,) = old.seen.values()
    assert seen.outcomes == [(4, 4, 0), (4, 1, 3), (3, 2, 1)]


def test_activation_reaches_the_plugin_once_and_a_raising_one_is_a_failure() -> None:
    context = ActivationContext("tiny", N_VOCAB, 512, 4, "ngram", 8.0, "k=v")
    recorder = OutcomeRecorder()
    plugins = InProcessPlugin(recorder, N_VOCAB)
    assert plugins.activate(context)
    assert recorder.activations == [context]
    refusing = InProcessPlugin(OutcomeRecorder(refuse_activation=True), N_VOCAB)
    assert not refusing.activate(context)
    assert refusing.failures == 1
    assert InProcessPlugin(NgramPlugin(), N_VOCAB).activate(context)  # BasePlugin's no-op


def test_the_session_map_is_bounded_and_evictions_are_counted() -> None:
    recorder = Recorder()
    plugins = InProcessPlugin(recorder, N_VOCAB, max_sessions=2)
    for n, session in enumerate(["a", "b", "a", "c", "d"]):
        plugins.begin(f"r-{n}", session, [1], 0)
        plugins.abort(f"r-{n}", "cancelled")
    assert plugins.sessions() == 2
    assert plugins.sessions_evicted == 2  # b (least recently used), then a
    ids = [seen.ids.session for seen in recorder.seen.values()]
    assert ids[0] == ids[2]  # a, still remembered the second time
    assert len(set(ids)) == 4  # a, b, c, d: ids are never reused
    plugins.begin("r-9", "b", [1], 0)  # evicted: it comes back with a new id
    assert list(recorder.seen.values())[-1].ids.session not in ids


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
