"""The event ABI is the reference layout, byte for byte, on both sides of the boundary."""

from __future__ import annotations

import ctypes
import re
from enum import IntEnum
from pathlib import Path

import pytest

from skippyctl.native import NativeLibrary, SharedIngress, abi
from skippyctl.native.ingress import FACT_DTYPE, EngineAdapter, record_format
from skippyctl.native.library import check_layout

HEADERS = Path(__file__).resolve().parents[2] / "native" / "include" / "skippy"

# skippy-facts.md, "Native event ABI (C, 64-bit)": offset, field, size.
REFERENCE_EVENT_LAYOUT = [
    (0, "abi_version", 4),
    (4, "struct_size", 4),
    (8, "category", 4),
    (12, "kind", 4),
    (16, "emitter", 4),
    (20, "reserved0", 4),
    (24, "sequence", 8),
    (32, "timestamp_mono_ns", 8),
    (40, "model_id", 8),
    (48, "stage_id", 8),
    (56, "session_id", 8),
    (64, "progress_current", 8),
    (72, "progress_total", 8),
    (80, "progress_unit", 4),
    (84, "failure_code", 4),
    (88, "status", 4),
    (92, "reserved1", 4),
    (96, "detail_ptr", 8),
    (104, "detail_len", 8),
    (112, "numeric_summary_0", 8),
    (120, "numeric_summary_1", 8),
    (128, "numeric_summary_2", 8),
    (136, "numeric_summary_3", 8),
]


def library_rows(lib: NativeLibrary) -> dict[tuple[str, str], tuple[int, int]]:
    return {(s, f): (offset, size) for s, f, offset, size in lib.abi_fields()}


@pytest.mark.parametrize(("offset", "name", "size"), REFERENCE_EVENT_LAYOUT)
def test_event_field_sits_at_the_reference_offset(
    lib: NativeLibrary, offset: int, name: str, size: int
) -> None:
    descriptor = getattr(abi.skippy_runtime_event_v1, name)
    assert (descriptor.offset, descriptor.size) == (offset, size)
    assert library_rows(lib)[("skippy_runtime_event_v1", name)] == (offset, size)


def test_event_has_exactly_the_reference_fields() -> None:
    names = [name for name, _ in abi.skippy_runtime_event_v1._fields_]
    assert names == [name for _, name, _ in REFERENCE_EVENT_LAYOUT]


def test_base_full_and_reporter_sizes(lib: NativeLibrary) -> None:
    rows = library_rows(lib)
    assert abi.skippy_runtime_event_v1.numeric_summary_0.offset == 112
    assert abi.RUNTIME_EVENT_V1_BASE_SIZE == 112
    assert ctypes.sizeof(abi.skippy_runtime_event_v1) == abi.RUNTIME_EVENT_V1_FULL_SIZE == 144
    assert rows[("skippy_runtime_event_v1", "")] == (0, 144)
    assert ctypes.sizeof(abi.skippy_runtime_event_reporter_v1) == 24
    assert rows[("skippy_runtime_event_reporter_v1", "")] == (0, 24)
    assert rows[("skippy_runtime_event_reporter_v1", "callback")] == (8, 8)
    assert rows[("skippy_runtime_event_reporter_v1", "user_data")] == (16, 8)
    assert ctypes.sizeof(abi.skippy_native_fact_v1) == 448
    assert ctypes.sizeof(abi.skippy_ingress_stats_v1) == 240
    assert ctypes.sizeof(abi.skippy_device_info_v1) == 216
    # the decoders are derived from the ctypes mirror: same record size
    assert FACT_DTYPE.itemsize == 448
    assert record_format(()).size == record_format(("event.kind", "detail")).size == 448


def test_every_row_the_library_reports_matches_the_ctypes_mirror(lib: NativeLibrary) -> None:
    rows = lib.abi_fields()
    described = {s for s, _, _, _ in rows}
    assert described == set(abi.BOUNDARY_STRUCT_NAMES)
    for struct_name, field_name, offset, size in rows:
        cls = getattr(abi, struct_name)
        if field_name == "":
            assert ctypes.sizeof(cls) == size, struct_name
        else:
            descriptor = getattr(cls, field_name)
            assert (descriptor.offset, descriptor.size) == (offset, size), (struct_name, field_name)
    # and every ctypes field is described by the library (nothing unchecked)
    for struct_name in abi.BOUNDARY_STRUCT_NAMES:
        for field_name, *_ in getattr(abi, struct_name)._fields_:
            assert (struct_name, field_name) in library_rows(lib)
    check_layout(lib)


