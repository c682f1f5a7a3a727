"""A draft model's proposals (``load MODEL --draft DRAFT.gguf``): a second, smaller llama.cpp
model in the engine process that greedily continues each decoding request's text.

:class:`DraftModel` is a proposer like any other: it implements the engine's serving-plugin
calls (``ServingPlugins``, ``engine/speculation.py``) — begin, commit, propose, late, outcome,
finish, abort — so the decode core asks it exactly as it asks the n-gram plugin or the
sidecars. One ``propose`` call answers every decoding request, which suits its one batched
``llama_decode`` per drafted position.

It owns the draft's context (one KV sequence per lane of the target, so as many sequences as
requests can run at once), one ``llama_batch`` and a greedy sampler. ``begin`` gives a request
the free sequence whose KV shares the longest prefix with its prompt (a session's next request
finds its last one's) and ``finish``/``abort`` free it again, keeping its KV for that; for each
sequence it mirrors which tokens the draft's KV holds (``_held``), and for each request its
committed text (prompt + committed tokens, from ``begin`` and ``commit``). :meth:`propose` takes
how many tokens to propose for each request:

1. catch up: keep the draft KV's longest prefix that is still the request's text (a rejected
   proposal, another request before: the rest is removed with ``llama_memory_seq_rm``) and
   decode the text past it — the whole prompt the first time, a few committed tokens
   afterwards — all requests in one batch (chunked at the batch size), logits for each one's
   last token;
2. draft: sample each request's next token greedily, then decode those tokens (one a request,
   one batch) for the next, until every request has its ``room``.

The draft's KV then holds every proposal but the last; the next call keeps what the target
accepted. Greedy drafting is what speculative decoding verifies best: the target's sampler
commits a proposed token only where it samples the same one (``engine/proposals.py``), so
the committed text never depends on the draft. Decode thread only; token ids stay here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

from skippyctl.engine.lanes import common_prefix
from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.api import DiscardReason, OutcomeKind

DRAFT_BATCH_TOKENS: Final = 512
"""Slots of the draft's batch (and its context's n_batch): a catch-up longer than this is
decoded in chunks."""


_NOBODY_LATE: Final[frozenset[str]] = frozenset()


class DraftFailed(RuntimeError):
    """The draft's llama_decode failed: no proposals this step (the target decodes on)."""

    def __init__(self, return_code: int) -> None:
        super().__init__(f"llama_decode returned {return_code}")
        self.return_code = return_code


@dataclass(slots=True)
class _Drafting:
    seq: int
    """The draft KV sequence the request drafts in."""
    text: list[int] = field(default_factory=list)
    """Its prompt and committed tokens, in order."""


