"""What a load will take in memory, said before any weight moves (``load --estimate``, the
runtime's memory budget).

Read from the GGUF's header (``acquisition/gguf_metadata.py``: no llama.cpp in the host) and
the load's options, with the engine's own context rule (``engine/geometry.py``):

- weights: the file's size (every part of a split set);
- KV cache: the context the load will get × the model's KV bytes per token (f16 keys and
  values, every layer), as ``plan_context`` decides it when ``ctx``/``lanes`` are left out;
- compute buffers: one micro-batch's logits (``n_ubatch`` × vocabulary × 4 bytes) and its
  activations (``n_ubatch`` × embedding × 4 bytes × :data:`ACTIVATION_COPIES`);
- a ``--draft`` model: its weights, and its KV cache for the same context (the engine's
  context plan counts both caches), and its compute buffers by the same rule.

Measured against llama.cpp's own figures (``model_memory_allocation_summary``) on the real
model with 2 lanes of 4096: KV 188,743,680 bytes estimated and allocated alike; compute
103,024,640 allocated, 110,100,480 estimated. A file whose header cannot be read is estimated by
its size alone (its load fails on its own later).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippyctl.acquisition.gguf_metadata import (
    GgufArray,
    GgufMetadataError,
    Scalar,
    read_metadata,
)
from skippyctl.config.load_options import LoadOptions
from skippyctl.engine.geometry import available_memory_bytes, kv_bytes_per_token, plan_context
from skippyctl.runtime.topology import model_bytes

UBATCH_TOKENS: Final = 512
"""llama.cpp's default ``n_ubatch``, which the engine keeps."""
ACTIVATION_COPIES: Final = 8
"""Activation tensors of one micro-batch alive at once in the compute buffer (a rough bound)."""


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    context_tokens: int | None
    lanes: int | None

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    @property
    def kv_bytes_per_lane(self) -> int | None:
        return None if not self.lanes else self.kv_bytes // self.lanes

    def document(self) -> dict[str, int | None]:
        return {
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_bytes_per_lane": self.kv_bytes_per_lane,
            "compute_bytes": self.compute_bytes,
            "total_bytes": self.total_bytes,
            "context_tokens": self.context_tokens,
            "lanes": self.lanes,
        }


def estimate_load(options: LoadOptions, free_memory_bytes: int | None = None) -> MemoryEstimate:
    """The memory ``options`` (``model`` a local GGUF path) will take once loaded. OSError when
    the file cannot be read at all."""
    path = Path(options.model)
    if not path.is_file():  # a directory, a FIFO (whose open would wait), a device: not a GGUF
        raise OSError(f"{path.name} is not a regular file")
    weights = model_bytes(path)
    shape = _shape(path)
    if shape is None:
        return MemoryEstimate(weights, 0, 0, options.ctx, options.lanes)
    shapes = [shape]
    if options.draft is not None:
        draft = Path(options.draft)
        if draft.is_file():
            weights += model_bytes(draft)
            draft_shape = _shape(draft)
            if draft_shape is not None:
                shapes.append(draft_shape)
    per_token = sum(
        kv_bytes_per_token(
            layers=s["layers"], embedding=s["embedding"], heads=s["heads"], kv_heads=s["kv_heads"]
        )
        for s in shapes
    )
    plan = plan_context(
        lanes=options.lanes,
        context_tokens=options.ctx,
        train_tokens=shape["train_tokens"],
        kv_bytes_per_token=per_token,
        free_memory_bytes=(
            available_memory_bytes() if free_memory_bytes is None else free_memory_bytes
        ),
    )
    compute = sum(
        UBATCH_TOKENS * 4 * (s["vocab"] + s["embedding"] * ACTIVATION_COPIES) for s in shapes
    )
    return MemoryEstimate(
        weights, plan.context_tokens * per_token, compute, plan.context_tokens, plan.lanes
    )


def _shape(path: Path) -> dict[str, int] | None:
    """The model's numbers the estimate needs, from its header; None when it cannot be read."""
    try:
        header = read_metadata(path)
    except (OSError, GgufMetadataError):  # estimated by size alone
        return None
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        return None
    heads = _number(header, f"{arch}.attention.head_count")
    tokens = header.get("tokenizer.ggml.tokens")
    return {
        "layers": _number(header, f"{arch}.block_count"),
        "embedding": _number(header, f"{arch}.embedding_length"),
        "heads": heads,
        "kv_heads": _number(header, f"{arch}.attention.head_count_kv") or heads,
        "train_tokens": _number(header, f"{arch}.context_length"),
        "vocab": tokens.length if isinstance(tokens, GgufArray) else 0,
    }


def _number(header: dict[str, Scalar | GgufArray], key: str) -> int:
    """A count from the header; a per-layer array (``head_count_kv`` of some models) counts by
    its largest value; 0 when absent or not a number."""
    value = header.get(key)
    if isinstance(value, GgufArray):
        return int(max(value.values or (0,)))
    return int(value) if isinstance(value, int | float) else 0
