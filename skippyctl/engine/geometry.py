"""How many lanes a serving context gets, and how many tokens of context each.

:func:`plan_context` decides it once per load from what the operator asked (either may be left
out) and what the model and the machine allow. Pure: no llama.cpp, no I/O (the worker reads the
model's numbers and the free memory and passes them in).

Rules (the KV cache is always split: each lane owns ``per_lane`` cells, so one request can never
starve the others of KV, and a lane that fills ends only its own request):

- ``--lanes`` left out: up to :data:`AUTO_LANES` lanes (llama-server's ``-np`` auto is 4 too),
  so concurrent requests batch by default. With an explicit ``--ctx`` they must each keep at
  least :data:`MIN_AUTO_TOKENS_PER_LANE` tokens (``--ctx`` is the whole context, as it always
  was): ``--ctx 2048`` gets 2 lanes, ``--ctx 512`` one.
- ``--ctx`` left out: each lane gets the model's training context, at most
  :data:`MAX_AUTO_TOKENS_PER_LANE`; the whole KV cache must fit in
  :data:`KV_MEMORY_SHARE` of the memory that is free now, else each lane gets less (whole
  multiples of :data:`CELL_PADDING_TOKENS`, never under one of them). The plan says when that
  happened (``memory_capped``).
- Both given: as given (``context_tokens`` split evenly across ``lanes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

AUTO_LANES: Final = 4
MAX_AUTO_TOKENS_PER_LANE: Final = 4096
MIN_AUTO_TOKENS_PER_LANE: Final = 1024
KV_MEMORY_SHARE: Final = 0.5
CELL_PADDING_TOKENS: Final = 256
"""llama.cpp pads each sequence's cells to a multiple of 256."""


@dataclass(frozen=True, slots=True)
class ContextPlan:
    lanes: int
    context_tokens: int
    """The whole context (``n_ctx``), ``lanes × per_lane``."""
    lanes_auto: bool
    context_auto: bool
    memory_capped: bool = False

    @property
    def tokens_per_lane(self) -> int:
        return self.context_tokens // self.lanes


def plan_context(
    *,
    lanes: int | None,
    context_tokens: int | None,
    train_tokens: int,
    kv_bytes_per_token: int,
    free_memory_bytes: int | None,
) -> ContextPlan:
    """The plan for a load (see the module docstring). ``lanes`` and ``context_tokens`` are
    the operator's (None: decide); ``train_tokens`` 0 or less means unknown."""
    if lanes is not None and lanes < 1:
        raise ValueError("lanes must be >= 1")
    if context_tokens is not None and context_tokens < 1:
        raise ValueError("context_tokens must be >= 1")
    if context_tokens is not None:
        if lanes is None:
            fitting = context_tokens // MIN_AUTO_TOKENS_PER_LANE
            chosen = max(1, min(AUTO_LANES, fitting))
            return ContextPlan(chosen, context_tokens, lanes_auto=True, context_auto=False)
        return ContextPlan(lanes, context_tokens, lanes_auto=False, context_auto=False)
    chosen = AUTO_LANES if lanes is None else lanes
    per_lane = MAX_AUTO_TOKENS_PER_LANE
    if train_tokens > 0:
        per_lane = min(per_lane, train_tokens)
    capped = False
    if free_memory_bytes is not None and kv_bytes_per_token > 0:
        budget_tokens = int(free_memory_bytes * KV_MEMORY_SHARE) // kv_bytes_per_token
        fitting = budget_tokens // chosen // CELL_PADDING_TOKENS * CELL_PADDING_TOKENS
        if fitting < per_lane:
            per_lane = max(CELL_PADDING_TOKENS, fitting)
            capped = True
    return ContextPlan(
        chosen,
        chosen * per_lane,
        lanes_auto=lanes is None,
        context_auto=True,
        memory_capped=capped,
    )


def kv_bytes_per_token(
    *, layers: int, embedding: int, heads: int, kv_heads: int, bytes_per_value: int = 2
) -> int:
    """An estimate of the KV cache's bytes per token (keys and values, every layer, f16 by
    default); 0 when the model's numbers are unknown."""
    if min(layers, embedding, heads, kv_heads) <= 0:
        return 0
    per_head = embedding // heads
    return 2 * layers * kv_heads * per_head * bytes_per_value


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The kernel's estimate of memory available without swapping (MemAvailable); None where
    it cannot be read (then no memory cap applies)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
