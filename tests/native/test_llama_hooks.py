"""The real llama.cpp hooks point straight at our C functions; facts arrive through the ring."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.native import EngineAdapter, NativeLibrary, SharedIngress, devices
from skippyctl.native.abi import FailureCode, GgmlDeviceType, Kind, Lane, ProgressUnit, Status
from tests.native.helpers import FactRecord, drain_all_records, drain_records

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def tiny_gguf(fixture_dir: Path) -> Path:
    path = fixture_dir / "tiny.gguf"
    if not path.exists():
        pytest.skip(f"fixture model missing: {path.name} (skippyctl.fixtures not generated yet)")
    return path


@pytest.fixture(scope="module", autouse=True)
def ggml_resolved(lib: NativeLibrary) -> None:
    llama_cpp.llama_backend_init()
    assert devices.resolve_ggml(lib) == Status.OK


class Pipeline:
    """What the host's pipeline thread does: wait with the GIL released, drain, repeat."""

    def __init__(self, ingress: SharedIngress) -> None:
        self.ingress = ingress
        self.facts: list[FactRecord] = []
        self.first_progress = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-pipeline")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.ingress.wait(0.02):
                batch = drain_records(self.ingress)
                self.facts.extend(batch)
                if any(f.kind == Kind.MODEL_OPEN_PROGRESS for f in batch):
                    self.first_progress.set()

    def stop(self) -> list[FactRecord]:
        self._stop.set()
        self._thread.join()
        self.facts.extend(drain_all_records(self.ingress))
        return self.facts


def model_params(adapter: EngineAdapter) -> object:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.progress_callback = llama_cpp.llama_progress_callback(adapter.progress_callback_address)
    params.progress_callback_user_data = adapter.user_data
    return params


@pytest.fixture
def our_log_callback(adapter: EngineAdapter) -> Iterator[EngineAdapter]:
    """Routes llama.cpp's log into the adapter; restores llama_cpp's own before teardown."""
    from llama_cpp import _logger

    llama_cpp.llama_log_set(
        llama_cpp.llama_log_callback(adapter.log_callback_address), adapter.user_data
    )
    try:
        yield adapter
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def test_model_load_reports_started_progress_device_finished_in_sequence(
    adapter: EngineAdapter, ingress: SharedIngress, tiny_gguf: Path
) -> None:
    pipeline = Pipeline(ingress)
    adapter.model_load_begin(operation_id=101, model_id=7)
    model = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), model_params(adapter))
    try:
        assert model is not None
        assert adapter.report_device(0) == Status.OK
        adapter.model_load_end(Status.OK)
    finally:
        if model is not None:
            llama_cpp.llama_model_free(model)
    facts = sorted((f for f in pipeline.stop() if f.operation_id == 101), key=lambda f: f.sequence)

    kinds = [f.kind for f in facts]
    assert kinds[0] == Kind.MODEL_OPEN_STARTED
    assert kinds[-2:] == [Kind.MODEL_OPEN_BACKEND_DEVICE_SELECTED, Kind.MODEL_OPEN_FINISHED]
    progress = facts[1:-2]
    assert progress
    assert {f.kind for f in progress} == {Kind.MODEL_OPEN_PROGRESS}
    assert len(progress) <= 1001
    values = [f.progress_current for f in progress]
    assert values == sorted(set(values))  # strictly increasing
    assert values[-1] == 1000
    assert all(f.progress_total == 1000 and f.progress_unit == ProgressUnit.STEPS for f in progress)
    assert all(f.lane == Lane.PROGRESS for f in progress)

    # sequences 1..n: every emitted fact is either drained or counted in coalesced_count
    assert facts[0].sequence == 1
    for previous, fact in zip(facts, facts[1:], strict=False):
        assert fact.sequence == previous.sequence + 1 + fact.coalesced_count
    assert facts[-1].sequence == sum(1 + f.coalesced_count for f in facts)

    device = facts[-2]
    assert device.detail == b"CPU"
    assert device.numeric_summaries is not None
    memory_free, memory_total, device_type, _ = device.numeric_summaries
    assert device_type == GgmlDeviceType.CPU
    assert 0 < memory_free <= memory_total
    assert all(f.model_id == 7 for f in facts)
    finished = facts[-1]
    assert (finished.status, finished.failure_code) == (Status.OK, FailureCode.NONE)
    assert adapter.report_device(0) == Status.INVALID_ARGUMENT  # scope ended


def test_device_is_reported_at_most_once_per_operation(
    adapter: EngineAdapter, ingress: SharedIngress
) -> None:
    adapter.operation_begin(5)
    assert adapter.report_device(0) == Status.OK
    assert adapter.report_device(0) == Status.ERROR
    adapter.operation_end()
    assert [f.kind for f in ingress.drain()] == [Kind.MODEL_OPEN_BACKEND_DEVICE_SELECTED]


