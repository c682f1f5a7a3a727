"""Legacy fallback and refusal: absent, disabled, unloadable, or layout-incompatible libraries."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skippyctl.native import (
    Capabilities,
    NativeAbiIncompatible,
    NativeLibraryUnavailable,
    abi,
    load_native_library,
    open_native_library,
)
from skippyctl.native.library import ENV_DISABLE, ENV_LIBRARY, find_native_library

ROOT = Path(__file__).resolve().parents[2]


def test_the_disable_setting_forces_legacy_mode() -> None:
    with pytest.raises(NativeLibraryUnavailable, match=ENV_DISABLE):
        open_native_library(find_native_library(), disabled=True)


def test_the_library_setting_naming_a_missing_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(NativeLibraryUnavailable, match=ENV_LIBRARY) as info:
        open_native_library(tmp_path / "nope.so")
    assert str(tmp_path) not in info.value.detail  # never an absolute path


def test_a_file_that_is_not_a_shared_library_is_unavailable(tmp_path: Path) -> None:
    bogus = tmp_path / "_skippy_native.so"
    bogus.write_bytes(b"not an ELF file")
    with pytest.raises(NativeLibraryUnavailable, match="cannot open") as info:
        load_native_library(bogus)
    assert str(tmp_path) not in info.value.detail


def test_the_library_setting_selects_the_file(tmp_path: Path) -> None:
    copy = tmp_path / "copy" / find_native_library().name
    copy.parent.mkdir()
    shutil.copy(find_native_library(), copy)
    assert open_native_library(copy).path == copy
    assert open_native_library().path == find_native_library()  # unset: the one built here


def test_wrong_struct_size_in_the_binding_is_incompatible(monkeypatch: pytest.MonkeyPatch) -> None:
    class skippy_native_fact_v1(ctypes.Structure):
        _fields_ = [*abi.skippy_native_fact_v1._fields_, ("extra", ctypes.c_uint64)]

    monkeypatch.setattr(abi, "skippy_native_fact_v1", skippy_native_fact_v1)
    with pytest.raises(NativeAbiIncompatible, match="skippy_native_fact_v1"):
        load_native_library()


def test_wrong_field_offset_in_the_binding_is_incompatible(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = list(abi.skippy_runtime_event_v1._fields_)
    fields[2], fields[3] = fields[3], fields[2]  # kind before category: same size, wrong offsets

    class skippy_runtime_event_v1(ctypes.Structure):
        _fields_ = fields

    monkeypatch.setattr(abi, "skippy_runtime_event_v1", skippy_runtime_event_v1)
    with pytest.raises(NativeAbiIncompatible, match=r"skippy_runtime_event_v1\.(category|kind)"):
        load_native_library()


def test_field_missing_from_the_binding_is_incompatible(monkeypatch: pytest.MonkeyPatch) -> None:
    class skippy_device_info_v1(ctypes.Structure):
        _fields_ = [
            ("struct_size", ctypes.c_uint32),
            ("kind", ctypes.c_uint32),  # renamed: "type" is gone
            ("memory_free", ctypes.c_uint64),
            ("memory_total", ctypes.c_uint64),
            ("name", ctypes.c_char * 64),
            ("description", ctypes.c_char * 128),
        ]

    monkeypatch.setattr(abi, "skippy_device_info_v1", skippy_device_info_v1)
    with pytest.raises(NativeAbiIncompatible, match="skippy_device_info_v1.type"):
        load_native_library()


def test_abi_version_mismatch_is_incompatible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(abi, "RUNTIME_EVENT_ABI_VERSION", 2)
    with pytest.raises(NativeAbiIncompatible, match="event ABI"):
        load_native_library()


def test_unknown_feature_bits_are_tolerated_and_listed() -> None:
    caps = Capabilities.from_mask(int(abi.FeatureBit.RUNTIME_EVENTS) | (1 << 50) | (1 << 3))
    assert caps.runtime_events
    assert not caps.kv_events
    assert caps.unknown_bits == (3, 50)
    everything = Capabilities.from_mask(sum(int(b) for b in abi.FeatureBit))
    assert everything.unload_events and everything.model_load_events_v2
    assert everything.unknown_bits == ()


def test_importing_the_binding_loads_neither_the_library_nor_llama_cpp() -> None:
    code = (
        "import sys, skippyctl.native, skippyctl.native.abi, skippyctl.native.ingress; "
        "print('llama_cpp' in sys.modules, "
        "any('_skippy_native' in str(getattr(m, '__file__', '')) for m in sys.modules.values()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "False"]
