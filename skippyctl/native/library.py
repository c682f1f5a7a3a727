"""Locating, loading and checking the native event library.

Contract:

- ``load_native_library()`` finds ``_skippy_native*.so`` next to this package (any suffix of
  ``importlib.machinery.EXTENSION_SUFFIXES``), or loads an explicit path.
  ``open_native_library(override, disabled)`` is the library a process's settings choose
  (``SKIPPY_NATIVE_LIBRARY``, ``SKIPPY_NATIVE_DISABLE``: read once at start by
  ``config/runtime_settings.py`` and passed here; nothing in this package reads the
  environment).
- It raises ``NativeLibraryUnavailable`` when the library is absent, disabled or cannot be
  opened, and ``NativeAbiIncompatible`` when the event/ingress ABI versions, a core symbol, or
  ANY struct size or field offset/size reported by ``skippy_abi_fields()`` disagrees with the
  ctypes mirrors in ``abi.py``. A library that passed is safe to call with those mirrors.
- Optional families degrade alone: a family the library announces in
  ``skippy_native_features()`` whose symbols are missing (``FAMILY_SYMBOLS``) is turned off by
  itself — its bit is cleared from ``features`` and listed in ``disabled_families`` — and the
  rest of the native path stays on. Callers ask ``has(bit)`` before they use a family; the host
  reports each disabled family once. The test hooks (``TEST_SYMBOLS``) belong to no family: a
  library built without them serves, only the tests that drive them cannot run.
- Every exported function gets argtypes/restype here. ``ctypes.CDLL`` releases the GIL around
  each call; only ``skippy_test_hold_gil_until_producers_done`` is also bound through
  ``ctypes.PyDLL`` (keeps the GIL held, for the test that proves producers never need it).

This module never imports llama_cpp.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.native import abi

ENV_LIBRARY: Final = "SKIPPY_NATIVE_LIBRARY"
"""The setting that names another library file (``RuntimeSettings.native_library``), for
messages."""
ENV_DISABLE: Final = "SKIPPY_NATIVE_DISABLE"
"""The setting that turns the library off (``RuntimeSettings.native_disabled``), for messages."""
LIBRARY_STEM: Final = "_skippy_native"


class NativeLibraryUnavailable(RuntimeError):
    """The native library is absent, disabled or cannot be opened: run in legacy mode."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NativeAbiIncompatible(RuntimeError):
    """The library opened but its ABI (versions, symbols, layouts) disagrees with this binding."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Feature families the library reports (``skippy_native_features()``).

    Unknown bits disable nothing; they are listed in ``unknown_bits`` (bit numbers).
    """

    runtime_events: bool
    runtime_event_reporter: bool
    model_load_events_v2: bool
    kv_events: bool
    device_events: bool
    diagnostic_events: bool
    unload_events: bool
    unknown_bits: tuple[int, ...]

    @classmethod
    def from_mask(cls, mask: int) -> Capabilities:
        known = 0
        for bit in abi.FeatureBit:
            known |= int(bit)
        unknown = tuple(i for i in range(64) if (mask >> i) & 1 and not (known >> i) & 1)
        return cls(
            runtime_events=bool(mask & abi.FeatureBit.RUNTIME_EVENTS),
            runtime_event_reporter=bool(mask & abi.FeatureBit.RUNTIME_EVENT_REPORTER),
            model_load_events_v2=bool(mask & abi.FeatureBit.MODEL_LOAD_EVENTS_V2),
            kv_events=bool(mask & abi.FeatureBit.KV_EVENTS),
            device_events=bool(mask & abi.FeatureBit.DEVICE_EVENTS),
            diagnostic_events=bool(mask & abi.FeatureBit.DIAGNOSTIC_EVENTS),
            unload_events=bool(mask & abi.FeatureBit.UNLOAD_EVENTS),
            unknown_bits=unknown,
        )


_vp = ctypes.c_void_p
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_i32 = ctypes.c_int32
_size = ctypes.c_size_t

