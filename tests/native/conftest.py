from __future__ import annotations

from collections.abc import Iterator

import pytest

from skippyctl.native import (
    EngineAdapter,
    IngressConfig,
    NativeLibrary,
    SharedIngress,
    load_native_library,
)


@pytest.fixture(scope="session")
def lib() -> NativeLibrary:
    """The real, layout-checked native library (a missing build is a failure, not a skip)."""
    return load_native_library()


@pytest.fixture
def ingress(lib: NativeLibrary) -> Iterator[SharedIngress]:
    region = SharedIngress.create(library=lib)
    yield region
    region.close()


@pytest.fixture
def small_ingress(lib: NativeLibrary) -> Iterator[SharedIngress]:
    region = SharedIngress.create(
        IngressConfig(
            terminal_capacity=16, diagnostic_capacity=8, progress_slots=4, debug_bytes=256
        ),
        library=lib,
    )
    yield region
    region.close()


@pytest.fixture
def adapter(ingress: SharedIngress) -> Iterator[EngineAdapter]:
    engine = EngineAdapter(ingress)
    yield engine
    engine.close()


@pytest.fixture
def small_adapter(small_ingress: SharedIngress) -> Iterator[EngineAdapter]:
    engine = EngineAdapter(small_ingress)
    yield engine
    engine.close()
