"""ctypes binding of the native event layer (native/).

Import-light: importing this package loads nothing native and never imports llama_cpp. Use
``load_native_library()`` (raises ``NativeLibraryUnavailable`` / ``NativeAbiIncompatible``) and
the host/engine wrappers in ``ingress``; ``devices`` queries ggml through llama_cpp's libraries.
"""

from __future__ import annotations

from skippyctl.native.ingress import (
    EngineAdapter,
    IngressClosed,
    IngressConfig,
    IngressStats,
    LaneStats,
    NativeFact,
    ProducerReport,
    ProducerThreads,
    SharedIngress,
    WaitResult,
)
from skippyctl.native.library import (
    Capabilities,
    NativeAbiIncompatible,
    NativeLibrary,
    NativeLibraryUnavailable,
    load_native_library,
    native_library,
)

__all__ = [
    "Capabilities",
    "EngineAdapter",
    "IngressClosed",
    "IngressConfig",
    "IngressStats",
    "LaneStats",
    "NativeAbiIncompatible",
    "NativeFact",
    "NativeLibrary",
    "NativeLibraryUnavailable",
    "ProducerReport",
    "ProducerThreads",
    "SharedIngress",
    "WaitResult",
    "load_native_library",
    "native_library",
]