# name -> (restype, argtypes). The C declaration is in native/include/skippy/skippy_ingress.h.
_PROTOTYPES: Final[dict[str, tuple[Any, list[Any]]]] = {
    # size_t skippy_ingress_required_size(const skippy_ingress_config_v1 *config);
    "skippy_ingress_required_size": (_size, [ctypes.POINTER(abi.skippy_ingress_config_v1)]),
    # skippy_ingress_t *skippy_ingress_init(void *mem, size_t size, const ..._config_v1 *cfg);
    "skippy_ingress_init": (_vp, [_vp, _size, ctypes.POINTER(abi.skippy_ingress_config_v1)]),
    # skippy_ingress_t *skippy_ingress_attach(void *mem, size_t size);
    "skippy_ingress_attach": (_vp, [_vp, _size]),
    # void skippy_ingress_detach(skippy_ingress_t *ingress);
    "skippy_ingress_detach": (None, [_vp]),
    # int skippy_ingress_wait(skippy_ingress_t *ingress, uint32_t timeout_ms);
    "skippy_ingress_wait": (ctypes.c_int, [_vp, _u32]),
    # size_t skippy_ingress_drain(skippy_ingress_t *, skippy_native_fact_v1 *out, size_t max);
    "skippy_ingress_drain": (_size, [_vp, ctypes.POINTER(abi.skippy_native_fact_v1), _size]),
    # void skippy_ingress_stats(const skippy_ingress_t *, skippy_ingress_stats_v1 *out);
    "skippy_ingress_stats": (None, [_vp, ctypes.POINTER(abi.skippy_ingress_stats_v1)]),
    # void skippy_ingress_close(skippy_ingress_t *ingress);
    "skippy_ingress_close": (None, [_vp]),
    # void skippy_ingress_request_cancel(skippy_ingress_t *ingress, uint64_t operation_id);
    "skippy_ingress_request_cancel": (None, [_vp, _u64]),
    # size_t skippy_ingress_debug_read(skippy_ingress_t *ingress, char *out, size_t cap);
    "skippy_ingress_debug_read": (_size, [_vp, ctypes.c_char_p, _size]),
    # skippy_adapter_t *skippy_adapter_create(skippy_ingress_t *ingress, uint32_t flags);
    "skippy_adapter_create": (_vp, [_vp, _u32]),
    # void skippy_adapter_destroy(skippy_adapter_t *adapter);
    "skippy_adapter_destroy": (None, [_vp]),
    # void skippy_adapter_reporter(skippy_adapter_t *, skippy_runtime_event_reporter_v1 *out);
    "skippy_adapter_reporter": (
        None,
        [_vp, ctypes.POINTER(abi.skippy_runtime_event_reporter_v1)],
    ),
    # void skippy_trampoline_v1(const skippy_runtime_event_v1 *event, void *user_data);
    "skippy_trampoline_v1": (None, [ctypes.POINTER(abi.skippy_runtime_event_v1), _vp]),
    # int32_t skippy_operation_begin(skippy_adapter_t *, uint64_t operation_id, uint64_t model);
    "skippy_operation_begin": (_i32, [_vp, _u64, _u64]),
    # void skippy_operation_end(skippy_adapter_t *adapter);
    "skippy_operation_end": (None, [_vp]),
    # int32_t skippy_model_load_begin(skippy_adapter_t *, uint64_t operation_id, uint64_t model);
    "skippy_model_load_begin": (_i32, [_vp, _u64, _u64]),
    # bool skippy_llama_progress_callback(float progress, void *user_data);
    "skippy_llama_progress_callback": (ctypes.c_bool, [ctypes.c_float, _vp]),
    # int32_t skippy_model_load_report_device(skippy_adapter_t *adapter, int32_t n_gpu_layers);
    "skippy_model_load_report_device": (_i32, [_vp, _i32]),
    # void skippy_model_load_end(skippy_adapter_t *, int32_t status, uint32_t failure_code);
    "skippy_model_load_end": (None, [_vp, _i32, _u32]),
    # void skippy_llama_log_callback(int level, const char *text, void *user_data);
    "skippy_llama_log_callback": (None, [ctypes.c_int, ctypes.c_char_p, _vp]),
    # bool skippy_llama_abort_callback(void *user_data);
    "skippy_llama_abort_callback": (ctypes.c_bool, [_vp]),
    # int32_t skippy_adapter_install_fatal_hook(skippy_adapter_t *adapter);
    "skippy_adapter_install_fatal_hook": (_i32, [_vp]),
    # void skippy_adapter_remove_fatal_hook(void);
    "skippy_adapter_remove_fatal_hook": (None, []),
    # void skippy_adapter_set_test_progress_delay_us(skippy_adapter_t *, uint32_t delay_us);
    "skippy_adapter_set_test_progress_delay_us": (None, [_vp, _u32]),
    # int32_t skippy_ggml_resolve(const char *const *library_paths, size_t count);
    "skippy_ggml_resolve": (_i32, [ctypes.POINTER(ctypes.c_char_p), _size]),
    # int32_t skippy_devices_list(skippy_device_info_v1 *out, size_t max, size_t *count);
    "skippy_devices_list": (
        _i32,
        [ctypes.POINTER(abi.skippy_device_info_v1), _size, ctypes.POINTER(_size)],
    ),
    # int32_t skippy_backends_list(char (*names)[64], size_t max, size_t *count);
    "skippy_backends_list": (_i32, [_vp, _size, ctypes.POINTER(_size)]),
    # uint32_t skippy_native_abi_version(void);
    "skippy_native_abi_version": (_u32, []),
    # uint32_t skippy_ingress_abi_version(void);
    "skippy_ingress_abi_version": (_u32, []),
    # uint64_t skippy_native_features(void);
    "skippy_native_features": (_u64, []),
    # const skippy_abi_field_v1 *skippy_abi_fields(size_t *count);
    "skippy_abi_fields": (ctypes.POINTER(abi.skippy_abi_field_v1), [ctypes.POINTER(_size)]),
    # void skippy_test_emit_raw(skippy_adapter_t *adapter, const void *bytes);
    "skippy_test_emit_raw": (None, [_vp, _vp]),
    # skippy_test_producers_t *skippy_test_producers_start(skippy_adapter_t *, uint32_t threads,
    #     uint64_t records_per_thread, uint32_t kind, uint32_t progress_mode);
    "skippy_test_producers_start": (_vp, [_vp, _u32, _u64, _u32, _u32]),
    # int skippy_test_producers_done(skippy_test_producers_t *producers);
    "skippy_test_producers_done": (ctypes.c_int, [_vp]),
    # uint64_t skippy_test_producers_attempts(skippy_test_producers_t *producers);
    "skippy_test_producers_attempts": (_u64, [_vp]),
    # void skippy_test_producers_stop(skippy_test_producers_t *producers);
    "skippy_test_producers_stop": (None, [_vp]),
    # void skippy_test_producers_join(skippy_test_producers_t *, skippy_test_producer_report_v1*);
    "skippy_test_producers_join": (
        None,
        [_vp, ctypes.POINTER(abi.skippy_test_producer_report_v1)],
    ),
    # int skippy_test_hold_gil_until_producers_done(skippy_test_producers_t *, uint32_t timeout);
    "skippy_test_hold_gil_until_producers_done": (ctypes.c_int, [_vp, _u32]),
}


