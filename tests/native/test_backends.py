"""ggml's registry and llama.cpp's per-device memory breakdown through ctypes, on real llama.cpp
(tiny.gguf)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from skippyctl.native.backends import HOST_DEVICE, GgmlBackends
from tests.native.buffer_types import weights_fit_the_model


@pytest.fixture(scope="module", params=[True, False], ids=["extra-bufts", "no-extra-bufts"])
def use_extra_bufts(request: pytest.FixtureRequest) -> bool:
    """Whether llama.cpp may place weights in extra buffer types (its default) or not."""
    return bool(request.param)


@pytest.fixture(scope="module")
def model(fixture_dir: Path, use_extra_bufts: bool) -> Iterator[Any]:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = use_extra_bufts
    loaded = llama_cpp.llama_model_load_from_file(os.fsencode(fixture_dir / "tiny.gguf"), params)
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


def test_the_registry_lists_the_cpu_and_never_an_rpc_device() -> None:
    ggml = GgmlBackends()
    assert "CPU" in ggml.backends()
    devices = ggml.devices()
    cpu = next(d for d in devices if d.name == "CPU")
    assert cpu.kind == "cpu" and cpu.memory_total_bytes > 0
    assert all(not d.name.startswith("RPC") for d in devices)


@pytest.mark.parametrize("context_tokens", [512, 2048])
def test_the_breakdown_is_llama_cpps_own_figures_per_device(
    model: Any, use_extra_bufts: bool, context_tokens: int
) -> None:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = context_tokens
    params.n_seq_max = 1
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    try:
        breakdown = GgmlBackends().memory_breakdown(context)
    finally:
        llama_cpp.llama_free(context)
    if breakdown is None:
        pytest.skip("no breakdown on this platform (x86-64 Linux only)")
    (host,) = breakdown
    assert host.device == HOST_DEVICE
    model_size = llama_cpp.llama_model_size(model)
    if use_extra_bufts:
        assert weights_fit_the_model(host.weights_bytes, model_size, host.device)
    else:
        assert host.weights_bytes == model_size
    n_layer = llama_cpp.llama_model_n_layer(model)
    head_dim = llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)
    kv_heads = llama_cpp.llama_model_n_head_kv(model)
    assert host.kv_bytes == 2 * n_layer * kv_heads * head_dim * 2 * context_tokens  # f16 K and V
    assert host.compute_bytes > 0


def test_the_cpu_offers_its_buffer_types_on_the_host() -> None:
    """The CPU's default buffer type and its extra ones all count on the CPU device."""
    types = GgmlBackends().buffer_types()
    cpu = [b for b in types if b.device == HOST_DEVICE]
    assert any(not b.extra for b in cpu)
    assert len({b.name for b in types}) == len(types)


def test_no_context_has_no_breakdown() -> None:
    assert GgmlBackends().memory_breakdown(None) is None
