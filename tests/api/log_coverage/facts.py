"""The table of facts the log-coverage tests check (package docstring): per row its area and
name, the pattern of the log lines that state it, its check, and either the event ids that must
carry it, why none does (``gap``), or that llama.cpp logs no line for it here (``absent``). The
rows render, in this order, into docs/LOG_COVERAGE.md (``test_document.py``)."""

from __future__ import annotations

from typing import Final

from tests.api.log_coverage.checks import (
    ARCH,
    BUFFER_FALLBACK,
    COMPUTE_BUFFER,
    CTX_BELOW_TRAIN,
    CTX_BELOW_TRAIN_EVENTS,
    DEVICE_EVENTS,
    FILE_OPEN,
    FILE_SIZE,
    FILE_TYPE,
    FLASH_ATTN,
    GRAPH_RESERVE,
    KV_BUFFER,
    KV_CELLS,
    KV_TYPES,
    LAYER_DEVICE,
    MEMORY_EVENTS,
    MODEL_BUFFER,
    N_BATCH,
    N_CTX,
    N_CTX_SEQ,
    N_CTX_TRAIN,
    N_LAYER,
    N_SEQ_MAX,
    N_VOCAB,
    OFFLOADED,
    PARAMS,
    SPLIT_PARTS,
    TENSOR_COUNT,
    TENSORS_LOADING,
    WARM_UP,
    check_buffer_fallback,
    check_buffers,
    check_context,
    check_cpu_fallback,
    check_ctx_below_train,
    check_file_open,
    check_file_size,
    check_flash_attention,
    check_graph_reserved,
    check_kv_cells,
    check_layer_device,
    check_named,
    check_offloaded,
    check_params,
    check_returned,
    check_split_parts,
    check_tensor_count,
    check_tensors_loaded,
    check_warm_up,
)
from tests.api.log_coverage.evidence import Fact

FACTS: Final[tuple[Fact, ...]] = (
    Fact(
        "file open",
        "model file opened",
        FILE_OPEN,
        check_file_open,
        ("model_load_started", "native_model_load_completed"),
    ),
    Fact(
        "file open",
        "model size",
        FILE_SIZE,
        check_file_size,
        ("native_model_load_completed",),
    ),
    Fact(
        "file open",
        "split set: files opened",
        SPLIT_PARTS,
        check_split_parts,
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "architecture name",
        ARCH,
        check_named(ARCH, "arch"),
        gap="a name (`general.architecture`): events carry no free text by design, only "
        "numeric summaries under closed keys and enum values",
    ),
    Fact(
        "architecture",
        "file type (quantization)",
        FILE_TYPE,
        check_named(FILE_TYPE, "type"),
        gap="a type name: events carry no free text by design (llama.h's "
        "`llama_model_ftype` is a number, but no summary key or published vocabulary of "
        "its values exists yet)",
    ),
    Fact(
        "architecture",
        "parameters",
        PARAMS,
        check_params,
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "layers",
        N_LAYER,
        check_returned(N_LAYER, "n_layer", "native_model_load_completed", "layers"),
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "training context",
        N_CTX_TRAIN,
        check_returned(
            N_CTX_TRAIN, "n_ctx_train", "native_model_load_completed", "context_train_tokens"
        ),
        ("native_model_load_completed",),
    ),
    Fact(
        "tokenizer/vocab",
        "vocabulary size",
        N_VOCAB,
        check_returned(N_VOCAB, "n_vocab", "native_model_load_completed", "vocab_size"),
        ("native_model_load_completed",),
    ),
    Fact(
        "tensor loading",
        "tensors loaded",
        TENSORS_LOADING,
        check_tensors_loaded,
        ("model_load_progress", "model_load_phase_changed"),
    ),
    Fact(
        "tensor loading",
        "tensor count",
        TENSOR_COUNT,
        check_tensor_count,
        gap="llama.h has no tensor count (a split set's `split.tensors.count` metadata is "
        "the only one, and a single file has none)",
    ),
    Fact(
        "offload/device",
        "device the layers are on",
        LAYER_DEVICE,
        check_layer_device,
        DEVICE_EVENTS,
    ),
    Fact(
        "offload/device",
        "layers offloaded",
        OFFLOADED,
        check_offloaded,
        gap="llama.h reports no applied offload, and the logged N is min(`n_gpu_layers`, "
        "n_layer + 1) of n_layer + 1, printed with or without a GPU (`gpu` logs 3/3 with "
        "every layer on the CPU), so an event could only restate the request. Where the "
        "layers are is `device_selected`, a fallback's request `gpu_layers` of "
        "`cpu_fallback_activated`, n_layer `layers`",
    ),
    Fact(
        "memory buffers",
        "model (weights) buffers",
        MODEL_BUFFER,
        check_buffers(MODEL_BUFFER, "weights_bytes", figures_vary=True),
        MEMORY_EVENTS,
    ),
    Fact(
        "memory buffers",
        "compute buffers",
        COMPUTE_BUFFER,
        check_buffers(COMPUTE_BUFFER, "compute_bytes"),
        MEMORY_EVENTS,
    ),
    Fact("KV cache", "KV buffers", KV_BUFFER, check_buffers(KV_BUFFER, "kv_bytes"), MEMORY_EVENTS),
    Fact(
        "KV cache",
        "KV cells and sequences",
        KV_CELLS,
        check_kv_cells,
        ("kv_cache_initialization_completed", "serving_backend_initialization_completed"),
    ),
    Fact(
        "KV cache",
        "KV cache types",
        KV_TYPES,
        check_named(KV_TYPES, "K/V", (1, 2)),
        gap="type names: events carry no free text by design",
    ),
    Fact(
        "context",
        "context size",
        N_CTX,
        check_context(N_CTX, "context_tokens"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "context per sequence",
        N_CTX_SEQ,
        check_context(N_CTX_SEQ, "context_tokens_per_lane"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "sequences (lanes)",
        N_SEQ_MAX,
        check_context(N_SEQ_MAX, "lanes"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "batch size",
        N_BATCH,
        check_returned(
            N_BATCH, "n_batch", "serving_backend_initialization_completed", "batch_tokens"
        ),
        ("serving_backend_initialization_completed",),
    ),
    Fact(
        "context",
        "flash attention",
        FLASH_ATTN,
        check_flash_attention,
        ("serving_backend_initialization_completed",),
    ),
    Fact(
        "warm-up",
        "graph reservation",
        GRAPH_RESERVE,
        check_graph_reserved,
        ("model_load_phase_changed",),
    ),
    Fact(
        "warm-up",
        "warm-up run",
        WARM_UP,
        check_warm_up,
        absent=True,
    ),
    Fact(
        "warnings/fallbacks",
        "CPU fallback for GPU layers",
        OFFLOADED,
        check_cpu_fallback,
        ("cpu_fallback_activated", "fallback_applied"),
    ),
    Fact(
        "warnings/fallbacks",
        "buffer type fallback",
        BUFFER_FALLBACK,
        check_buffer_fallback,
        needs_extra_buffer_type=True,
        gap="a buffer type name, per tensor: llama.h reports no buffer type choice and events "
        "carry no free text by design (the bytes each device holds are in "
        "`model_memory_allocation_summary`)",
    ),
    Fact(
        "warnings/fallbacks",
        "context below training context",
        CTX_BELOW_TRAIN,
        check_ctx_below_train,
        CTX_BELOW_TRAIN_EVENTS,
    ),
)