FAMILY_SYMBOLS: Final[dict[abi.FeatureBit, tuple[str, ...]]] = {
    abi.FeatureBit.RUNTIME_EVENTS: (
        "skippy_model_load_begin",
        "skippy_llama_progress_callback",
        "skippy_model_load_report_device",
        "skippy_model_load_end",
    ),
    abi.FeatureBit.RUNTIME_EVENT_REPORTER: ("skippy_adapter_reporter",),
    abi.FeatureBit.DEVICE_EVENTS: (
        "skippy_ggml_resolve",
        "skippy_devices_list",
        "skippy_backends_list",
    ),
    abi.FeatureBit.DIAGNOSTIC_EVENTS: (
        "skippy_llama_log_callback",
        "skippy_adapter_install_fatal_hook",
        "skippy_adapter_remove_fatal_hook",
    ),
}
"""The symbols each optional family needs; a symbol in no family (and not a test hook) is core."""

TEST_SYMBOLS: Final = frozenset(
    {
        "skippy_adapter_set_test_progress_delay_us",
        "skippy_test_emit_raw",
        "skippy_test_producers_start",
        "skippy_test_producers_done",
        "skippy_test_producers_attempts",
        "skippy_test_producers_stop",
        "skippy_test_producers_join",
        "skippy_test_hold_gil_until_producers_done",
    }
)


