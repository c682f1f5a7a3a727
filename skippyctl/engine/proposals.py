"""The decode core's proposals: where they come from, what each step asks, how they verify.

:class:`Proposals` is the core's link to the proposer and the serving plugins
(``engine/speculation.py`` holds the configuration, the :class:`ServingPlugins` protocol and the
window): it picks the proposer of the ``--spec`` mode, hands each request's begin, committed
deltas and end to the plugins and the proposer, fills each decoding lane's proposals for a step
and, once the step's logits are there, verifies them. A failing plugin or proposer costs only
its proposals and observations, never a request: its failures are counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from skippyctl.config.load_options import SpecMode
from skippyctl.engine.batch import forward_passes
from skippyctl.engine.draft import DraftModel
from skippyctl.engine.lane_kv import LaneKv
from skippyctl.engine.protocol_messages import EngineMessage, GenDone, GenSpecSwitched
from skippyctl.engine.request_state import RequestState
from skippyctl.engine.spec_gate import Candidate, LaneGate, SpecGate
from skippyctl.engine.speculation import AdaptiveWindow, ServingPlugins, SpecConfig
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import GenerationOutcome
from skippyctl.plugins.api import ActivationContext, DiscardReason, OutcomeKind
from skippyctl.plugins.builtin.ngram import NgramPlugin
from skippyctl.plugins.inprocess import InProcessPlugin

_FULL: Final = OutcomeKind.FULL_ACCEPT
_MISMATCH: Final = OutcomeKind.FIRST_MISMATCH
_STOPPED: Final = OutcomeKind.STOPPED
_DISCARDED: Final = OutcomeKind.DISCARDED
_STALE: Final = DiscardReason.POSITION_MISMATCH
_FAILED_STEP: Final = DiscardReason.EXECUTION_FAILED


class Proposals:
    """The proposer and plugins of one decode core (see the module docstring).

    ``sample`` samples a request's token at a logits index of this step; ``commit`` commits a
    sampled token (False once the request ended) — the core's own step calls.
    """

    def __init__(
        self,
        speculation: SpecConfig,
        plugins: ServingPlugins | None,
        draft: DraftModel | None,
        *,
        n_vocab: int,
        kv: LaneKv,
        sample: Callable[[RequestState, int], int],
        commit: Callable[[RequestState, int, float], bool],
        emit: Callable[[EngineMessage], None] | None = None,
        activation: ActivationContext | None = None,
    ) -> None:
        self._spec = speculation
        self._emit = emit
        self._kv = kv
        self._sample = sample
        self._commit = commit
        self.plugin_failures = 0
        """Calls into serving plugins or a proposer that raised (counted; the request carries
        on)."""
        # Every mode proposes through the same calls (ServingPlugins): the sidecars' link, the
        # built-in n-gram plugin called in this process, or the draft model.
        self._ngram: InProcessPlugin | None = None
        """With ``--spec ngram``: the built-in n-gram plugin, in this process (owned here)."""
        self._local: InProcessPlugin | DraftModel | None = None
        """A proposer in this process, whose failures it counts itself."""
        self._proposer: ServingPlugins | None = None
        """Where this model's proposals come from; None: it does not speculate."""
        self._gate: SpecGate | None = None
        """With ``--spec auto``: which lanes verify their proposals (``engine/spec_gate.py``)."""
        self._step_plan: tuple[int, int, int] | None = None
        """This step's ``(lanes, proposed tokens, added passes)`` when the gate learns from its
        time (no prompt chunk in it)."""
        self._ngram_plugin: NgramPlugin | None = None
        """With ``--spec auto``: the n-gram plugin itself, asked how far each proposal's source
        agrees with the request's text."""
        if speculation.mode in (SpecMode.NGRAM, SpecMode.AUTO):
            ngram = NgramPlugin()
            self._ngram = InProcessPlugin(ngram, n_vocab)
            self._local = self._proposer = self._ngram
            if speculation.mode is SpecMode.AUTO:
                self._gate = SpecGate(_one_pass if kv.unified else forward_passes)
                self._ngram_plugin = ngram
            if activation is not None and not self._ngram.activate(activation):
                # counted in its failures; the model does not speculate
                self._local = self._proposer = self._gate = self._ngram_plugin = None
        elif speculation.mode is SpecMode.DRAFT and draft is not None:
            self._local = self._proposer = draft
        elif speculation.mode is SpecMode.PLUGIN:
            self._proposer = plugins
        streams: list[ServingPlugins] = [] if plugins is None else [plugins]
        if self._proposer is not None and self._proposer is not plugins:
            streams.append(self._proposer)
        self.streams = tuple(streams)
        """What sees each request's begin, committed deltas and end: the sidecars' link and the
        proposer, each once."""
        # A sidecar query costs a round trip, so the tail of a window that a step cut short
        # (see propose) is kept as the next window; so is any run-ahead that was asked for.
        self._keep_cut_tail = speculation.mode is SpecMode.PLUGIN or speculation.runahead_tokens > 0

    @property
    def failures(self) -> int:
        """Calls into the plugins or a proposer that raised, and failed calls and invalid
        answers inside an in-process proposer (the n-gram plugin, a draft decode): each cost
        only its proposals."""
        local = self._local.failures if self._local is not None else 0
        return self.plugin_failures + local

    def close(self) -> None:
        if self._ngram is not None:
            self._ngram.close()

    # ---------------------------------------------------------------- each request's stream

    def begin(self, r: RequestState, session: str | None, prompt: Sequence[int]) -> None:
        """``r`` starts in its lane (``r.reused`` set): its window, and the plugins' begin."""
        if self._proposer is not None:
            r.window = AdaptiveWindow()
        if self._gate is not None:
            r.gate = LaneGate()
        if self.streams:
            r.plugin_commits = []
            for plugins in self.streams:
                self._to_plugins(plugins.begin, r.id, session, prompt, r.reused)

    def _to_plugins(self, call: Callable[..., object], *args: object) -> None:
        """One call into the plugins' link; its failure is counted, never the request's."""
        try:
            call(*args)
        except Exception:  # noqa: BLE001 - a plugin can lose only its own observations
            self.plugin_failures += 1

    def hand_commits(self, r: RequestState) -> None:
        """The tokens ``r`` committed since the last hand-over, as one delta."""
        pending = r.plugin_commits
        if pending:
            r.plugin_commits = []
            for plugins in self.streams:
                self._to_plugins(plugins.commit, r.id, pending)
            gate = r.gate
            if gate is not None and gate.shadow:
                decided = gate.committed(pending)
                if decided is not None and self._gate is not None:
                    # A proposal it did not verify: it counts for the lane's acceptance as a
                    # verified one would.
                    self._gate.record(gate, *decided)

    def end(self, r: RequestState, done: GenDone) -> None:
        """The plugins' last word on ``r``: the outcome of a window it ended inside
        (``stopped``) or of proposals a failed step never verified (``execution_failed``), then
        its stop reason and figures when it completed (the final committed suffix goes with
        them), else an abort with the reason."""
        proposer = self._proposer
        window, r.open_window = r.open_window, None
        if proposer is not None:
            if window is not None:
                self._to_plugins(proposer.outcome, r.id, window[0], window[1], _STOPPED)
            elif r.draft and done.outcome is GenerationOutcome.FAILED:
                discarded = len(r.draft)
                self._to_plugins(proposer.outcome, r.id, discarded, 0, _DISCARDED, _FAILED_STEP)
        if r.plugin_commits is None:
            return
        self.hand_commits(r)
        r.plugin_commits = None
        if done.outcome is not GenerationOutcome.COMPLETED:
            # The plugin ABI's abort reasons are the stop reasons cancelled/timeout/error.
            stop = done.stop_reason
            reason = stop.value if stop in (StopReason.CANCELLED, StopReason.TIMEOUT) else "error"
            for plugins in self.streams:
                self._to_plugins(plugins.abort, r.id, reason)
            return
        for plugins in self.streams:
            self._to_plugins(plugins.finish, r.id, done.stop_reason, done.figures)

    # ---------------------------------------------------------------- a step's proposals

    def propose(
        self,
        decoding: list[RequestState],
        chunks: Sequence[tuple[RequestState, int]] = (),
        arrival_may_wait: bool = False,
    ) -> None:
        """Each decoding lane's proposals for this step, as many as its window, its lane's
        context and its ``max_tokens`` leave room for (every committed proposal and the token
        sampled after the last one count): the run-ahead of its last answer when that still
        holds, else one query to the proposer for all the lanes that need one. With ``--spec
        auto`` the gate then keeps the proposals that pay (``chunks``: the step's prompt
        chunks, which share its passes; ``arrival_may_wait``: a request is due and would wait
        for this step, which then verifies none)."""
        self._step_plan = None
        limit = self._spec.lane_limit(len(decoding))
        gated = self._gate is not None
        tokens_per_lane = self._kv.tokens_per_lane
        wants: dict[str, int] = {}
        for r in decoding:
            window = r.window
            lane = r.lane
            if window is None or lane is None:
                continue
            # pending_token goes to len(lane.tokens); proposals to the positions after it.
            # With --spec auto the gate picks each window's length from its acceptance and
            # costs; the adaptive window bounds the other modes.
            room = min(
                limit,
                limit if gated else window.window,
                tokens_per_lane - len(lane.tokens) - 1,
                r.spec.max_tokens - r.generated_tokens - 1,
            )
            if room <= 0:
                r.draft = []
            elif r.runahead:  # the last answer's next window still holds: no query
                r.draft, r.runahead = r.runahead[:room], r.runahead[room:]
            else:
                wants[r.id] = room
        if wants:
            self._ask(decoding, wants)
        if self._gate is not None:
            if wants:
                self._cap_by_agreement(decoding, wants)
            self._gate_step(decoding, chunks, arrival_may_wait)
            return
        if not self._kv.unified and len(decoding) > 1:
            # With one KV stream per lane llama.cpp cuts a batch into micro-batches that take
            # the same number of tokens from each sequence (split_equal): lanes with longer
            # windows than others would cost whole extra forward passes. So every lane
            # verifies as many proposals as the one with the fewest (none if one has none).
            shortest = min(len(r.draft) for r in decoding)
            keep_tail = self._keep_cut_tail
            for r in decoding:
                if len(r.draft) > shortest:
                    if keep_tail:  # the cut tail still follows the shorter window: run-ahead
                        r.runahead = r.draft[shortest:] + r.runahead
                    r.draft = r.draft[:shortest]

    def _cap_by_agreement(self, decoding: list[RequestState], asked: dict[str, int]) -> None:
        """``--spec auto``: a fresh proposal is at most half as long as its source has agreed
        with the request's text (at least one token). A copy followed for ``m`` tokens tends to
        go on for about as long again, and breaks where the request changes what it copies:
        the gate's cost and acceptance figures alone verify too far past such a break
        (docs/BENCHMARKS.md, section 7.4: the repetitive prompts replayed)."""
        plugin, ngram = self._ngram_plugin, self._ngram
        if plugin is None or ngram is None:
            return
        for r in decoding:
            if not r.draft or r.id not in asked:
                continue
            ids = ngram.ids(r.id)
            if ids is not None:
                cap = max(1, plugin.agreement(ids) // 2)
                if len(r.draft) > cap:
                    r.draft = r.draft[:cap]

    def _gate_step(
        self,
        decoding: list[RequestState],
        chunks: Sequence[tuple[RequestState, int]],
        arrival_may_wait: bool,
    ) -> None:
        """``--spec auto``: the lanes whose proposals pay verify them (as many as pay); the
        others' proposals become shadows, compared with what the lane commits next."""
        gate = self._gate
        assert gate is not None
        rows: list[tuple[int, int]] = []
        candidates: list[Candidate] = []
        by_seq: dict[int, RequestState] = {}
        for r in decoding:
            lane = r.lane
            assert lane is not None
            rows.append((lane.seq, 1))
            if r.draft and r.gate is not None:
                by_seq[lane.seq] = r
                candidates.append(Candidate(lane.seq, len(r.draft), r.gate))
        chosen: dict[int, int] = {}
        if candidates:
            switched: list[LaneGate] = []
            if not chunks and not arrival_may_wait:
                chosen, switched = gate.choose(rows, candidates, len(decoding))
            # A step that carries a prompt verifies nothing: windows beside a chunk would delay
            # that request's first token by their forward pass, for a step in a prompt's life.
            # Nor does a step that a request due now would wait for (spec_gate, "Bound").
            for seq, r in by_seq.items():
                length = chosen.get(seq, 0)
                lane_gate = r.gate
                assert lane_gate is not None
                if length:
                    lane_gate.shadow = []  # its verified window measures it now
                elif not lane_gate.shadow:
                    # Not verified (or not all of it): what it would have given is measured
                    # against what the lane commits.
                    lane_gate.shadow, lane_gate.shadow_matched = r.draft, 0
                r.draft = r.draft[:length]
            for lane_gate in switched:
                self._switched(lane_gate, decoding, gate)
        if not chunks:
            proposed = sum(chosen.values())
            added = gate.added_passes(rows, chosen) if proposed else 0
            self._step_plan = (len(decoding), proposed, added)

    def _switched(self, lane_gate: LaneGate, decoding: list[RequestState], gate: SpecGate) -> None:
        if self._emit is None:
            return
        for r in decoding:
            if r.gate is lane_gate:
                acceptance = round(lane_gate.acceptance(gate.prior) * 100.0, 1)
                self._emit(GenSpecSwitched(r.id, lane_gate.on, acceptance, len(decoding)))
                return

    def stepped(self, decode_s: float) -> None:
        """This step's ``llama_decode`` took ``decode_s`` seconds: what the gate learns."""
        plan, self._step_plan = self._step_plan, None  # a step that proposed nothing plans none
        gate = self._gate
        if plan is None or gate is None:
            return
        lanes, proposed, added = plan
        if proposed:
            gate.costs.observe_speculated(lanes, proposed, added, decode_s)
        else:
            gate.costs.observe_plain(lanes, decode_s)

    def _ask(self, decoding: list[RequestState], wants: dict[str, int]) -> None:
        """The proposer's proposals for this step's lanes (a sidecar's waited for at most their
        deadline; a late answer proposes nothing and is counted on the request)."""
        proposer = self._proposer
        assert proposer is not None
        ahead = self._spec.runahead_tokens
        try:
            answers = proposer.propose({rid: room + ahead for rid, room in wants.items()})
            late = proposer.late()
        except Exception:  # noqa: BLE001 - no proposal is the worst a proposer can do
            self.plugin_failures += 1
            return
        for r in decoding:
            room = wants.get(r.id)
            if room is None:
                continue
            if r.id in late:
                r.spec_late += 1
            answer = answers.get(r.id, [])
            # Past the window: the token expected after it, then the next window (run-ahead).
            r.draft, r.runahead = answer[:room], answer[room:]

    # ---------------------------------------------------------------- verification

    def verify(self, r: RequestState, index: int, now: float) -> None:
        """Verify ``r``'s proposals against this step's logits from ``index`` on: commit
        position after position while the sampled token is the proposed one (the sampler saw
        the same logits as without them), then drop the KV of the proposals that were not
        committed."""
        draft = r.draft
        r.draft = []
        lane = r.lane
        assert lane is not None
        kv_end = len(lane.tokens) + len(draft)  # the pending token is in lane.tokens already
        accepted = 0
        running = True
        # Counted before the commits: a commit may end the request, and its terminal (the
        # receipt) is made right then.
        r.spec_windows += 1
        r.spec_proposed += len(draft)
        # Its outcome so far: a commit that ends the request delivers it (end: ``stopped``).
        window = r.open_window = [len(draft), 0]
        for offset in range(len(draft) + 1):
            token = self._sample(r, index + offset)
            matches = offset < len(draft) and token == draft[offset]
            if matches:
                r.spec_accepted += 1
                window[1] += 1
            if not self._commit(r, token, now):
                running = False
                break
            if matches:
                lane.tokens.append(token)  # decoded in this step already: not pending
                accepted += 1
                continue
            break
        if running and r.runahead:
            self.check_runahead(r, token, whole=accepted == len(draft))
        if r.window is not None:
            r.window.verified(len(draft), accepted, self._spec.draft_tokens)
        if r.gate is not None and self._gate is not None:
            self._gate.record(r.gate, len(draft), accepted)
        if running:  # else the request's end told the proposer (``stopped``)
            r.open_window = None
            if self._proposer is not None:
                kind = _FULL if accepted == len(draft) else _MISMATCH
                self._to_plugins(self._proposer.outcome, r.id, len(draft), accepted, kind)
        if len(lane.tokens) < kv_end:
            self._kv.trim(lane)

    def check_runahead(self, r: RequestState, token: int, whole: bool) -> None:
        """Keep ``r``'s run-ahead proposals as its next window when its window verified
        ``whole`` and ``token`` (sampled after it, now pending) is the one they expected;
        otherwise they are stale: dropped unexecuted and counted."""
        if whole and r.runahead[0] == token:
            del r.runahead[0]
            return
        stale = len(r.runahead)
        r.spec_discarded += stale
        r.runahead = []
        if self._proposer is not None:
            self._to_plugins(self._proposer.outcome, r.id, stale, 0, _DISCARDED, _STALE)


def _one_pass(_rows: Sequence[tuple[int, int]]) -> int:
    """A unified KV decodes any batch in one pass (``llama_batch_allocr::split_simple``)."""
    return 1
