"""ctypes binding of llama.cpp's ggml RPC backend (``ggml-rpc.h``, RPC protocol 7.0.0).

Contract:

- ``GgmlRpc(lib_dir)`` opens ``libggml-rpc.so``, ``libggml.so`` and ``libggml-base.so`` from
  llama_cpp's library directory (``devices.llama_cpp_lib_dir()``, the same convention as
  ``devices.resolve_ggml``; those are the very files llama_cpp loaded, so the dynamic loader hands
  back the handles already in the process) and declares the prototypes below. It raises
  ``RpcUnavailable`` when the libraries or a symbol are missing (llama.cpp built without
  ``GGML_RPC``).
- ggml handles (``ggml_backend_dev_t``, ``ggml_backend_reg_t``) are plain ints here and never leave
  the process: they are pointers, which no event, record or log may carry.
- Server side: ``start_server`` runs ``ggml_backend_rpc_start_server`` on the calling thread. It
  binds the endpoint itself (IPv4 only, ``SO_REUSEADDR``, backlog 1), serves one client connection
  at a time and never returns while it serves; it returns only when it could not start (bad
  arguments, a backend that failed to initialise, a bind or accept failure). It prints to the C
  stdout and ggml's log (stderr). Run it in a process of its own
  (``skippyctl.stages.stage_worker``).
- Client side: ``get_device_memory``, ``add_server`` and every graph computed on an RPC device go
  through one persistent connection per endpoint. **ggml aborts the calling process**
  (``GGML_ABORT``) when that endpoint cannot be reached ("Failed to connect to …"), the handshake
  fails, or the server dies mid-call ("Remote RPC server crashed or returned malformed response").
  Call them only from a process whose death the caller survives (the engine worker), never from
  the CLI or the runtime host.

This module never imports llama_cpp (it only locates it, ``llama_cpp_lib_dir_unimported``).
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.native import abi

RPC_PROTO_VERSION: Final = (7, 0, 0)
"""``RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION`` of the llama.cpp that llama-cpp-python 0.3.36
vendors; a server and a client of different major versions refuse each other's HELLO."""
GGML_RPC_MAX_SERVERS: Final = 16
RPC_LIBRARY_NAME: Final = "libggml-rpc.so"
# ggml_backend_dev_by_type and ggml_backend_dev_count live in libggml (the registry),
# ggml_backend_dev_name/_memory and ggml_backend_reg_dev_* in libggml-base.
_GGML_LIBRARY_NAMES: Final = ("libggml.so", "libggml-base.so")

_vp = ctypes.c_void_p
_size = ctypes.c_size_t
_u32 = ctypes.c_uint32
_size_p = ctypes.POINTER(ctypes.c_size_t)

# (library, name) -> (restype, argtypes)
_PROTOTYPES: Final[dict[tuple[str, str], tuple[Any, list[Any]]]] = {
    # void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
    #     size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);
    (RPC_LIBRARY_NAME, "ggml_backend_rpc_start_server"): (
        None,
        [ctypes.c_char_p, ctypes.c_char_p, _size, _size, ctypes.POINTER(_vp)],
    ),
    # void ggml_backend_rpc_get_device_memory(const char * endpoint, uint32_t device,
    #     size_t * free, size_t * total);
    (RPC_LIBRARY_NAME, "ggml_backend_rpc_get_device_memory"): (
        None,
        [ctypes.c_char_p, _u32, _size_p, _size_p],
    ),
    # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
    (RPC_LIBRARY_NAME, "ggml_backend_rpc_add_server"): (_vp, [ctypes.c_char_p]),
    # ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
    ("libggml.so", "ggml_backend_dev_by_type"): (_vp, [ctypes.c_int]),
    # const char * ggml_backend_dev_name(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_name"): (ctypes.c_char_p, [_vp]),
    # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
    ("libggml-base.so", "ggml_backend_dev_memory"): (None, [_vp, _size_p, _size_p]),
    # size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
    ("libggml-base.so", "ggml_backend_reg_dev_count"): (_size, [_vp]),
    # ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
    ("libggml-base.so", "ggml_backend_reg_dev_get"): (_vp, [_vp, _size]),
}