def test_cancel_requested_before_the_load_makes_it_return_null(
    adapter: EngineAdapter, ingress: SharedIngress, tiny_gguf: Path
) -> None:
    ingress.request_cancel(102)
    adapter.model_load_begin(operation_id=102, model_id=7)
    model = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), model_params(adapter))
    assert model is None
    adapter.model_load_end(Status.ERROR, FailureCode.CANCELLED)
    facts = drain_all_records(ingress)
    assert [f.kind for f in facts] == [Kind.MODEL_OPEN_STARTED, Kind.MODEL_OPEN_FAILED_HANDLED]
    failed = facts[1]
    assert (failed.status, failed.failure_code) == (Status.ERROR, FailureCode.CANCELLED)


def test_cancel_during_the_load_aborts_it(
    adapter: EngineAdapter, ingress: SharedIngress, tiny_gguf: Path
) -> None:
    adapter.set_test_progress_delay_us(50_000)  # give the host time to react mid-load
    pipeline = Pipeline(ingress)
    adapter.model_load_begin(operation_id=103, model_id=7)
    result: list[object] = []
    loader = threading.Thread(
        target=lambda: result.append(
            llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), model_params(adapter))
        ),
        name="test-loader",
    )
    loader.start()
    assert pipeline.first_progress.wait(30)
    ingress.request_cancel(103)
    loader.join(60)
    adapter.model_load_end(Status.ERROR, FailureCode.CANCELLED)
    facts = pipeline.stop()
    assert result == [None]
    values = [f.progress_current for f in facts if f.kind == Kind.MODEL_OPEN_PROGRESS]
    assert values
    assert max(values) < 1000
    assert facts[-1].kind != Kind.MODEL_OPEN_FINISHED
    assert Kind.MODEL_OPEN_FAILED_HANDLED in [f.kind for f in facts]


def test_log_callback_counts_messages_by_level(
    our_log_callback: EngineAdapter, ingress: SharedIngress, tiny_gguf: Path
) -> None:
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    assert model is not None
    llama_cpp.llama_model_free(model)
    stats = ingress.stats()
    assert sum(stats.log_messages_by_level) > 0
    assert stats.log_messages_by_level[2] + stats.log_messages_by_level[1] > 0  # INFO/DEBUG
    assert stats.debug_lines_captured == 0  # not opted in: nothing kept
    assert ingress.read_debug_log() == []
    assert ingress.drain() == []  # log lines are never facts


def test_debug_capture_keeps_raw_native_log_lines_when_opted_in(
    ingress: SharedIngress, tiny_gguf: Path
) -> None:
    from llama_cpp import _logger

    with EngineAdapter(ingress, capture_debug_log=True) as verbose:
        llama_cpp.llama_log_set(
            llama_cpp.llama_log_callback(verbose.log_callback_address), verbose.user_data
        )
        try:
            params = llama_cpp.llama_model_default_params()
            model = llama_cpp.llama_model_load_from_file(str(tiny_gguf).encode(), params)
            assert model is not None
            llama_cpp.llama_model_free(model)
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    lines = ingress.read_debug_log()
    assert any("llama_model_loader" in line for line in lines)
    assert ingress.stats().debug_lines_captured > 0


def test_abort_callback_aborts_decode_of_the_cancelled_operation(
    adapter: EngineAdapter, ingress: SharedIngress, tiny_gguf: Path
) -> None:
    model = llama_cpp.llama_model_load_from_file(
        str(tiny_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    assert model is not None
    ctx = None
    try:
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = 64
        ctx_params.n_batch = 16
        ctx_params.n_ubatch = 16
        ctx_params.n_threads = 1
        ctx_params.n_threads_batch = 1
        ctx_params.abort_callback = llama_cpp.ggml_abort_callback(adapter.abort_callback_address)
        ctx_params.abort_callback_data = adapter.user_data
        ctx = llama_cpp.llama_init_from_model(model, ctx_params)
        assert ctx is not None
        tokens = (llama_cpp.llama_token * 4)(1, 2, 3, 4)

        def decode() -> int:
            batch = llama_cpp.llama_batch_get_one(tokens, 4)
            return int(llama_cpp.llama_decode(ctx, batch))

        adapter.operation_begin(104)
        ingress.request_cancel(104)
        assert decode() == 2  # llama_decode: 2 = aborted
        ingress.request_cancel(0)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        assert decode() == 0
        adapter.operation_end()
    finally:
        if ctx is not None:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def test_ggml_devices_and_backends_are_enumerated(lib: NativeLibrary) -> None:
    found = devices.list_devices(lib)
    cpu = [d for d in found if d.device_type is GgmlDeviceType.CPU]
    assert cpu
    assert cpu[0].name == "CPU"
    assert 0 < cpu[0].memory_free <= cpu[0].memory_total
    backends = devices.list_backends(lib)
    assert "CPU" in backends
    assert devices.rpc_available(lib), f"llama.cpp built without ggml RPC: {backends}"