def test_discriminants_have_the_reference_values() -> None:
    assert [(c.name, c.value) for c in abi.Category] == [
        ("MODEL_OPEN", 1),
        ("BACKEND", 2),
        ("SESSION", 3),
        ("KV", 4),
        ("WARNING", 5),
        ("DEVICE", 6),
        ("DIAGNOSTIC", 7),
        ("UNLOAD", 8),
    ]
    kinds = sorted(k.value for k in abi.Kind)
    assert kinds == [
        *range(1, 6),
        *range(100, 105),
        *range(200, 205),
        *range(300, 309),
        *range(400, 405),
        *range(500, 505),
    ]
    assert abi.Kind.MODEL_LOAD_PHASE_CHANGED == 100
    assert abi.Kind.KV_INITIALIZED == 200
    assert abi.Kind.DEVICE_BACKEND_INITIALIZED == 300
    assert abi.Kind.DIAGNOSTIC_WARNING_RAISED == 400
    assert abi.Kind.UNLOAD_STARTED == 500
    assert [e.value for e in abi.Emitter] == [0, 1, 2]
    assert [(u.name, u.value) for u in abi.ProgressUnit] == [
        ("NONE", 0),
        ("BYTES", 1),
        ("ITEMS", 2),
        ("TENSORS", 3),
        ("STEPS", 4),
    ]
    assert abi.FailureCode.CANCELLED == 6
    assert abi.FailureCode.INTERNAL_ERROR == 7
    assert abi.Status.RUNTIME_ERROR == 7
    assert abi.Status.UNSUPPORTED == 3
    assert {b.name: b.value.bit_length() - 1 for b in abi.FeatureBit} == {
        "RUNTIME_EVENTS": 24,
        "RUNTIME_EVENT_REPORTER": 31,
        "MODEL_LOAD_EVENTS_V2": 32,
        "KV_EVENTS": 33,
        "DEVICE_EVENTS": 34,
        "DIAGNOSTIC_EVENTS": 35,
        "UNLOAD_EVENTS": 36,
    }


def _c_enum_values(text: str, prefix: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(rf"\b{prefix}([A-Z0-9_]+) = (-?\d+)", text)}


@pytest.mark.parametrize(
    ("prefix", "enum"),
    [
        ("SKIPPY_CATEGORY_", abi.Category),
        ("SKIPPY_KIND_", abi.Kind),
        ("SKIPPY_EMITTER_", abi.Emitter),
        ("SKIPPY_PROGRESS_UNIT_", abi.ProgressUnit),
        ("SKIPPY_FAILURE_", abi.FailureCode),
        ("SKIPPY_STATUS_", abi.Status),
        ("SKIPPY_LANE_", abi.Lane),
        ("SKIPPY_GGML_DEVICE_TYPE_", abi.GgmlDeviceType),
        ("SKIPPY_TEST_MODE_", abi.TestProducerMode),
    ],
)
def test_python_enum_mirrors_the_c_header(prefix: str, enum: type[IntEnum]) -> None:
    text = (HEADERS / "skippy_event.h").read_text() + (HEADERS / "skippy_ingress.h").read_text()
    c_values = _c_enum_values(text, prefix)
    c_values.pop("COUNT", None)  # SKIPPY_LANE_COUNT is a bound, not a lane
    assert c_values == {member.name: member.value for member in enum}


def test_feature_and_flag_defines_mirror_the_c_header() -> None:
    text = (HEADERS / "skippy_event.h").read_text() + (HEADERS / "skippy_ingress.h").read_text()
    features = {
        m[1]: 1 << int(m[2])
        for m in re.finditer(r"#define SKIPPY_FEATURE_([A-Z0-9_]+) \(1ull << (\d+)\)", text)
    }
    assert features == {bit.name: bit.value for bit in abi.FeatureBit}
    flags = {
        m[1]: 1 << int(m[2])
        for m in re.finditer(r"#define SKIPPY_FACT_([A-Z_]+) \(1u << (\d+)\)", text)
    }
    assert flags == {flag.name: flag.value for flag in abi.FactFlag}


def test_versions_and_features(lib: NativeLibrary) -> None:
    assert lib.abi_version == abi.RUNTIME_EVENT_ABI_VERSION == 1
    assert lib.ingress_abi_version == abi.INGRESS_ABI_VERSION == 1
    implemented = (
        abi.FeatureBit.RUNTIME_EVENTS
        | abi.FeatureBit.RUNTIME_EVENT_REPORTER
        | abi.FeatureBit.DEVICE_EVENTS
        | abi.FeatureBit.DIAGNOSTIC_EVENTS
    )
    assert lib.features == lib.announced_features == implemented
    caps = lib.capabilities()
    assert caps.runtime_events and caps.runtime_event_reporter
    assert caps.device_events and caps.diagnostic_events
    assert not (caps.kv_events or caps.model_load_events_v2 or caps.unload_events)
    assert caps.unknown_bits == ()


def test_reporter_points_at_the_trampoline(adapter: EngineAdapter) -> None:
    reporter = adapter.reporter()
    assert reporter.abi_version == 1
    assert reporter.struct_size == 24
    callback = ctypes.cast(reporter.callback, ctypes.c_void_p).value
    assert callback == adapter.trampoline_address
    assert reporter.user_data == adapter.handle


def test_region_is_position_independent(lib: NativeLibrary, ingress: SharedIngress) -> None:
    """A second mapping of the same fd (another address) attaches and sees the same facts."""
    engine_view = SharedIngress.attach(ingress.fd, library=lib)
    try:
        assert engine_view.mapping_address != ingress.mapping_address
        with EngineAdapter(engine_view) as engine:
            engine.operation_begin(9)
            engine.emit(
                abi.skippy_runtime_event_v1(abi_version=1, struct_size=144, category=1, kind=1)
            )
            engine.operation_end()
        facts = ingress.drain()
        assert [(f.operation_id, f.kind) for f in facts] == [(9, 1)]
    finally:
        engine_view.close()
