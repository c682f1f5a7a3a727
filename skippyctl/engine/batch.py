"""The one ``llama_batch`` of an engine: filled once per decode step, decoded, reused.

Decode thread only. Every slot carries exactly one sequence id (the lane's). A step holds the
next token of every decoding lane (logits requested for each), followed, when the lane
speculates, by its proposed tokens (logits for each, to verify them), plus prompt chunks of
prefilling requests (logits only for a prompt's last token, and only when its chunk completes the
prompt).
Filling writes straight into the batch's C arrays: no per-step allocation beyond the list of the
step's participants, in ascending sequence order.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from skippyctl.engine.request_state import RequestState


def sequence_of(r: RequestState) -> int:
    assert r.lane is not None
    return r.lane.seq


def _first(entry: tuple[int, RequestState, int]) -> int:
    return entry[0]


def forward_passes(rows: Iterable[tuple[int, int]]) -> int:
    """How many forward passes llama.cpp makes of a batch with these ``(sequence id, tokens)``
    rows when every lane has its own KV stream (``llama_batch_allocr::split_equal`` with
    ``sequential``): each micro-batch is a run of consecutive sequence ids starting at the
    lowest one with tokens left, and takes as many tokens from each as the shortest has.
    So one lane prefilling 2 tokens beside three decoding 1 costs two passes, and decoding
    lanes 0 and 2 without 1 cost two as well. (A micro-batch's ``n_ubatch`` cap is left out:
    a step's prompt chunks stay within it.)"""
    left = sorted((seq, tokens) for seq, tokens in rows if tokens > 0)
    passes = 0
    while left:
        run = 1
        while run < len(left) and left[run][0] == left[run - 1][0] + 1:
            run += 1
        take = min(tokens for _seq, tokens in left[:run])
        # What the run has left keeps its order, ahead of the higher sequence ids after it.
        left = [(seq, tokens - take) for seq, tokens in left[:run] if tokens > take] + left[run:]
        passes += 1
    return passes


class StepBatch:
    """Owns a ``llama_batch`` of ``capacity`` slots (freed by :meth:`free`, once)."""

    __slots__ = ("_batch", "_freed", "_llama", "_logits", "_pos", "_seq", "_token", "capacity")

    def __init__(self, llama: ModuleType, capacity: int) -> None:
        self._llama = llama
        self.capacity = capacity
        self._batch = llama.llama_batch_init(capacity, 0, 1)
        self._token = self._batch.token
        self._pos = self._batch.pos
        self._logits = self._batch.logits
        self._seq = [self._batch.seq_id[i] for i in range(capacity)]
        n_seq_id = self._batch.n_seq_id
        for i in range(capacity):
            n_seq_id[i] = 1
        self._freed = False

    def fill(
        self, decoding: list[RequestState], chunks: list[tuple[RequestState, int]]
    ) -> list[RequestState]:
        """Lay out one step; the step's participants. Each decoding request's ``out_index`` is
        its logits row; each ``(request, take)`` chunk (``take`` prompt tokens from its
        ``prefill_pos``) gets one only when the chunk completes its prompt, else -1."""
        # Slots in ascending sequence id: with one KV stream per lane llama.cpp splits a batch
        # into micro-batches of consecutive increasing sequence ids only (llama_batch_allocr::
        # split_equal), and each micro-batch is a whole forward pass. Lanes decoding in the
        # order they started (say 2, 0, 3, 1) would cost three passes instead of one.
        # (sequence id, request, prompt tokens to take: 0 for a decoding lane's next token)
        slots = sum(take for _r, take in chunks) + sum(1 + len(r.draft) for r in decoding)
        if slots > self.capacity:  # the slots are raw memory: never written past
            raise ValueError(f"a step of {slots} tokens in a batch of {self.capacity}")
        entries: list[tuple[int, RequestState, int]] = [(sequence_of(r), r, 0) for r in decoding]
        entries += [(sequence_of(r), r, take) for r, take in chunks]
        if len(entries) > 1:
            entries.sort(key=_first)
        token, pos, logits, seq = self._token, self._pos, self._logits, self._seq
        n = 0
        for lane_seq, r, take in entries:
            if take:
                n = self._fill_prefill(n, r, lane_seq, take)
                continue
            lane = r.lane
            assert lane is not None
            at = len(lane.tokens)
            token[n] = r.pending_token
            pos[n] = at
            seq[n][0] = lane_seq
            logits[n] = 1
            r.out_index = n
            n += 1
            for proposed in r.draft:  # speculating: verified from the rows after out_index
                at += 1
                token[n] = proposed
                pos[n] = at
                seq[n][0] = lane_seq
                logits[n] = 1
                n += 1
        self._batch.n_tokens = n
        return [*decoding, *(r for r, _take in chunks)] if chunks else decoding

    def _fill_prefill(self, n: int, prefill: RequestState, lane_seq: int, take: int) -> int:
        """Write ``take`` prompt tokens of ``prefill`` from slot ``n``; the next free slot."""
        token, pos, logits, seq = self._token, self._pos, self._logits, self._seq
        start = prefill.prefill_pos
        prompt = prefill.prompt
        for i in range(start, start + take):
            token[n] = prompt[i]
            pos[n] = i
            seq[n][0] = lane_seq
            logits[n] = 0
            n += 1
        if start + take == len(prompt):
            logits[n - 1] = 1
            prefill.out_index = n - 1
        else:
            prefill.out_index = -1
        return n

    def decode(self, context: Any) -> int:
        """``llama_decode`` of the filled batch: 0 on success (llama.h return codes)."""
        return int(self._llama.llama_decode(context, self._batch))

    def free(self) -> None:
        if not self._freed:
            self._freed = True
            self._llama.llama_batch_free(self._batch)
