"""ctypes mirrors of the native ABI (native/include/skippy/*.h).

Contract: every class carries the exact C struct name and field names, with the C declaration in
a comment above it, so a grep crosses the boundary. Layouts are checked against the library's own
``skippy_abi_fields()`` table at load time (see library.py); a mismatch refuses to load. Enum
mirrors carry the C values without the ``SKIPPY_`` prefix. This module imports nothing beyond the
standard library and the kind enum of ``skippyctl.events.native_kinds`` (never llama_cpp).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum, IntFlag
from typing import Final

from skippyctl.events.native_kinds import NativeKind

# ---- versions and sizes (skippy_event.h, skippy_ingress.h) ----

RUNTIME_EVENT_ABI_VERSION: Final = 1
RUNTIME_EVENT_V1_BASE_SIZE: Final = 112
RUNTIME_EVENT_V1_FULL_SIZE: Final = 144
RUNTIME_EVENT_MAX_DETAIL_LEN_BYTES: Final = 1024 * 1024
RUNTIME_EVENT_DETAIL_COPY_BYTES: Final = 256
INGRESS_ABI_VERSION: Final = 1
INGRESS_DEFAULT_TERMINAL_CAPACITY: Final = 1024
INGRESS_DEFAULT_DIAGNOSTIC_CAPACITY: Final = 1024
INGRESS_DEFAULT_PROGRESS_SLOTS: Final = 64
INGRESS_DEFAULT_DEBUG_BYTES: Final = 65536
DEBUG_MAX_MESSAGE_BYTES: Final = 1024
LANE_COUNT: Final = 3
LOG_LEVEL_COUNT: Final = 6


# ---- discriminants ----


class Category(IntEnum):
    """``enum skippy_category``."""

    MODEL_OPEN = 1
    BACKEND = 2
    SESSION = 3
    KV = 4
    WARNING = 5
    DEVICE = 6
    DIAGNOSTIC = 7
    UNLOAD = 8


# ``enum skippy_kind`` is defined with the native kind table (what the host makes of each
# kind), the one place kinds are mapped; it is re-exported here with the other C mirrors.
Kind = NativeKind


class Emitter(IntEnum):
    """``enum skippy_emitter``."""

    UNKNOWN = 0
    OPEN_THREAD = 1
    WORKER_THREAD = 2


class ProgressUnit(IntEnum):
    """``enum skippy_progress_unit``."""

    NONE = 0
    BYTES = 1
    ITEMS = 2
    TENSORS = 3
    STEPS = 4


class FailureCode(IntEnum):
    """``enum skippy_failure_code``."""

    NONE = 0
    INVALID_ARGUMENT = 1
    IO_ERROR = 2
    MODEL_ERROR = 3
    RUNTIME_ERROR = 4
    BACKEND_ERROR = 5
    CANCELLED = 6
    INTERNAL_ERROR = 7


class Status(IntEnum):
    """``enum skippy_status``."""

    OK = 0
    ERROR = 1
    INVALID_ARGUMENT = 2
    UNSUPPORTED = 3
    BUFFER_TOO_SMALL = 4
    IO_ERROR = 5
    MODEL_ERROR = 6
    RUNTIME_ERROR = 7


class FeatureBit(IntEnum):
    """``SKIPPY_FEATURE_*`` bits of the u64 feature mask."""

    RUNTIME_EVENTS = 1 << 24
    RUNTIME_EVENT_REPORTER = 1 << 31
    MODEL_LOAD_EVENTS_V2 = 1 << 32
    KV_EVENTS = 1 << 33
    DEVICE_EVENTS = 1 << 34
    DIAGNOSTIC_EVENTS = 1 << 35
    UNLOAD_EVENTS = 1 << 36


class Lane(IntEnum):
    """``enum skippy_lane``: the service class a fact was delivered through."""

    TERMINAL = 0
    PROGRESS = 1
    DIAGNOSTIC = 2


class FactFlag(IntFlag):
    """``SKIPPY_FACT_*`` flags of a drained record."""

    HAS_SUMMARIES = 1 << 0
    DETAIL_TRUNCATED = 1 << 1
    UNKNOWN_KIND = 1 << 2
    LARGER_STRUCT = 1 << 3


class AdapterFlag(IntFlag):
    """``SKIPPY_ADAPTER_*`` flags of skippy_adapter_create."""

    CAPTURE_DEBUG_LOG = 1 << 0


class GgmlDeviceType(IntEnum):
    """``enum ggml_backend_dev_type`` of the llama.cpp that llama-cpp-python 0.3.36 vendors."""

    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3
    META = 4


class GgmlLogLevel(IntEnum):
    """``enum ggml_log_level``: index into ``log_messages_by_level``."""

    NONE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    CONT = 5


class TestProducerMode(IntEnum):
    """``enum skippy_test_producer_mode``."""

    __test__ = False  # not a pytest test class

    TRAMPOLINE = 0
    PROGRESS_PER_THREAD = 1
    LLAMA_PROGRESS = 2


# ---- structs ----


# typedef struct skippy_runtime_event_v1 {
#     uint32_t abi_version; uint32_t struct_size; uint32_t category; uint32_t kind;
#     uint32_t emitter; uint32_t reserved0; uint64_t sequence; uint64_t timestamp_mono_ns;
#     uint64_t model_id; uint64_t stage_id; uint64_t session_id; uint64_t progress_current;
#     uint64_t progress_total; uint32_t progress_unit; uint32_t failure_code; int32_t status;
#     uint32_t reserved1; const char *detail_ptr; uint64_t detail_len;
#     uint64_t numeric_summary_0; uint64_t numeric_summary_1; uint64_t numeric_summary_2;
#     uint64_t numeric_summary_3;
# } skippy_runtime_event_v1;
class skippy_runtime_event_v1(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("category", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("emitter", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("sequence", ctypes.c_uint64),
        ("timestamp_mono_ns", ctypes.c_uint64),
        ("model_id", ctypes.c_uint64),
        ("stage_id", ctypes.c_uint64),
        ("session_id", ctypes.c_uint64),
        ("progress_current", ctypes.c_uint64),
        ("progress_total", ctypes.c_uint64),
        ("progress_unit", ctypes.c_uint32),
        ("failure_code", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("reserved1", ctypes.c_uint32),
        ("detail_ptr", ctypes.c_void_p),  # const char *: borrowed, not NUL-terminated
        ("detail_len", ctypes.c_uint64),
        ("numeric_summary_0", ctypes.c_uint64),
        ("numeric_summary_1", ctypes.c_uint64),
        ("numeric_summary_2", ctypes.c_uint64),
        ("numeric_summary_3", ctypes.c_uint64),
    ]


# typedef void (*skippy_runtime_event_callback_v1)(const skippy_runtime_event_v1 *event,
#                                                  void *user_data);
skippy_runtime_event_callback_v1 = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(skippy_runtime_event_v1), ctypes.c_void_p
)


# typedef struct skippy_runtime_event_reporter_v1 {
#     uint32_t abi_version; uint32_t struct_size;
#     skippy_runtime_event_callback_v1 callback; void *user_data;
# } skippy_runtime_event_reporter_v1;
class skippy_runtime_event_reporter_v1(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("callback", skippy_runtime_event_callback_v1),
        ("user_data", ctypes.c_void_p),
    ]


# typedef struct skippy_ingress_config_v1 {
#     uint32_t struct_size; uint32_t terminal_capacity; uint32_t diagnostic_capacity;
#     uint32_t progress_slots; uint32_t debug_bytes; uint32_t reserved;
# } skippy_ingress_config_v1;
class skippy_ingress_config_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("terminal_capacity", ctypes.c_uint32),
        ("diagnostic_capacity", ctypes.c_uint32),
        ("progress_slots", ctypes.c_uint32),
        ("debug_bytes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


# typedef struct skippy_native_fact_v1 {
#     uint32_t struct_size; uint32_t lane; uint32_t flags; uint32_t source_struct_size;
#     uint64_t operation_id; uint64_t ingress_sequence; uint64_t coalesced_count;
#     skippy_runtime_event_v1 event; uint32_t detail_copied_len; uint32_t reserved;
#     uint8_t detail[256];
# } skippy_native_fact_v1;
class skippy_native_fact_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("lane", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("source_struct_size", ctypes.c_uint32),
        ("operation_id", ctypes.c_uint64),
        ("ingress_sequence", ctypes.c_uint64),
        ("coalesced_count", ctypes.c_uint64),
        ("event", skippy_runtime_event_v1),
        ("detail_copied_len", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("detail", ctypes.c_uint8 * RUNTIME_EVENT_DETAIL_COPY_BYTES),
    ]


# typedef struct skippy_lane_stats_v1 {
#     uint64_t accepted; uint64_t drained; uint64_t dropped_full; uint64_t coalesced;
# } skippy_lane_stats_v1;
class skippy_lane_stats_v1(ctypes.Structure):
    _fields_ = [
        ("accepted", ctypes.c_uint64),
        ("drained", ctypes.c_uint64),
        ("dropped_full", ctypes.c_uint64),
        ("coalesced", ctypes.c_uint64),
    ]


# typedef struct skippy_ingress_stats_v1 {
#     uint32_t struct_size; uint32_t reserved; skippy_lane_stats_v1 lanes[3];
#     uint64_t suppressed_regression; uint64_t progress_contended;
#     uint64_t rejected_abi_version; uint64_t rejected_struct_size; uint64_t rejected_detail;
#     uint64_t rejected_discriminant; uint64_t rejected_closed; uint64_t unknown_kind;
#     uint64_t detail_truncated; uint64_t log_messages_by_level[6];
#     uint64_t debug_lines_captured; uint64_t debug_bytes_dropped;
# } skippy_ingress_stats_v1;
class skippy_ingress_stats_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("lanes", skippy_lane_stats_v1 * LANE_COUNT),
        ("suppressed_regression", ctypes.c_uint64),
        ("progress_contended", ctypes.c_uint64),
        ("rejected_abi_version", ctypes.c_uint64),
        ("rejected_struct_size", ctypes.c_uint64),
        ("rejected_detail", ctypes.c_uint64),
        ("rejected_discriminant", ctypes.c_uint64),
        ("rejected_closed", ctypes.c_uint64),
        ("unknown_kind", ctypes.c_uint64),
        ("detail_truncated", ctypes.c_uint64),
        ("log_messages_by_level", ctypes.c_uint64 * LOG_LEVEL_COUNT),
        ("debug_lines_captured", ctypes.c_uint64),
        ("debug_bytes_dropped", ctypes.c_uint64),
    ]


# typedef struct skippy_device_info_v1 {
#     uint32_t struct_size; uint32_t type; uint64_t memory_free; uint64_t memory_total;
#     char name[64]; char description[128];
# } skippy_device_info_v1;
class skippy_device_info_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("type", ctypes.c_uint32),
        ("memory_free", ctypes.c_uint64),
        ("memory_total", ctypes.c_uint64),
        ("name", ctypes.c_char * 64),
        ("description", ctypes.c_char * 128),
    ]


# typedef struct skippy_abi_field_v1 {
#     const char *struct_name; const char *field_name; uint32_t offset; uint32_t size;
# } skippy_abi_field_v1;
class skippy_abi_field_v1(ctypes.Structure):
    _fields_ = [
        ("struct_name", ctypes.c_char_p),
        ("field_name", ctypes.c_char_p),
        ("offset", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
    ]


# typedef struct skippy_test_producer_report_v1 {
#     uint32_t struct_size; uint32_t threads; uint64_t records_attempted; uint64_t elapsed_ns;
#     uint64_t latency_p50_ns; uint64_t latency_p99_ns; uint64_t latency_max_ns;
# } skippy_test_producer_report_v1;
class skippy_test_producer_report_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("threads", ctypes.c_uint32),
        ("records_attempted", ctypes.c_uint64),
        ("elapsed_ns", ctypes.c_uint64),
        ("latency_p50_ns", ctypes.c_uint64),
        ("latency_p99_ns", ctypes.c_uint64),
        ("latency_max_ns", ctypes.c_uint64),
    ]


# Every boundary struct the binding relies on; the load-time check requires the library to
# describe each of them (library.py looks the classes up by name in this module at check time).
BOUNDARY_STRUCT_NAMES: Final[tuple[str, ...]] = (
    "skippy_runtime_event_v1",
    "skippy_runtime_event_reporter_v1",
    "skippy_ingress_config_v1",
    "skippy_native_fact_v1",
    "skippy_lane_stats_v1",
    "skippy_ingress_stats_v1",
    "skippy_device_info_v1",
    "skippy_abi_field_v1",
    "skippy_test_producer_report_v1",
)
