"""The step batch's layout (engine/batch.py) on a real `llama_batch` (no model needed).

With one KV stream per lane, llama.cpp splits a batch into micro-batches of consecutive,
increasing sequence ids only, and each micro-batch is a whole forward pass: the layout must put
every step's sequences in ascending order, the prefill chunk among them at its lane's place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine.batch import StepBatch
from skippyctl.engine.lanes import Lane
from skippyctl.engine.request_state import GenerateRequest, RequestState

llama: Any = llama_cpp


def _request(name: str, seq: int, tokens_in_lane: int, pending: int) -> RequestState:
    r = RequestState(GenerateRequest(name, prompt="p"), 0.0, None)
    r.lane = Lane(seq)
    r.lane.tokens = list(range(tokens_in_lane))
    r.pending_token = pending
    return r


def _prefilling(seq: int, prompt: list[int], done: int) -> RequestState:
    r = RequestState(GenerateRequest(f"p{seq}", prompt="p"), 0.0, None)
    r.lane = Lane(seq)
    r.prompt = prompt
    r.prefill_pos = done
    return r


@pytest.fixture
def batch() -> Iterator[StepBatch]:
    step = StepBatch(llama, 64)
    try:
        yield step
    finally:
        step.free()


def _slots(step: StepBatch) -> list[tuple[int, int, int, bool]]:
    """(sequence, token, position, wants logits) of every filled slot."""
    raw = step._batch  # the C struct: the layout is what llama_decode will see
    return [
        (raw.seq_id[i][0], raw.token[i], raw.pos[i], bool(raw.logits[i]))
        for i in range(raw.n_tokens)
    ]


def test_decoding_lanes_are_laid_out_in_ascending_sequence_order(batch: StepBatch) -> None:
    decoding = [_request(f"r{seq}", seq, 10 + seq, 100 + seq) for seq in (2, 0, 3, 1)]
    participants = batch.fill(decoding, [])
    assert participants == decoding  # the caller's list, untouched
    assert _slots(batch) == [(seq, 100 + seq, 10 + seq, True) for seq in range(4)]
    for r in decoding:
        assert r.lane is not None
        assert _slots(batch)[r.out_index][0] == r.lane.seq  # logits row of its own token


@pytest.mark.parametrize("prefill_seq", [0, 2, 5])
def test_a_prefill_chunk_takes_its_lanes_place_among_the_decoding_lanes(
    batch: StepBatch, prefill_seq: int
) -> None:
    decoding = [_request(f"r{seq}", seq, 4, 7) for seq in (4, 1, 3) if seq != prefill_seq]
    prefill = _prefilling(prefill_seq, [11, 12, 13, 14, 15], done=1)
    participants = batch.fill(decoding, [(prefill, 4)])
    assert participants == [*decoding, prefill]
    slots = _slots(batch)
    first_seen: list[int] = []
    for seq, _token, _pos, _logits in slots:
        if seq not in first_seen:
            first_seen.append(seq)
    assert first_seen == sorted(first_seen)
    chunk = [slot for slot in slots if slot[0] == prefill_seq]
    assert [(t, p) for _s, t, p, _l in chunk] == [(12, 1), (13, 2), (14, 3), (15, 4)]
    assert [wants for *_rest, wants in chunk] == [False, False, False, True]  # completes
    assert slots[prefill.out_index] == (prefill_seq, 15, 4, True)


def test_an_unfinished_prefill_chunk_asks_for_no_logits(batch: StepBatch) -> None:
    prefill = _prefilling(1, [5, 6, 7, 8], done=0)
    batch.fill([_request("r0", 0, 3, 9)], [(prefill, 2)])
    assert _slots(batch) == [(0, 9, 3, True), (1, 5, 0, False), (1, 6, 1, False)]
    assert prefill.out_index == -1


def test_several_prompt_chunks_interleave_with_decoding_lanes_by_sequence(
    batch: StepBatch,
) -> None:
    decoding = [_request("r3", 3, 2, 30), _request("r0", 0, 2, 31)]
    first, second = _prefilling(2, [1, 2, 3], done=0), _prefilling(1, [4, 5], done=1)
    participants = batch.fill(decoding, [(first, 3), (second, 1)])
    assert participants == [*decoding, first, second]
    assert [slot[0] for slot in _slots(batch)] == [0, 1, 2, 2, 2, 3]
    assert (first.out_index, second.out_index) == (4, 1)  # both prompts complete this step


def test_a_step_larger_than_the_batch_is_refused_before_a_slot_is_written(
    batch: StepBatch,
) -> None:
    """The slots are raw C memory: a step that does not fit raises instead of writing past
    them, and the batch keeps what it held."""
    fits = [_request("r0", 0, 4, 7)]
    fits[0].draft = [1] * 63
    batch.fill(fits, [])
    before = _slots(batch)
    over = _request("r1", 1, 4, 7)
    over.draft = [1] * 10
    with pytest.raises(ValueError, match="75 tokens in a batch of 64"):
        batch.fill([*fits, over], [])
    prefill = _prefilling(2, list(range(20)), done=0)
    with pytest.raises(ValueError, match="84 tokens"):
        batch.fill(fits, [(prefill, 20)])
    assert _slots(batch) == before
