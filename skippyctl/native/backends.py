"""ctypes binding of ggml's backend registry and llama.cpp's per-buffer memory breakdown, for
the engine process: which devices this process can compute on, and how many bytes a loaded
model and its context hold on each (weights, KV, compute buffers).

Contract:

- ``GgmlBackends(lib_dir)`` opens ``libggml.so``, ``libggml-base.so`` and ``libllama.so`` from
  llama_cpp's library directory (the files llama_cpp already loaded, so the dynamic loader hands
  back the handles in the process; ``rpc.llama_cpp_lib_dir_unimported``) and raises
  :class:`BackendsUnavailable` when a library or a symbol is missing. Every call is cheap and
  never aborts (no RPC device is touched here: ``ggml_backend_dev_memory`` of an RPC device is a
  network round trip, so :meth:`GgmlBackends.devices` skips devices of the RPC registry).
- Only device and buffer type *names* (``CPU``, ``CUDA0``, ``CPU_REPACK``) and types leave this
  module: names are short registry names, safe in events; descriptions may carry a hardware
  model string and are never read. ggml handles are pointers and never leave the process.
- :meth:`GgmlBackends.buffer_types` lists each device's buffer types by name (its default, its
  host and its extra ones, ``CPU_REPACK`` or ``AMX`` on a CPU) with the device their bytes count
  on, by the same rule as the breakdown: the buffer type's ggml device, else the host's.
- :meth:`GgmlBackends.memory_breakdown` reads ``llama_get_memory_breakdown`` (``llama-ext.h``:
  a C++ function returning ``std::map<ggml_backend_buffer_type_t, llama_memory_breakdown_data>``,
  the figures llama.cpp's own ``llama_memory_breakdown_print`` logs). llama.cpp 0.3.36 has no C
  API for them, and the alternative is parsing that log. The call is made through the x86-64
  SysV convention for a non-trivial return value (a hidden result pointer first) and the map is
  walked with libstdc++'s ``_Rb_tree`` layout, which has been stable since GCC 3; it is done only
  on x86-64 Linux, with bounds on every value, and returns None otherwise (then the worker
  reports totals it can compute). The map's nodes are left allocated (a few dozen bytes once per
  load): freeing them needs the map's destructor, which is not exported.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.native import abi
from skippyctl.native.rpc import RpcUnavailable, llama_cpp_lib_dir_unimported

_vp = ctypes.c_void_p
_size_p = ctypes.POINTER(ctypes.c_size_t)
RPC_REGISTRY_NAME: Final = "RPC"
HOST_DEVICE: Final = "CPU"
"""Buffer types without a device (``CPU``, ``CPU_Mapped``) hold host memory: the CPU's."""
MAX_BREAKDOWN_ENTRIES: Final = 64
_MAX_PLAUSIBLE_BYTES: Final = 1 << 50
_BREAKDOWN_SYMBOL: Final = "_Z26llama_get_memory_breakdownPK13llama_context"
_STD_MAP_BYTES: Final = 48
"""sizeof(std::map) in libstdc++ on LP64: comparator (8), header node (32), node count (8)."""

# (library, name) -> (restype, argtypes)
_PROTOTYPES: Final[dict[tuple[str, str], tuple[Any, list[Any]]]] = {
    # size_t ggml_backend_reg_count(void);
    ("libggml.so", "ggml_backend_reg_count"): (ctypes.c_size_t, []),
    # ggml_backend_reg_t ggml_backend_reg_get(size_t index);
    ("libggml.so", "ggml_backend_reg_get"): (_vp, [ctypes.c_size_t]),
    # size_t ggml_backend_dev_count(void);
    ("libggml.so", "ggml_backend_dev_count"): (ctypes.c_size_t, []),
    # ggml_backend_dev_t ggml_backend_dev_get(size_t index);
    ("libggml.so", "ggml_backend_dev_get"): (_vp, [ctypes.c_size_t]),
    # const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
    ("libggml-base.so", "ggml_backend_reg_name"): (ctypes.c_char_p, [_vp]),
    # ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_backend_reg"): (_vp, [_vp]),
    # const char * ggml_backend_dev_name(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_name"): (ctypes.c_char_p, [_vp]),
    # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_type"): (ctypes.c_int, [_vp]),
    # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
    ("libggml-base.so", "ggml_backend_dev_memory"): (None, [_vp, _size_p, _size_p]),
    # ggml_backend_dev_t ggml_backend_buft_get_device(ggml_backend_buffer_type_t buft);
    ("libggml-base.so", "ggml_backend_buft_get_device"): (_vp, [_vp]),
    # const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
    ("libggml-base.so", "ggml_backend_buft_name"): (ctypes.c_char_p, [_vp]),
    # ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_buffer_type"): (_vp, [_vp]),
    # ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t, size_t);
    ("libggml-base.so", "ggml_backend_buft_alloc_buffer"): (_vp, [_vp, ctypes.c_size_t]),
    # void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
    ("libggml-base.so", "ggml_backend_buffer_free"): (None, [_vp]),
    # ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);
    ("libggml-base.so", "ggml_backend_dev_host_buffer_type"): (_vp, [_vp]),
    # void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
    ("libggml-base.so", "ggml_backend_reg_get_proc_address"): (_vp, [_vp, ctypes.c_char_p]),
}
_EXTRA_BUFTS_PROC: Final = b"ggml_backend_dev_get_extra_bufts"
# typedef ggml_backend_buffer_type_t * (*ggml_backend_dev_get_extra_bufts_t)(ggml_backend_dev_t);
_GET_EXTRA_BUFTS: Final = ctypes.CFUNCTYPE(ctypes.POINTER(_vp), _vp)


