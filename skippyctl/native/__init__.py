"""ctypes binding of the native event layer (native/).

Import-light: importing this package loads nothing native, never imports llama_cpp and imports
no submodule until one of its names is used (PEP 562), so an engine worker that needs only
``library`` and ``region`` never pays for the host's fact decoding in ``ingress``. Use
``load_native_library()`` (raises ``NativeLibraryUnavailable`` / ``NativeAbiIncompatible``), the
host wrapper ``ingress.SharedIngress`` and the engine wrappers in ``region``; ``devices`` queries
ggml through llama_cpp's libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from skippyctl.native import abi, devices, ingress, library, region, rpc
    from skippyctl.native.ingress import (
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
        open_native_library,
    )
    from skippyctl.native.region import EngineAdapter, IngressClosed, IngressRegion

_SUBMODULES: Final = frozenset({"abi", "devices", "ingress", "library", "region", "rpc"})
_EXPORTS: Final = {
    "Capabilities": "library",
    "EngineAdapter": "region",
    "IngressClosed": "region",
    "IngressConfig": "ingress",
    "IngressRegion": "region",
    "IngressStats": "ingress",
    "LaneStats": "ingress",
    "NativeAbiIncompatible": "library",
    "NativeFact": "ingress",
    "NativeLibrary": "library",
    "NativeLibraryUnavailable": "library",
    "ProducerReport": "ingress",
    "ProducerThreads": "ingress",
    "SharedIngress": "ingress",
    "WaitResult": "ingress",
    "load_native_library": "library",
    "native_library": "library",
    "open_native_library": "library",
}

__all__ = [
    "Capabilities",
    "EngineAdapter",
    "IngressClosed",
    "IngressConfig",
    "IngressRegion",
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
    "abi",
    "devices",
    "ingress",
    "library",
    "load_native_library",
    "native_library",
    "open_native_library",
    "region",
    "rpc",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})
