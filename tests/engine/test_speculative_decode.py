"""Speculative decoding in the engine's step loop on the successor model (real llama.cpp).

The successor fixture's greedy output is a known cycle of 48 words with a logit margin of 20,
so it cannot flip with the batch shape: speculated and plain text must be byte-identical to
the known continuation, and once a cycle went by, the n-gram proposer finds every next token.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from skippyctl.config.load_options import SpecMode
from skippyctl.engine import spec_gate
from skippyctl.engine.draft import DraftModel
from skippyctl.engine.generation import BatchEngine, GenerateRequest, SamplingParams
from skippyctl.engine.protocol_messages import EngineMessage, GenDone, GenSpecSwitched, GenText
from skippyctl.engine.spec_gate import StepCosts
from skippyctl.engine.speculation import ServingPlugins, SpecConfig
from skippyctl.fixtures import TINY_SUCCESSOR, TINY_SUCCESSOR_DRAFT, make_model, successor_cycles
from skippyctl.plugins.api import DiscardReason, OutcomeKind, PluginReceipt, RequestIds
from skippyctl.plugins.builtin.ngram import NgramPlugin
from skippyctl.plugins.inprocess import InProcessPlugin
from tests.engine.conftest import loaded_model

WAIT_S = 60.0
WORDS = ("fox", "the", "good", "about")  # prompts end on different words of the cycle
NGRAM = SpecConfig(SpecMode.NGRAM, draft_tokens=8)
AUTO = SpecConfig(SpecMode.AUTO)


@pytest.fixture(scope="module")
def model(fixture_dir: Path) -> Iterator[Any]:
    yield from loaded_model(fixture_dir / "tiny-successor.gguf")


class Run:
    """What one engine said: text and terminal per request."""

    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        self.done: dict[str, GenDone] = {}
        self.switched: list[GenSpecSwitched] = []
        self._cond = threading.Condition()

    def __call__(self, message: EngineMessage) -> None:
        with self._cond:
            if isinstance(message, GenText):
                self.text[message.request_id] = self.text.get(message.request_id, "") + message.text
            elif isinstance(message, GenDone):
                self.done[message.request_id] = message
                self._cond.notify_all()
            elif isinstance(message, GenSpecSwitched):
                self.switched.append(message)
                self._cond.notify_all()

    def wait_speculating(self, request_id: str) -> None:
        with self._cond:
            assert self._cond.wait_for(
                lambda: any(m.request_id == request_id and m.speculating for m in self.switched),
                WAIT_S,
            )

    def wait(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.done) >= count, WAIT_S)


def _generate(
    model: Any,
    spec: SpecConfig,
    requests: list[GenerateRequest],
    lanes: int,
    sequential: bool,
    tokens_per_lane: int = 512,
    llama: Any = llama_cpp,
    staggered: bool = False,
) -> Run:
    """``sequential``: each request once the previous one ended; ``staggered``: once the previous
    one speculates (it is running when the next one's prompt comes); else all at once."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = tokens_per_lane * lanes
    params.n_seq_max = lanes
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    run = Run()
    engine = BatchEngine(
        llama, model, context, lanes=lanes, emit=run, n_threads=1, speculation=spec
    )
    try:
        if sequential or staggered:
            engine.start()
            for count, request in enumerate(requests, 1):
                engine.submit(request)
                if sequential:
                    run.wait(count)
                elif count < len(requests):
                    run.wait_speculating(request.request_id)
        else:
            # All queued before the decode thread starts: its first step admits every one, so
            # the schedule (and the proposal counts the tests bound) does not depend on how
            # fast this thread submits.
            for request in requests:
                engine.submit(request)
            engine.start()
        run.wait(len(requests))
    finally:
        engine.stop()
        llama_cpp.llama_free(context)
    return run


def _request(
    request_id: str, word: str, max_tokens: int, session: str | None = None
) -> GenerateRequest:
    return GenerateRequest(
        request_id,
        prompt=f"the quick brown {word}",
        session=session,
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
    )


@pytest.mark.parametrize("lanes", [1, 4])
def test_speculated_text_is_the_known_cycle_and_most_tokens_come_from_proposals(
    model: Any, lanes: int
) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    n = 150
    requests = [_request(f"r{i}", word, n) for i, word in enumerate(WORDS[:lanes])]
    plain = _generate(model, SpecConfig(), requests, lanes, sequential=False)
    speculated = _generate(model, NGRAM, requests, lanes, sequential=False)
    for request, word in zip(requests, WORDS, strict=False):
        expected = table.text(table.continuation(table.word_id(word), n))
        assert plain.text[request.request_id] == expected
        assert speculated.text[request.request_id] == expected
        done = speculated.done[request.request_id]
        assert done.figures.generated_tokens == n and done.stop_reason.value == "length"
        # The first cycle (48 words) has no earlier occurrence to propose from; after it every
        # proposal is right (the window grows from 4 to 8), so most tokens came from proposals.
        assert done.figures.spec_accepted == done.figures.spec_proposed
        assert done.figures.spec_accepted >= (n - 48) * 3 // 4
        assert done.figures.spec_windows < (n - 48) // 4  # far fewer steps than tokens
        assert plain.done[request.request_id].figures.spec_windows == 0


class _KnownCosts(StepCosts):
    """Step costs as given, whatever the steps measure: the gate's decisions then depend on
    the proposals alone, not on how busy this machine is (the measuring itself is
    ``test_spec_gate.py``'s)."""

    token_s = 0.0
    pass_s = 0.0

    def plain(self, lanes: int) -> float:
        return 0.001 * lanes

    def cost(self, lanes: int, proposed: int, added_passes: int) -> float:
        return self.token_s * proposed + self.pass_s * added_passes


@pytest.mark.parametrize(("lanes", "tokens_per_lane"), [(1, 512), (4, 1024)])
def test_auto_verifies_proposals_once_they_pay_and_never_changes_the_text(
    model: Any, lanes: int, tokens_per_lane: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--spec auto`` on the successor model with proposals that cost a tenth of a token
    each: after the first cycle every proposal is right, so every lane switches on (reported)
    and most tokens come from proposals. A one-lane context of 512 has a batch of 512, as
    large as a prompt chunk: proposals never share a step with one, so it speculates too."""
    monkeypatch.setattr(spec_gate, "StepCosts", _KnownCosts)
    monkeypatch.setattr(_KnownCosts, "token_s", 0.0001)
    monkeypatch.setattr(_KnownCosts, "pass_s", 0.0002)
    table = successor_cycles(TINY_SUCCESSOR)
    n = 200
    requests = [_request(f"r{i}", word, n) for i, word in enumerate(WORDS[:lanes])]
    speculated = _generate(
        model, AUTO, requests, lanes, sequential=False, tokens_per_lane=tokens_per_lane
    )
    for request, word in zip(requests, WORDS, strict=False):
        expected = table.text(table.continuation(table.word_id(word), n))
        assert speculated.text[request.request_id] == expected
        figures = speculated.done[request.request_id].figures
        assert figures.generated_tokens == n
        assert figures.spec_accepted >= (n - 48) // 2, figures
    switched_on = {m.request_id for m in speculated.switched if m.speculating}
    assert switched_on == {r.request_id for r in requests}
    assert all(m.acceptance_pct >= 50 and m.lanes <= lanes for m in speculated.switched)


def test_auto_verifies_nothing_where_proposals_cost_more_than_they_could_add(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proposed tokens dearer than a whole step: even right proposals do not pay, so no lane
    verifies any (the text is the same) and none switches on."""
    monkeypatch.setattr(spec_gate, "StepCosts", _KnownCosts)
    monkeypatch.setattr(_KnownCosts, "token_s", 0.01)
    table = successor_cycles(TINY_SUCCESSOR)
    n = 120
    requests = [_request(f"r{i}", word, n) for i, word in enumerate(WORDS[:2])]
    run = _generate(model, AUTO, requests, 2, sequential=False, tokens_per_lane=1024)
    for request, word in zip(requests, WORDS, strict=False):
        assert run.text[request.request_id] == table.text(
            table.continuation(table.word_id(word), n)
        )
        assert run.done[request.request_id].figures.spec_proposed == 0
    assert run.switched == []


class BatchShapes:
    """llama_cpp with the shape of every ``llama_decode``'s batch recorded: per sequence, its
    tokens and how many of them ask for logits (a verified window asks for every one, a prompt
    chunk for its last token at most)."""

    def __init__(self) -> None:
        self.steps: list[dict[int, tuple[int, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, context: Any, batch: Any) -> int:
        time.sleep(0.002)  # a running request outlasts the test thread's next submit
        shape: dict[int, tuple[int, int]] = {}
        for i in range(batch.n_tokens):
            tokens, logits = shape.get(batch.seq_id[i][0], (0, 0))
            shape[batch.seq_id[i][0]] = (tokens + 1, logits + (1 if batch.logits[i] else 0))
        self.steps.append(shape)
        return int(llama_cpp.llama_decode(context, batch))


def test_auto_verifies_nothing_in_a_step_that_carries_a_prompt(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that arrives while another lane speculates gets its prompt's step without
    windows beside it (they would delay its first token by their forward pass); the lane
    verifies again in the steps after."""
    monkeypatch.setattr(spec_gate, "StepCosts", _KnownCosts)
    monkeypatch.setattr(_KnownCosts, "token_s", 0.0001)
    monkeypatch.setattr(_KnownCosts, "pass_s", 0.0002)
    table = successor_cycles(TINY_SUCCESSOR)
    shapes = BatchShapes()
    requests = [
        GenerateRequest(
            f"r{i}",
            prompt=word + table.text(table.continuation(table.word_id(word), 700)),
            max_tokens=600,
            sampling=SamplingParams(temperature=0.0),
        )
        for i, word in enumerate(WORDS[:3])
    ]
    # On two lanes, r1 comes once r0 speculates and r2 once r1 does (r0 may still run); their
    # 700-token prompts take two steps each (the chunk is the context's n_ubatch, 512), and a
    # lane decoding then joins both.
    run = _generate(
        model, AUTO, requests, 2, sequential=False, staggered=True, tokens_per_lane=2048,
        llama=shapes,
    )  # fmt: skip
    assert sum(run.done[r.request_id].figures.spec_accepted for r in requests) > 600
    with_prompt = [s for s in shapes.steps if any(t > 1 and n <= 1 for t, n in s.values())]
    windows = [s for s in shapes.steps if any(n > 1 for _, n in s.values())]
    assert len(with_prompt) >= 6 and len(windows) >= 3
    assert any(len(step) > 1 for step in with_prompt)  # a decoding lane beside a chunk
    assert all(n <= 1 for step in with_prompt for _, n in step.values()), with_prompt


def test_auto_windows_grow_with_how_far_back_the_copied_text_agrees(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that starts to repeat its own first cycle matches it only by its last n-gram
    (what came before each differs): its first window is at most half that agreement, 2
    tokens. As the repeat goes on, the agreement and the windows grow (proposals cheap and
    right: the gate alone would verify 4 at once, then twice its longest run)."""
    monkeypatch.setattr(spec_gate, "StepCosts", _KnownCosts)
    monkeypatch.setattr(_KnownCosts, "token_s", 0.0001)
    monkeypatch.setattr(_KnownCosts, "pass_s", 0.0002)
    table = successor_cycles(TINY_SUCCESSOR)
    shapes = BatchShapes()
    n = 300
    run = _generate(model, AUTO, [_request("r0", "fox", n)], 1, sequential=True, llama=shapes)
    assert run.text["r0"] == table.text(table.continuation(table.word_id("fox"), n))
    windows = [tokens - 1 for step in shapes.steps for tokens, rows in step.values() if rows > 1]
    assert windows, shapes.steps
    assert windows[0] <= 2, windows
    assert max(windows) >= 16, windows


class TimedShapes(BatchShapes):
    """:class:`BatchShapes` with when each ``llama_decode`` was called (monotonic s)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def llama_decode(self, context: Any, batch: Any) -> int:
        self.times.append(time.monotonic())
        return super().llama_decode(context, batch)


def test_auto_verifies_nothing_while_a_sessions_next_request_is_due(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r1 starts beside r0, which speculates, and ends at once. While its lane is free and it
    ended lately (its client's next request is on its way and would wait for the step under
    way), r0's steps verify no proposals; after that they verify again, with the same text."""
    monkeypatch.setattr(spec_gate, "StepCosts", _KnownCosts)
    monkeypatch.setattr(_KnownCosts, "token_s", 0.0001)
    monkeypatch.setattr(_KnownCosts, "pass_s", 0.0002)
    table = successor_cycles(TINY_SUCCESSOR)
    shapes = TimedShapes()
    requests = [_request("r0", "fox", 1500), _request("r1", "the", 2)]
    run = _generate(
        model, AUTO, requests, 2, sequential=False, staggered=True, tokens_per_lane=2048,
        llama=shapes,
    )  # fmt: skip
    assert run.text["r0"] == table.text(table.continuation(table.word_id("fox"), 1500))
    steps, times = shapes.steps, shapes.times
    r0_seq = next(iter(steps[0]))
    with_r1 = [i for i, step in enumerate(steps) if set(step) - {r0_seq}]
    first, last = with_r1[0], with_r1[-1]
    assert any(n > 1 for step in steps[:first] for _, n in step.values())  # r0 speculated
    # r1 ended after its last step's decode began; the engine counts it due for 0.2 s after.
    timed = list(zip(steps, times, strict=True))
    due = [step for step, t in timed if times[last + 1] <= t < times[last] + 0.15]
    again = [step for step, t in timed if t > times[last + 1] + 0.25]
    assert due and all(n <= 1 for step in due for _, n in step.values()), due
    assert any(n > 1 for step in again for _, n in step.values())


def test_a_session_continues_from_speculated_kv(model: Any) -> None:
    """The lane's KV after speculation (rejected proposals removed) serves the session's next
    request exactly like KV decoded one token a step."""
    table = successor_cycles(TINY_SUCCESSOR)
    first = _request("a", "fox", 70, session="s")
    plain = _generate(model, SpecConfig(), [first], 1, sequential=True)
    follow_text = "the quick brown fox" + plain.text["a"]
    second = GenerateRequest(
        "b",
        prompt=follow_text,
        session="s",
        max_tokens=60,
        sampling=SamplingParams(temperature=0.0),
    )
    runs = [
        _generate(model, spec, [first, second], 1, sequential=True)
        for spec in (SpecConfig(), NGRAM)
    ]
    assert runs[0].text == runs[1].text
    last_word = table.continuation(table.word_id("fox"), 70)[-1]
    assert runs[1].text["b"] == table.text(table.continuation(last_word, 60))
    assert runs[1].done["b"].figures.reused_tokens == runs[0].done["b"].figures.reused_tokens > 0
    assert runs[1].done["b"].figures.spec_accepted > 40  # the prompt held whole cycles already


class OracleProposals:
    """Serving plugins stand-in that knows the successor model's cycle: it proposes the true
    continuation of what was committed, corrupted past ``right`` tokens when ``right`` is set
    (so a window verifies and the run-ahead behind it is stale). In-process: it exercises the
    engine's side of ``--spec plugin`` (windows, run-ahead, discards) without a sidecar."""

    def __init__(self, right: int | None = None) -> None:
        self.table = successor_cycles(TINY_SUCCESSOR)
        self.last: dict[str, int] = {}
        self.queries = 0
        self.right = right
        self.finished: set[str] = set()
        self.outcomes: list[tuple[OutcomeKind, DiscardReason | None, int, int]] = []

    def begin(self, request: str, session: str | None, prompt: Any, reused: int) -> None:
        self.last[request] = int(prompt[-1])

    def commit(self, request: str, tokens: Any) -> None:
        self.last[request] = int(tokens[-1])

    def propose(self, wants: Any) -> dict[str, list[int]]:
        self.queries += 1
        out = {}
        for request, capacity in wants.items():
            tokens = self.table.continuation(self.last[request], capacity)
            if self.right is not None:
                wrong = self.table.word_id("the")
                tokens = tokens[: self.right] + [wrong] * (capacity - self.right)
            out[request] = tokens
        return out

    def late(self) -> frozenset[str]:
        return frozenset()

    def outcome(
        self,
        request: str,
        proposed: int,
        accepted: int,
        kind: OutcomeKind,
        reason: DiscardReason | None = None,
    ) -> None:
        assert request not in self.finished, "an outcome after the request's end"
        self.outcomes.append((kind, reason, proposed, accepted))

    def finish(self, request: str, stop_reason: Any, figures: Any) -> None:
        self.finished.add(request)

    def abort(self, request: str, reason: str) -> None:
        self.finished.add(request)


def _with_plugins(model: Any, spec: SpecConfig, plugins: ServingPlugins, n: int) -> Run:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 512
    params.n_seq_max = 1
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    run = Run()
    engine = BatchEngine(
        llama_cpp, model, context, lanes=1, emit=run, n_threads=1, speculation=spec,
        plugins=plugins,
    )  # fmt: skip
    engine.start()
    try:
        engine.submit(_request("r", "fox", n))
        run.wait(1)
        assert engine.proposal_failures == 0  # every call into the plugins returned
    finally:
        engine.stop()
        llama_cpp.llama_free(context)
    return run


@pytest.mark.parametrize("ahead", [0, 32])
def test_plugin_windows_verify_and_run_ahead_saves_queries(model: Any, ahead: int) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    n = 150
    plugins = OracleProposals()
    spec = SpecConfig(SpecMode.PLUGIN, draft_tokens=8, runahead_tokens=ahead)
    run = _with_plugins(model, spec, plugins, n)
    assert run.text["r"] == table.text(table.continuation(table.word_id("fox"), n))
    done = run.done["r"]
    assert done.figures.spec_accepted == done.figures.spec_proposed > n // 2
    assert done.figures.spec_discarded == 0
    assert plugins.finished == {"r"}
    # Every window's outcome was delivered, the last one (max_tokens ended the request inside
    # it) as ``stopped`` before the finish (OracleProposals refuses an outcome after the end).
    kinds = [kind for kind, *_ in plugins.outcomes]
    assert len(kinds) == done.figures.spec_windows
    assert kinds[-1] is OutcomeKind.STOPPED
    assert set(kinds[:-1]) == {OutcomeKind.FULL_ACCEPT}  # the oracle is always right
    assert sum(accepted for *_, accepted in plugins.outcomes) == done.figures.spec_accepted
    if ahead == 0:
        assert plugins.queries >= done.figures.spec_windows  # fixed depth: a query per window
    else:
        # Every run-ahead window verified whole: most windows needed no query.
        assert plugins.queries * 2 < done.figures.spec_windows


def test_stale_run_ahead_is_discarded_and_never_changes_the_text(model: Any) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    n = 120
    plugins = OracleProposals(right=4)  # right for 4 tokens, wrong after
    spec = SpecConfig(SpecMode.PLUGIN, draft_tokens=4, runahead_tokens=16)
    run = _with_plugins(model, spec, plugins, n)
    assert run.text["r"] == table.text(table.continuation(table.word_id("fox"), n))
    done = run.done["r"]
    assert done.figures.spec_accepted > 0
    # A window of 4 verified whole, but the token after it is not the run-ahead's first:
    # the other 16 are dropped unexecuted, every time.
    assert done.figures.spec_discarded > 0 and done.figures.spec_discarded % 16 == 0
    # each stale run-ahead reached the proposer as a discard with its reason
    stale = [o for o in plugins.outcomes if o[0] is OutcomeKind.DISCARDED]
    assert {reason for _, reason, *_ in stale} == {DiscardReason.POSITION_MISMATCH}
    assert sum(proposed for _, _, proposed, _ in stale) == done.figures.spec_discarded


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("draft") / "draft.gguf", TINY_SUCCESSOR_DRAFT)


def _with_draft(model: Any, path: Path, requests: list[GenerateRequest], lanes: int) -> Run:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 512 * lanes
    params.n_seq_max = lanes
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    draft_model = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    assert draft_model
    draft_params = llama_cpp.llama_context_default_params()
    draft_params.n_ctx = 512 * lanes
    draft_params.n_seq_max = lanes
    draft_context = llama_cpp.llama_init_from_model(draft_model, draft_params)
    assert draft_context
    draft = DraftModel(llama_cpp, draft_model, draft_context, lanes)
    run = Run()
    spec = SpecConfig(SpecMode.DRAFT, draft_tokens=8)
    engine = BatchEngine(
        llama_cpp, model, context, lanes=lanes, emit=run, n_threads=1, speculation=spec,
        draft=draft,
    )  # fmt: skip
    engine.start()
    try:
        for request in requests:
            engine.submit(request)
        run.wait(len(requests))
        assert engine.proposal_failures == 0  # no draft decode failed
    finally:
        engine.stop()
        llama_cpp.llama_free(context)
        draft.free()
    return run


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_draft_model_proposes_from_the_first_token_and_never_changes_the_text(
    model: Any, draft_path: Path, lanes: int
) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    n = 100
    requests = [_request(f"r{i}", word, n) for i, word in enumerate(WORDS[:lanes])]
    run = _with_draft(model, draft_path, requests, lanes)
    for request, word in zip(requests, WORDS, strict=False):
        assert run.text[request.request_id] == table.text(
            table.continuation(table.word_id(word), n)
        )
        done = run.done[request.request_id]
        # The draft knows the cycle from the start (n-gram lookup needs one cycle first).
        assert done.figures.spec_accepted == done.figures.spec_proposed > n * 3 // 4
        assert done.figures.spec_windows < n // 4


def test_a_sessions_next_request_is_drafted_from_the_lanes_kv_too(
    model: Any, draft_path: Path
) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    first = _request("a", "fox", 40, session="s")
    run = _with_draft(model, draft_path, [first], 1)
    follow = GenerateRequest(
        "b",
        prompt="the quick brown fox" + run.text["a"],
        session="s",
        max_tokens=40,
        sampling=SamplingParams(temperature=0.0),
    )
    again = _with_draft(model, draft_path, [first, follow], 1)
    last_word = table.continuation(table.word_id("fox"), 40)[-1]
    assert again.text["b"] == table.text(table.continuation(last_word, 40))
    done = again.done["b"]
    assert done.figures.reused_tokens > 0  # the target reused the session's KV, the draft its own
    assert done.figures.spec_accepted == done.figures.spec_proposed > 20


@pytest.mark.parametrize("lanes", [1, 4])
def test_ngram_proposals_may_run_ahead_without_changing_the_text(model: Any, lanes: int) -> None:
    table = successor_cycles(TINY_SUCCESSOR)
    n = 150
    requests = [_request(f"r{i}", word, n) for i, word in enumerate(WORDS[:lanes])]
    ahead = SpecConfig(SpecMode.NGRAM, draft_tokens=8, runahead_tokens=16)
    run = _generate(model, ahead, requests, lanes, sequential=False)
    for request, word in zip(requests, WORDS, strict=False):
        assert run.text[request.request_id] == table.text(
            table.continuation(table.word_id(word), n)
        )
        done = run.done[request.request_id]
        # Prompt lookup on the cycle is never wrong: every window verifies, and so does the
        # run-ahead behind it (nothing discarded).
        assert done.figures.spec_accepted == done.figures.spec_proposed >= (n - 48) * 3 // 4
        assert done.figures.spec_discarded == 0


class RecordingNgram(NgramPlugin):
    """The built-in n-gram plugin, recording the runs it is given (start, count) per request."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[int, list[tuple[int, int]]] = {}
        self.generated: dict[int, int] = {}

    def begin(self, ids: RequestIds, prompt: Any, reused: int) -> None:
        super().begin(ids, prompt, reused)
        self.runs[ids.request] = []

    def commit(self, ids: RequestIds, start: int, tokens: Any) -> None:
        self.runs[ids.request].append((start, len(tokens)))
        super().commit(ids, start, tokens)

    def finish(self, ids: RequestIds, start: int, suffix: Any, receipt: PluginReceipt) -> None:
        self.runs[ids.request].append((start, len(suffix)))
        self.generated[ids.request] = receipt.generated_tokens
        super().finish(ids, start, suffix, receipt)


def test_the_in_process_adapter_hands_the_plugin_every_committed_token_once_in_order(
    model: Any,
) -> None:
    """The decode core's deltas through InProcessPlugin (what --spec ngram runs): contiguous
    runs from 0 to the last committed token, the receipt's count, and the text unchanged."""
    table = successor_cycles(TINY_SUCCESSOR)
    n = 120
    recorder = RecordingNgram()
    adapter = InProcessPlugin(recorder, n_vocab=TINY_SUCCESSOR.n_vocab)
    spec = SpecConfig(SpecMode.PLUGIN, draft_tokens=8)
    run = _with_plugins(model, spec, adapter, n)
    assert run.text["r"] == table.text(table.continuation(table.word_id("fox"), n))
    done = run.done["r"]
    assert done.figures.spec_accepted == done.figures.spec_proposed >= (n - 48) * 3 // 4
    (runs,) = recorder.runs.values()
    position = 0
    for start, count in runs:
        assert start == position  # each run starts where the last ended
        position += count
    assert position == done.figures.generated_tokens == n  # every committed token, once
    assert runs[-1] == (n, 0)  # delivered as committed: the finish suffix is empty
    assert list(recorder.generated.values()) == [n]
    assert recorder.requests() == 0 and adapter.failures == 0


class _DraftDecodeFails:
    """llama_cpp with the draft context's llama_decode answering 1 (no KV slot). A mock: a
    real draft decode failure cannot be produced on demand; everything else is llama.cpp."""

    def __init__(self, draft_context: Any) -> None:
        self._draft_context = draft_context

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, context: Any, batch: Any) -> int:
        if context is self._draft_context:
            return 1
        return int(llama_cpp.llama_decode(context, batch))


def test_a_failed_draft_decode_is_reported_and_costs_only_its_proposals(
    model: Any, draft_path: Path
) -> None:
    draft_model = llama_cpp.llama_model_load_from_file(
        os.fsencode(draft_path), llama_cpp.llama_model_default_params()
    )
    assert draft_model
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max = 512, 1
    draft_context = llama_cpp.llama_init_from_model(draft_model, params)
    assert draft_context
    failures: list[tuple[int, int]] = []
    draft = DraftModel(
        _DraftDecodeFails(draft_context),  # type: ignore[arg-type]
        draft_model,
        draft_context,
        1,
        on_failure=lambda code, requests: failures.append((code, requests)),
    )
    try:
        draft.begin("a", None, [1, 2, 3], 0)
        assert draft.propose({"a": 4}) == {}
        assert (draft.failures, failures) == (1, [(1, 1)])
    finally:
        draft.free()


class _FailingDecode:
    """llama_cpp, except that decode call number ``fail_at`` returns -3 (a failed compute)
    without running: the step's proposals are never verified."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, context: Any, batch: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            return -3
        return llama_cpp.llama_decode(context, batch)


def test_proposals_of_a_failed_step_reach_the_proposer_as_execution_failed(model: Any) -> None:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 512
    params.n_seq_max = 1
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    run = Run()
    plugins = OracleProposals()
    engine = BatchEngine(
        _FailingDecode(fail_at=3), model, context, lanes=1, emit=run, n_threads=1,  # type: ignore[arg-type]  # a duck-typed llama_cpp
        speculation=SpecConfig(SpecMode.PLUGIN, draft_tokens=8), plugins=plugins,
    )  # fmt: skip
    engine.start()
    try:
        engine.submit(_request("r", "fox", 100))
        run.wait(1)
        assert engine.proposal_failures == 0
    finally:
        engine.stop()
        llama_cpp.llama_free(context)
    assert run.done["r"].outcome.value == "failed"
    assert plugins.finished == {"r"}  # aborted, after the outcome (asserted in outcome)
    kind, reason, proposed, accepted = plugins.outcomes[-1]
    assert (kind, reason, accepted) == (OutcomeKind.DISCARDED, DiscardReason.EXECUTION_FAILED, 0)
    assert proposed > 0