class BackendsUnavailable(RuntimeError):
    """ggml's libraries or one of the symbols above are missing."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device of ggml's registry (never an RPC one)."""

    name: str
    type: abi.GgmlDeviceType | None
    memory_free_bytes: int
    memory_total_bytes: int

    @property
    def kind(self) -> str:
        """``cpu``, ``gpu``, ``igpu``, ``accel``, ``meta`` or ``unknown``."""
        return "unknown" if self.type is None else self.type.name.lower()


@dataclass(frozen=True, slots=True)
class BufferUse:
    """Bytes llama.cpp holds on one device: model weights, context (the KV cache) and compute
    buffers (``llama_memory_breakdown_data``), summed over that device's buffer types."""

    device: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int


@dataclass(frozen=True, slots=True)
class BufferType:
    """A buffer type a device of the registry offers, by the name llama.cpp logs it under, and
    the device :meth:`GgmlBackends.memory_breakdown` counts its bytes on. ``extra`` marks a
    device's extra buffer types (``CPU_REPACK``, ``AMX``): llama.cpp places some weights there
    in a layout of the backend's own, which can be larger than the file's tensors."""

    name: str
    device: str
    extra: bool


class GgmlBackends:
    def __init__(self, lib_dir: Path | None = None) -> None:
        try:
            directory = lib_dir if lib_dir is not None else llama_cpp_lib_dir_unimported()
        except RpcUnavailable as error:
            raise BackendsUnavailable(str(error)) from error
        self._libs: dict[str, ctypes.CDLL] = {}
        for name in ("libggml.so", "libggml-base.so", "libllama.so"):
            path = directory / name
            try:
                self._libs[name] = ctypes.CDLL(str(path))
            except OSError as error:
                raise BackendsUnavailable(f"{name} cannot be opened") from error
        self._fns: dict[str, Any] = {}
        for (library, symbol), (restype, argtypes) in _PROTOTYPES.items():
            try:
                function = getattr(self._libs[library], symbol)
            except AttributeError as error:
                raise BackendsUnavailable(f"{library} lacks {symbol}") from error
            function.restype = restype
            function.argtypes = argtypes
            self._fns[symbol] = function
        self._breakdown: Any | None = None
        if sys.platform == "linux" and platform.machine() == "x86_64":
            breakdown = getattr(self._libs["libllama.so"], _BREAKDOWN_SYMBOL, None)
            if breakdown is not None:
                # The hidden result pointer comes first (x86-64 SysV, non-trivial return type).
                breakdown.restype = _vp
                breakdown.argtypes = [_vp, _vp]
                self._breakdown = breakdown

    @staticmethod
    def _text(raw: bytes | None) -> str:
        return raw.decode("utf-8", errors="replace")[:63] if raw else ""

    def backends(self) -> list[str]:
        """The registry names, e.g. ``["CPU", "RPC"]``."""
        count = int(self._fns["ggml_backend_reg_count"]())
        names = []
        for index in range(min(count, MAX_BREAKDOWN_ENTRIES)):
            registry = self._fns["ggml_backend_reg_get"](index)
            if registry:
                names.append(self._text(self._fns["ggml_backend_reg_name"](registry)))
        return names

    def _local_devices(self) -> list[tuple[Any, Any]]:
        """(device, registry) handles of every device of the registry but RPC ones."""
        count = int(self._fns["ggml_backend_dev_count"]())
        out = []
        for index in range(min(count, MAX_BREAKDOWN_ENTRIES)):
            device = self._fns["ggml_backend_dev_get"](index)
            if not device:
                continue
            registry = self._fns["ggml_backend_dev_backend_reg"](device)
            if registry and self._text(self._fns["ggml_backend_reg_name"](registry)) == (
                RPC_REGISTRY_NAME
            ):
                continue  # its memory is a round trip to a stage (links.py measures that)
            out.append((device, registry))
        return out

    def can_allocate(self, device_name: str, size_bytes: int) -> bool | None:
        """Whether ggml's own allocator gives a buffer of ``size_bytes`` on the device named
        ``device_name`` now: allocated through the device's buffer type and freed at once (its
        pages are never touched). None when there is no such device."""
        for device, _ in self._local_devices():
            if self._text(self._fns["ggml_backend_dev_name"](device)) != device_name:
                continue
            buffer_type = self._fns["ggml_backend_dev_buffer_type"](device)
            if not buffer_type:
                return None
            buffer = self._fns["ggml_backend_buft_alloc_buffer"](buffer_type, size_bytes)
            if not buffer:
                return False
            self._fns["ggml_backend_buffer_free"](buffer)
            return True
        return None

    def devices(self) -> list[Device]:
        """Every device of the registry but RPC ones, with what it reports about its memory."""
        out: list[Device] = []
        for device, _ in self._local_devices():
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self._fns["ggml_backend_dev_memory"](device, ctypes.byref(free), ctypes.byref(total))
            raw_type = int(self._fns["ggml_backend_dev_type"](device))
            try:
                kind: abi.GgmlDeviceType | None = abi.GgmlDeviceType(raw_type)
            except ValueError:
                kind = None
            out.append(
                Device(
                    self._text(self._fns["ggml_backend_dev_name"](device)),
                    kind,
                    int(free.value),
                    int(total.value),
                )
            )
        return out

    def buffer_types(self) -> list[BufferType]:
        """The buffer types of every device but RPC ones: its default one, its host one (if it
        has one) and its extra ones, each with the device its bytes count on."""
        out: list[BufferType] = []
        for device, registry in self._local_devices():
            plain = [
                self._fns["ggml_backend_dev_buffer_type"](device),
                self._fns["ggml_backend_dev_host_buffer_type"](device),
            ]
            out += [self._buffer_type(b, extra=False) for b in plain if b]
            out += [
                self._buffer_type(b, extra=True) for b in self._extra_buffer_types(device, registry)
            ]
        return list(dict.fromkeys(out))

    def _extra_buffer_types(self, device: Any, registry: Any) -> list[int]:
        """The device's extra buffer types, from its registry's optional
        ``ggml_backend_dev_get_extra_bufts`` (a NULL-terminated array; none without it)."""
        address = self._fns["ggml_backend_reg_get_proc_address"](registry, _EXTRA_BUFTS_PROC)
        if not address:
            return []
        array = _GET_EXTRA_BUFTS(address)(device)
        out: list[int] = []
        while array and len(out) < MAX_BREAKDOWN_ENTRIES and array[len(out)]:
            out.append(int(array[len(out)]))
        return out

    def _buffer_type(self, buffer_type: int, *, extra: bool) -> BufferType:
        name = self._text(self._fns["ggml_backend_buft_name"](buffer_type))
        return BufferType(name, self._device_of(buffer_type), extra)

    def _device_of(self, buffer_type: int) -> str:
        """The device a buffer type's bytes count on: its ggml device's name, else the host."""
        device = self._fns["ggml_backend_buft_get_device"](buffer_type) if buffer_type else None
        name = self._text(self._fns["ggml_backend_dev_name"](device)) if device else ""
        return name or HOST_DEVICE

    def memory_breakdown(self, context: Any) -> list[BufferUse] | None:
        """What the context and its model hold per device (see the module docstring); None
        when this platform or library cannot say, or the figures look wrong."""
        if self._breakdown is None or not context:
            return None
        result = ctypes.create_string_buffer(_STD_MAP_BYTES)
        base = ctypes.addressof(result)
        self._breakdown(base, ctypes.cast(context, _vp))
        header = base + 8

        def word(address: int, offset: int) -> int:
            return int(ctypes.c_uint64.from_address(address + offset).value)

        count = word(base, 40)
        if count > MAX_BREAKDOWN_ENTRIES:
            return None
        totals: dict[str, list[int]] = {}
        node = word(header, 16)  # the leftmost node
        for _ in range(count):
            if not node or node == header:
                return None
            buffer_type = word(node, 32)
            figures = [word(node, 40), word(node, 48), word(node, 56)]
            if any(f > _MAX_PLAUSIBLE_BYTES for f in figures):
                return None
            sums = totals.setdefault(self._device_of(buffer_type), [0, 0, 0])
            for i, figure in enumerate(figures):
                sums[i] += figure
            node = _successor(node, word)
        return [BufferUse(name, *sums) for name, sums in totals.items()]


def _successor(node: int, word: Any) -> int:
    """The in-order successor of an ``_Rb_tree`` node (parent +8, left +16, right +24)."""
    right = word(node, 24)
    if right:
        node = right
        while left := word(node, 16):
            node = left
        return int(node)
    parent = word(node, 8)
    while node == word(parent, 24):
        node = parent
        parent = word(node, 8)
    return int(parent)