class DraftModel:
    """A draft model's context and its per-lane KV mirror (module docstring)."""

    def __init__(
        self,
        llama: ModuleType,
        model: Any,
        context: Any,
        lanes: int,
        on_failure: Callable[[int, int], None] | None = None,
    ) -> None:
        self._llama = llama
        self._on_failure = on_failure
        """Told each failed draft decode's return code and the requests it drafted for."""
        self._model = model
        self._ctx = context
        self._memory = llama.llama_get_memory(context)
        self._batch = llama.llama_batch_init(DRAFT_BATCH_TOKENS, 0, 1)
        for i in range(DRAFT_BATCH_TOKENS):
            self._batch.n_seq_id[i] = 1
        self._sampler = llama.llama_sampler_init_greedy()
        self._held: list[list[int]] = [[] for _ in range(lanes)]
        """Per sequence id: the tokens the draft's KV holds, in position order."""
        self._free = set(range(lanes))
        """Sequences no running request drafts in."""
        self._requests: dict[str, _Drafting] = {}
        self.failures = 0
        """Draft decodes that failed (each cost one step's proposals)."""
        llama.llama_memory_clear(self._memory, False)

    @property
    def model(self) -> Any:
        return self._model

    @property
    def context(self) -> Any:
        return self._ctx

    # ---- the engine's serving-plugin calls (decode thread) ----

    def begin(self, request: str, session: str | None, prompt: Sequence[int], reused: int) -> None:
        """Give ``request`` the free sequence that holds the longest prefix of ``prompt``. With
        none free (more requests than lanes: not expected) it is not drafted for."""
        if request in self._requests or not self._free:
            return
        text = list(prompt)
        seq = max(sorted(self._free), key=lambda s: common_prefix(self._held[s], text))
        self._free.discard(seq)
        self._requests[request] = _Drafting(seq, text)

    def commit(self, request: str, tokens: Sequence[int]) -> None:
        drafting = self._requests.get(request)
        if drafting is not None:
            drafting.text.extend(tokens)

    def propose(self, wants: Mapping[str, int]) -> dict[str, list[int]]:
        """Request id → how many to propose → the draft's greedy continuation of its text."""
        by_seq: dict[int, tuple[list[int], int]] = {}
        requests: list[tuple[str, int]] = []
        for request, room in wants.items():
            drafting = self._requests.get(request)
            if drafting is None or room <= 0 or not drafting.text:
                continue
            by_seq[drafting.seq] = (drafting.text, room)
            requests.append((request, drafting.seq))
        drafted = self._propose(by_seq)
        return {request: drafted[seq] for request, seq in requests if drafted.get(seq)}

    def late(self) -> frozenset[str]:
        """Nobody: the draft answers before :meth:`propose` returns."""
        return _NOBODY_LATE

    def outcome(
        self,
        request: str,
        proposed: int,
        accepted: int,
        kind: OutcomeKind,
        reason: DiscardReason | None = None,
    ) -> None:
        """Nothing to learn: the next catch-up keeps what was accepted."""

    def finish(self, request: str, stop_reason: StopReason, figures: GenerationFigures) -> None:
        self._release(request)

    def abort(self, request: str, reason: str) -> None:
        self._release(request)

    def _release(self, request: str) -> None:
        """``request`` is over: its sequence is free, its KV kept for a later prefix."""
        drafting = self._requests.pop(request, None)
        if drafting is not None:
            self._free.add(drafting.seq)

    # ---- drafting ----

    def _propose(self, wants: Mapping[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        """Sequence id → (the request's committed text, how many to propose) → proposals."""
        if not wants:
            return {}
        try:
            last = self._catch_up(wants)
            return self._draft(wants, last)
        except DraftFailed as failed:
            self.failures += 1
            if self._on_failure is not None:
                self._on_failure(failed.return_code, len(wants))
            for seq in wants:  # the KV state is not known after a failed decode: start over
                self._forget(seq)
            return {}

    def _forget(self, seq: int) -> None:
        self._llama.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self._held[seq] = []

    def _catch_up(self, wants: Mapping[int, tuple[list[int], int]]) -> dict[int, int]:
        """Decode each lane's text past what the draft holds; the batch index of each lane's
        last token in the final chunk (where its logits are)."""
        pending: list[tuple[int, int, int]] = []  # (seq, position, token)
        # Ascending sequence ids: with one KV stream per lane llama.cpp splits a batch into
        # micro-batches of consecutive increasing ids (see engine/batch.py).
        for seq, (text, _room) in sorted(wants.items()):
            held = self._held[seq]
            size = len(held)
            # The usual case: the text extends what is held (one slice compare, in C).
            keep = size if text[:size] == held else common_prefix(held, text)
            keep = min(keep, len(text) - 1)  # the last token is decoded again for its logits
            if keep < size:
                self._llama.llama_memory_seq_rm(self._memory, seq, keep, -1)
                del held[keep:]
            pending += [(seq, pos, int(text[pos])) for pos in range(keep, len(text))]
        last: dict[int, int] = {}
        for start in range(0, len(pending), DRAFT_BATCH_TOKENS):
            chunk = pending[start : start + DRAFT_BATCH_TOKENS]
            final = {seq: i for i, (seq, _pos, _tok) in enumerate(chunk)}
            self._decode(chunk, set(final.values()))
            last.update(final)
        return last

    def _draft(
        self, wants: Mapping[int, tuple[list[int], int]], last: dict[int, int]
    ) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {seq: [] for seq in wants}
        rows = dict(last)  # seq → its logits row in the last decoded batch
        while rows:
            step: list[tuple[int, int, int]] = []
            for seq, row in rows.items():
                token = int(self._llama.llama_sampler_sample(self._sampler, self._ctx, row))
                out[seq].append(token)
                if len(out[seq]) < wants[seq][1]:
                    step.append((seq, len(self._held[seq]), token))
            if not step:
                break
            step.sort()
            self._decode(step, set(range(len(step))))
            rows = {seq: i for i, (seq, _pos, _tok) in enumerate(step)}
        return out

    def _decode(self, entries: Sequence[tuple[int, int, int]], logits: set[int]) -> None:
        batch = self._batch
        for i, (seq, pos, token) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if i in logits else 0
        batch.n_tokens = len(entries)
        result = int(self._llama.llama_decode(self._ctx, batch))
        if result != 0:
            raise DraftFailed(result)
        for seq, _pos, token in entries:
            self._held[seq].append(token)

    def free(self) -> None:
        """Free the batch, the sampler, the context and the model (once)."""
        llama = self._llama
        if self._sampler is not None:
            llama.llama_sampler_free(self._sampler)
            self._sampler = None
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            llama.llama_model_free(self._model)
