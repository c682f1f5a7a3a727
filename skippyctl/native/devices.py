"""ggml device and backend enumeration through the native library.

Contract: ``resolve_ggml`` points the native library at the ggml libraries llama_cpp already
loaded (``Path(llama_cpp.__file__).parent / "lib"``); the native side takes every symbol it needs
with dlsym, so there is no link-time dependency on libggml. Device names and memory figures are
safe to report; descriptions may carry a hardware model string and belong in diagnostics only.
A library whose device family is disabled (a missing symbol, ``NativeLibrary.has``) resolves
nothing and lists nothing. This is the only module of the binding that imports llama_cpp.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skippyctl.native import abi
from skippyctl.native.library import NativeLibrary, native_library

# Registry names are short ("CPU", "RPC", "CUDA"); the C side truncates at 63 bytes.
_NAME_BYTES: Final = 64
_MAX_ENTRIES: Final = 64
RPC_BACKEND_NAME: Final = "RPC"
# ggml_backend_dev_* live in libggml-base, the registry in libggml; both are needed.
_GGML_LIBRARY_NAMES: Final = ("libggml.so", "libggml-base.so")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """``skippy_device_info_v1``."""

    name: str
    description: str
    type: int  # raw ggml_backend_dev_type; see device_type
    memory_free: int
    memory_total: int

    @property
    def device_type(self) -> abi.GgmlDeviceType | None:
        try:
            return abi.GgmlDeviceType(self.type)
        except ValueError:
            return None


def llama_cpp_lib_dir() -> Path:
    """Where llama-cpp-python keeps libllama/libggml (importing llama_cpp loads them)."""
    import llama_cpp  # imported here: the rest of the binding stays importable without it

    return Path(llama_cpp.__file__).parent / "lib"


def resolve_ggml(lib: NativeLibrary | None = None, lib_dir: Path | None = None) -> abi.Status:
    """Resolves the ggml symbols from llama_cpp's libraries. OK or UNSUPPORTED."""
    library = lib if lib is not None else native_library()
    if not library.has(abi.FeatureBit.DEVICE_EVENTS):
        return abi.Status.UNSUPPORTED
    directory = lib_dir if lib_dir is not None else llama_cpp_lib_dir()
    paths = [directory / name for name in _GGML_LIBRARY_NAMES if (directory / name).exists()]
    if not paths:
        return abi.Status.UNSUPPORTED
    array = (ctypes.c_char_p * len(paths))(*(str(p).encode() for p in paths))
    return abi.Status(int(library.cdll.skippy_ggml_resolve(array, len(paths))))


def list_devices(lib: NativeLibrary | None = None) -> list[DeviceInfo]:
    """ggml devices (empty when ggml is not resolved)."""
    library = lib if lib is not None else native_library()
    if not library.has(abi.FeatureBit.DEVICE_EVENTS):
        return []
    buffer = (abi.skippy_device_info_v1 * _MAX_ENTRIES)()
    count = ctypes.c_size_t(0)
    status = int(library.cdll.skippy_devices_list(buffer, _MAX_ENTRIES, ctypes.byref(count)))
    if status not in (abi.Status.OK, abi.Status.BUFFER_TOO_SMALL):
        return []
    return [
        DeviceInfo(
            name=bytes(entry.name).decode("utf-8", errors="replace"),
            description=bytes(entry.description).decode("utf-8", errors="replace"),
            type=int(entry.type),
            memory_free=int(entry.memory_free),
            memory_total=int(entry.memory_total),
        )
        for entry in buffer[: min(count.value, _MAX_ENTRIES)]
    ]


def list_backends(lib: NativeLibrary | None = None) -> list[str]:
    """ggml backend registry names, e.g. ["CPU", "RPC"] (empty when unresolved)."""
    library = lib if lib is not None else native_library()
    if not library.has(abi.FeatureBit.DEVICE_EVENTS):
        return []
    names = (ctypes.c_char * (_NAME_BYTES * _MAX_ENTRIES))()
    count = ctypes.c_size_t(0)
    status = int(library.cdll.skippy_backends_list(names, _MAX_ENTRIES, ctypes.byref(count)))
    if status not in (abi.Status.OK, abi.Status.BUFFER_TOO_SMALL):
        return []
    raw = bytes(names)
    out: list[str] = []
    for i in range(min(count.value, _MAX_ENTRIES)):
        entry = raw[i * _NAME_BYTES : (i + 1) * _NAME_BYTES]
        out.append(entry.split(b"\0", 1)[0].decode("utf-8", errors="replace"))
    return out


def rpc_available(lib: NativeLibrary | None = None) -> bool:
    """True when llama.cpp was built with ggml RPC (a registry named "RPC")."""
    return RPC_BACKEND_NAME in list_backends(lib)