class NativeLibrary:
    """A loaded, layout-checked native library.

    ``cdll`` exposes every function with its prototype declared (GIL released during calls);
    ``hold_gil_until_producers_done`` is the PyDLL-bound test helper. ``features`` is what can
    be used: the announced mask less the families in ``disabled_families`` (family → its
    missing symbols).
    """

    def __init__(
        self,
        path: Path,
        cdll: ctypes.CDLL,
        pydll: ctypes.PyDLL,
        missing: frozenset[str] = frozenset(),
    ) -> None:
        self.path = path
        self.cdll = cdll
        self._pydll = pydll
        self.abi_version = int(cdll.skippy_native_abi_version())
        self.ingress_abi_version = int(cdll.skippy_ingress_abi_version())
        self.announced_features = int(cdll.skippy_native_features())
        self.disabled_families: dict[abi.FeatureBit, tuple[str, ...]] = {
            bit: tuple(name for name in symbols if name in missing)
            for bit, symbols in FAMILY_SYMBOLS.items()
            if self.announced_features & bit and any(name in missing for name in symbols)
        }
        self.features = self.announced_features
        for bit in self.disabled_families:
            self.features &= ~int(bit)

    def has(self, family: abi.FeatureBit) -> bool:
        """Whether ``family`` is announced and all its symbols are there."""
        return bool(self.features & family)

    @property
    def disabled_mask(self) -> int:
        """The announced families turned off for a missing symbol, as a feature mask."""
        mask = 0
        for bit in self.disabled_families:
            mask |= int(bit)
        return mask

    def capabilities(self) -> Capabilities:
        return Capabilities.from_mask(self.features)

    def address_of(self, name: str) -> int:
        """Address of an exported C function (to put into llama.cpp's callback fields)."""
        pointer = ctypes.cast(getattr(self.cdll, name), ctypes.c_void_p).value
        if pointer is None:
            raise NativeAbiIncompatible(f"symbol {name} has no address")
        return int(pointer)

    def hold_gil_until_producers_done(self, producers: int, timeout_ms: int) -> bool:
        """Runs the C wait loop WITH the GIL held (ctypes.PyDLL)."""
        return bool(self._pydll.skippy_test_hold_gil_until_producers_done(producers, timeout_ms))

    def abi_fields(self) -> list[tuple[str, str, int, int]]:
        """The library's layout table: (struct_name, field_name, offset, size) rows."""
        count = ctypes.c_size_t(0)
        rows = self.cdll.skippy_abi_fields(ctypes.byref(count))
        out: list[tuple[str, str, int, int]] = []
        for i in range(count.value):
            row = rows[i]
            out.append(
                (
                    bytes(row.struct_name).decode("ascii"),
                    bytes(row.field_name).decode("ascii"),
                    int(row.offset),
                    int(row.size),
                )
            )
        return out


def _candidate_paths() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here / f"{LIBRARY_STEM}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]


def find_native_library(override: Path | None = None) -> Path:
    """The library file to load: ``override`` (``SKIPPY_NATIVE_LIBRARY``), else the one next to
    this package."""
    if override is not None:
        if not override.is_file():
            raise NativeLibraryUnavailable(f"{ENV_LIBRARY} names a missing file: {override.name}")
        return override
    for candidate in _candidate_paths():
        if candidate.is_file():
            return candidate
    raise NativeLibraryUnavailable(
        f"{LIBRARY_STEM} is not built (run: python setup.py build_ext --inplace)"
    )


_OPTIONAL_SYMBOLS: Final = TEST_SYMBOLS | {
    name for symbols in FAMILY_SYMBOLS.values() for name in symbols
}