def llama_cpp_lib_dir_unimported() -> Path:
    """``devices.llama_cpp_lib_dir()`` (``Path(llama_cpp.__file__).parent / "lib"``) found
    without importing llama_cpp: a stage worker needs ggml only, and importing llama_cpp would
    load libllama and install its Python log callback, which ggml's server threads would then
    call into."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise RpcUnavailable("llama_cpp is not installed")
    return Path(spec.origin).parent / "lib"


class RpcUnavailable(RuntimeError):
    """llama.cpp's ggml RPC backend is not there (built without GGML_RPC, or a symbol is
    missing)."""


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What a device reports: bytes free and in total."""

    free_bytes: int
    total_bytes: int


class GgmlRpc:
    """The ggml RPC entry points and the few device calls that go with them."""

    def __init__(self, lib_dir: Path | None = None) -> None:
        if lib_dir is None:
            lib_dir = llama_cpp_lib_dir_unimported()
        self._libs: dict[str, ctypes.CDLL] = {}
        for name in (RPC_LIBRARY_NAME, *_GGML_LIBRARY_NAMES):
            path = lib_dir / name
            if not path.exists():
                raise RpcUnavailable(f"{name} is not in llama_cpp's library directory")
            try:
                self._libs[name] = ctypes.CDLL(str(path))
            except OSError as error:
                raise RpcUnavailable(f"{name} cannot be opened: {error}") from error
        self._fns: dict[str, Any] = {}
        for (library, symbol), (restype, argtypes) in _PROTOTYPES.items():
            try:
                function = getattr(self._libs[library], symbol)
            except AttributeError as error:
                raise RpcUnavailable(f"{library} lacks {symbol}") from error
            function.restype = restype
            function.argtypes = argtypes
            self._fns[symbol] = function

    # -- devices of this process ---------------------------------------------------------------

    def cpu_device(self) -> int | None:
        """The CPU device of ggml's registry (None if there is none)."""
        device = self._fns["ggml_backend_dev_by_type"](int(abi.GgmlDeviceType.CPU))
        return int(device) if device else None

    def device_name(self, device: int) -> str:
        name = self._fns["ggml_backend_dev_name"](device)
        return bytes(name).decode("utf-8", errors="replace") if name else ""

    def device_memory(self, device: int) -> DeviceMemory:
        """``ggml_backend_dev_memory``; on an RPC device this is a round trip to its server
        (and aborts the process when the server is gone, see the module docstring)."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self._fns["ggml_backend_dev_memory"](device, ctypes.byref(free), ctypes.byref(total))
        return DeviceMemory(int(free.value), int(total.value))

    def registry_devices(self, registry: int) -> list[int]:
        """The devices of a backend registry (e.g. one ``add_server`` returned)."""
        count = int(self._fns["ggml_backend_reg_dev_count"](registry))
        out: list[int] = []
        for index in range(count):
            device = self._fns["ggml_backend_reg_dev_get"](registry, index)
            if device:
                out.append(int(device))
        return out

    # -- server side -----------------------------------------------------------------------------

    def start_server(
        self,
        endpoint: str,
        devices: list[int],
        n_threads: int,
        cache_dir: str | None = None,
    ) -> None:
        """Serve ``devices`` at ``endpoint`` ("a.b.c.d:port"). Blocks while serving; returning
        at all means the server could not start or stopped accepting (see the module
        docstring). The GIL is released for the whole call."""
        if not devices:
            raise ValueError("an RPC server needs at least one device")
        array = (ctypes.c_void_p * len(devices))(*devices)
        self._fns["ggml_backend_rpc_start_server"](
            endpoint.encode(),
            cache_dir.encode() if cache_dir is not None else None,
            n_threads,
            len(devices),
            array,
        )

    # -- client side (aborts the process when the endpoint is gone) ------------------------------

    def get_device_memory(self, endpoint: str, device: int = 0) -> DeviceMemory:
        """Free/total memory of device ``device`` of the server at ``endpoint``."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self._fns["ggml_backend_rpc_get_device_memory"](
            endpoint.encode(), device, ctypes.byref(free), ctypes.byref(total)
        )
        return DeviceMemory(int(free.value), int(total.value))

    def add_server(self, endpoint: str) -> int | None:
        """Registers the server at ``endpoint``: a ``ggml_backend_reg_t`` whose devices
        (``registry_devices``) can go into ``llama_model_params.devices``. The same endpoint
        twice gives the same registry; None when the server reports no device."""
        registry = self._fns["ggml_backend_rpc_add_server"](endpoint.encode())
        return int(registry) if registry else None