def _declare(cdll: ctypes.CDLL, pydll: ctypes.PyDLL) -> frozenset[str]:
    """Declares every prototype the library has; returns the optional symbols it lacks."""
    missing: set[str] = set()
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            function = getattr(cdll, name)
        except AttributeError as exc:
            if name in _OPTIONAL_SYMBOLS:
                missing.add(name)
                continue
            raise NativeAbiIncompatible(f"native library lacks symbol {name}") from exc
        function.restype = restype
        function.argtypes = argtypes
    if "skippy_test_hold_gil_until_producers_done" not in missing:
        hold = pydll.skippy_test_hold_gil_until_producers_done
        restype, argtypes = _PROTOTYPES["skippy_test_hold_gil_until_producers_done"]
        hold.restype = restype
        hold.argtypes = argtypes
    return frozenset(missing)


def check_layout(library: NativeLibrary) -> None:
    """Raises NativeAbiIncompatible unless every boundary struct matches its ctypes mirror."""
    if library.abi_version != abi.RUNTIME_EVENT_ABI_VERSION:
        raise NativeAbiIncompatible(
            f"event ABI {library.abi_version}, binding expects {abi.RUNTIME_EVENT_ABI_VERSION}"
        )
    if library.ingress_abi_version != abi.INGRESS_ABI_VERSION:
        raise NativeAbiIncompatible(
            f"ingress ABI {library.ingress_abi_version}, binding expects {abi.INGRESS_ABI_VERSION}"
        )
    described: set[str] = set()
    for struct_name, field_name, offset, size in library.abi_fields():
        cls = getattr(abi, struct_name, None)
        if cls is None:
            continue  # a struct newer than this binding: it does not use it
        described.add(struct_name)
        if field_name == "":
            actual = ctypes.sizeof(cls)
            if actual != size:
                raise NativeAbiIncompatible(f"sizeof({struct_name}) is {size} in C, {actual} here")
            continue
        descriptor = getattr(cls, field_name, None)
        if descriptor is None:
            raise NativeAbiIncompatible(f"{struct_name}.{field_name} is missing from the binding")
        if int(descriptor.offset) != offset or int(descriptor.size) != size:
            raise NativeAbiIncompatible(
                f"{struct_name}.{field_name} is at {offset}+{size} in C, "
                f"{descriptor.offset}+{descriptor.size} here"
            )
    missing = sorted(set(abi.BOUNDARY_STRUCT_NAMES) - described)
    if missing:
        raise NativeAbiIncompatible(f"library does not describe {', '.join(missing)}")


def open_native_library(override: Path | None = None, disabled: bool = False) -> NativeLibrary:
    """The library a process's settings choose: none when ``disabled`` (SKIPPY_NATIVE_DISABLE),
    else ``override`` (SKIPPY_NATIVE_LIBRARY) or the one next to this package, opened and
    checked (:func:`load_native_library`)."""
    if disabled:
        raise NativeLibraryUnavailable(f"disabled by {ENV_DISABLE}")
    return load_native_library(find_native_library(override))


def load_native_library(path: Path | None = None) -> NativeLibrary:
    """Opens and checks the native library (``path``, else the one next to this package).
    Never cached: each call re-checks the layout."""
    resolved = path if path is not None else find_native_library()
    if not resolved.is_file():
        raise NativeLibraryUnavailable(f"native library missing: {resolved.name}")
    try:
        cdll = ctypes.CDLL(str(resolved))
        pydll = ctypes.PyDLL(str(resolved))
    except OSError as exc:
        # Details name the file, never its absolute path (it may end up in an event).
        reason = str(exc).replace(str(resolved), resolved.name)
        raise NativeLibraryUnavailable(f"cannot open {resolved.name}: {reason}") from exc
    missing = _declare(cdll, pydll)
    library = NativeLibrary(resolved, cdll, pydll, missing)
    check_layout(library)
    return library


@functools.cache
def native_library() -> NativeLibrary:
    """The process-wide library (loaded and checked once; errors are not cached)."""
    return load_native_library()
