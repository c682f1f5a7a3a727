"""ctypes mirrors of the serving plugin ABI (native/include/skippy/skippy_plugin.h).

Contract: every class carries the exact C struct name and field names, with the C declaration in
a comment above it, so a grep crosses the boundary; enum mirrors carry the C values without the
``SKIPPY_PLUGIN_`` prefix. ``tests/plugins/test_abi.py`` compiles a C program against the header
and compares every size and offset with these mirrors. Standard library only.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum, IntFlag
from typing import Final

PLUGIN_ABI_VERSION: Final = 1
PLUGIN_INIT_SYMBOL: Final = "skippy_plugin_init_v1"
PLUGIN_V1_BASE_SIZE: Final = 80
"""The first vtable (no ``activate``): the smallest ``struct_size`` a host accepts."""
PLUGIN_V1_SIZE: Final = 88
PLUGIN_IDS_V1_SIZE: Final = 24
PLUGIN_TOKENS_V1_SIZE: Final = 24
PLUGIN_BEGIN_V1_SIZE: Final = 32
PLUGIN_QUERY_V1_SIZE: Final = 56
PLUGIN_OUTCOME_V1_BASE_SIZE: Final = 16
"""The first outcome (no ``kind``/``discard_reason``)."""
PLUGIN_OUTCOME_V1_SIZE: Final = 24
PLUGIN_RECEIPT_V1_SIZE: Final = 112
PLUGIN_ACTIVATION_V1_SIZE: Final = 64


class PluginStatus(IntEnum):
    """``enum skippy_plugin_status``."""

    OK = 0
    NO_PROPOSAL = 1
    ERROR = 2
    INVALID_ARGUMENT = 3
    UNSUPPORTED = 4


class StopReasonCode(IntEnum):
    """``enum skippy_plugin_stop_reason`` (``SKIPPY_PLUGIN_STOP_*``)."""

    UNKNOWN = 0
    EOS = 1
    STRING = 2
    LENGTH = 3
    CANCELLED = 4
    TIMEOUT = 5
    ERROR = 6


class AbortReasonCode(IntEnum):
    """``enum skippy_plugin_abort_reason`` (``SKIPPY_PLUGIN_ABORT_*``)."""

    UNKNOWN = 0
    CANCELLED = 1
    TIMEOUT = 2
    ERROR = 3
    SHUTDOWN = 4
    RESTARTED = 5


class OutcomeKindCode(IntEnum):
    """``enum skippy_plugin_outcome_kind`` (``SKIPPY_PLUGIN_OUTCOME_*``)."""

    UNKNOWN = 0
    FULL_ACCEPT = 1
    FIRST_MISMATCH = 2
    STOPPED = 3
    DISCARDED = 4


class DiscardReasonCode(IntEnum):
    """``enum skippy_plugin_discard_reason`` (``SKIPPY_PLUGIN_DISCARD_*``)."""

    NONE = 0
    DEADLINE_EXCEEDED = 1
    INVALID_TOKEN_COUNT = 2
    INVALID_TOKEN_ID = 3
    POSITION_MISMATCH = 4
    EXECUTION_FAILED = 5


class SpecModeCode(IntEnum):
    """``enum skippy_plugin_spec_mode`` (``SKIPPY_PLUGIN_SPEC_*``)."""

    UNKNOWN = 0
    OFF = 1
    NGRAM = 2
    PLUGIN = 3
    DRAFT = 4
    AUTO = 5


class IdsFlag(IntFlag):
    """``SKIPPY_PLUGIN_IDS_*`` bits of ``skippy_plugin_ids_v1.flags``."""

    HAS_SESSION = 1 << 0


# typedef struct skippy_plugin_ids_v1 {
#     uint32_t struct_size; uint32_t flags; uint64_t request_id; uint64_t session_id;
# } skippy_plugin_ids_v1;
class skippy_plugin_ids_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("request_id", ctypes.c_uint64),
        ("session_id", ctypes.c_uint64),
    ]


# typedef struct skippy_plugin_tokens_v1 {
#     uint64_t start; const int32_t *ids; uint64_t count;
# } skippy_plugin_tokens_v1;
class skippy_plugin_tokens_v1(ctypes.Structure):
    _fields_ = [
        ("start", ctypes.c_uint64),
        ("ids", ctypes.POINTER(ctypes.c_int32)),
        ("count", ctypes.c_uint64),
    ]


# typedef struct skippy_plugin_begin_v1 {
#     uint32_t struct_size; uint32_t reserved; const int32_t *prompt; uint64_t prompt_count;
#     uint64_t reused_count;
# } skippy_plugin_begin_v1;
class skippy_plugin_begin_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("prompt", ctypes.POINTER(ctypes.c_int32)),
        ("prompt_count", ctypes.c_uint64),
        ("reused_count", ctypes.c_uint64),
    ]


# typedef struct skippy_plugin_query_v1 {
#     uint32_t struct_size; uint32_t capacity; uint64_t deadline_mono_ns;
#     skippy_plugin_tokens_v1 pending; int32_t *out_ids; uint32_t out_count; uint32_t reserved;
# } skippy_plugin_query_v1;
class skippy_plugin_query_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("capacity", ctypes.c_uint32),
        ("deadline_mono_ns", ctypes.c_uint64),
        ("pending", skippy_plugin_tokens_v1),
        ("out_ids", ctypes.POINTER(ctypes.c_int32)),
        ("out_count", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


# typedef struct skippy_plugin_outcome_v1 {
#     uint32_t struct_size; uint32_t proposed; uint32_t accepted; uint32_t rejected;
#     uint32_t kind; uint32_t discard_reason;
# } skippy_plugin_outcome_v1;
class skippy_plugin_outcome_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("proposed", ctypes.c_uint32),
        ("accepted", ctypes.c_uint32),
        ("rejected", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("discard_reason", ctypes.c_uint32),
    ]


# typedef struct skippy_plugin_activation_v1 {
#     uint32_t struct_size; uint32_t spec_mode; const char *model_id; const char *config;
#     uint64_t config_len; uint64_t n_vocab; uint64_t n_ctx_per_lane; uint32_t lanes;
#     uint32_t reserved; uint64_t proposal_deadline_ns;
# } skippy_plugin_activation_v1;
class skippy_plugin_activation_v1(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("spec_mode", ctypes.c_uint32),
        ("model_id", ctypes.c_char_p),
        ("config", ctypes.c_char_p),
        ("config_len", ctypes.c_uint64),
        ("n_vocab", ctypes.c_uint64),
        ("n_ctx_per_lane", ctypes.c_uint64),
        ("lanes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("proposal_deadline_ns", ctypes.c_uint64),
    ]


# typedef struct skippy_plugin_receipt_v1 {
#     uint32_t abi_version; uint32_t struct_size; uint32_t stop_reason; uint32_t reserved;
#     uint64_t prompt_tokens; uint64_t reused_tokens; uint64_t generated_tokens;
#     double queue_ms; double prefill_ms; double ttft_ms; double decode_ms;
#     uint64_t spec_proposed; uint64_t spec_accepted; uint64_t spec_rejected;
#     uint64_t spec_late; uint64_t spec_discarded;
# } skippy_plugin_receipt_v1;
class skippy_plugin_receipt_v1(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("stop_reason", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("prompt_tokens", ctypes.c_uint64),
        ("reused_tokens", ctypes.c_uint64),
        ("generated_tokens", ctypes.c_uint64),
        ("queue_ms", ctypes.c_double),
        ("prefill_ms", ctypes.c_double),
        ("ttft_ms", ctypes.c_double),
        ("decode_ms", ctypes.c_double),
        ("spec_proposed", ctypes.c_uint64),
        ("spec_accepted", ctypes.c_uint64),
        ("spec_rejected", ctypes.c_uint64),
        ("spec_late", ctypes.c_uint64),
        ("spec_discarded", ctypes.c_uint64),
    ]


_IDS_P = ctypes.POINTER(skippy_plugin_ids_v1)
_TOKENS_P = ctypes.POINTER(skippy_plugin_tokens_v1)

# typedef int32_t (*skippy_plugin_begin_fn)(void *, const skippy_plugin_ids_v1 *,
#                                           const skippy_plugin_begin_v1 *);
skippy_plugin_begin_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _IDS_P, ctypes.POINTER(skippy_plugin_begin_v1)
)
# typedef int32_t (*skippy_plugin_commit_fn)(void *, const skippy_plugin_ids_v1 *,
#                                            const skippy_plugin_tokens_v1 *);
skippy_plugin_commit_fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, _IDS_P, _TOKENS_P)
# typedef int32_t (*skippy_plugin_propose_fn)(void *, const skippy_plugin_ids_v1 *,
#                                             skippy_plugin_query_v1 *);
skippy_plugin_propose_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _IDS_P, ctypes.POINTER(skippy_plugin_query_v1)
)
# typedef int32_t (*skippy_plugin_outcome_fn)(void *, const skippy_plugin_ids_v1 *,
#                                             const skippy_plugin_outcome_v1 *);
skippy_plugin_outcome_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _IDS_P, ctypes.POINTER(skippy_plugin_outcome_v1)
)
# typedef int32_t (*skippy_plugin_finish_fn)(void *, const skippy_plugin_ids_v1 *,
#                                            const skippy_plugin_tokens_v1 *,
#                                            const skippy_plugin_receipt_v1 *);
skippy_plugin_finish_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _IDS_P, _TOKENS_P, ctypes.POINTER(skippy_plugin_receipt_v1)
)
# typedef int32_t (*skippy_plugin_abort_fn)(void *, const skippy_plugin_ids_v1 *, uint32_t);
skippy_plugin_abort_fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, _IDS_P, ctypes.c_uint32)
# typedef void (*skippy_plugin_destroy_fn)(void *state);
skippy_plugin_destroy_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# typedef int32_t (*skippy_plugin_activate_fn)(void *state,
#                                              const skippy_plugin_activation_v1 *activation);
skippy_plugin_activate_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(skippy_plugin_activation_v1)
)


# typedef struct skippy_plugin_v1 {
#     uint32_t abi_version; uint32_t struct_size; const char *name; void *state;
#     skippy_plugin_begin_fn begin; skippy_plugin_commit_fn commit;
#     skippy_plugin_propose_fn propose; skippy_plugin_outcome_fn outcome;
#     skippy_plugin_finish_fn finish; skippy_plugin_abort_fn abort;
#     skippy_plugin_destroy_fn destroy;
#     skippy_plugin_activate_fn activate;  /* extension: struct_size >= 88 */
# } skippy_plugin_v1;
class skippy_plugin_v1(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("begin", skippy_plugin_begin_fn),
        ("commit", skippy_plugin_commit_fn),
        ("propose", skippy_plugin_propose_fn),
        ("outcome", skippy_plugin_outcome_fn),
        ("finish", skippy_plugin_finish_fn),
        ("abort", skippy_plugin_abort_fn),
        ("destroy", skippy_plugin_destroy_fn),
        ("activate", skippy_plugin_activate_fn),
    ]


# int32_t skippy_plugin_init_v1(uint32_t host_abi_version, skippy_plugin_v1 *out,
#                               size_t out_size);
skippy_plugin_init_v1_fn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_uint32, ctypes.POINTER(skippy_plugin_v1), ctypes.c_size_t
)

BOUNDARY_STRUCTS: Final[tuple[type[ctypes.Structure], ...]] = (
    skippy_plugin_ids_v1,
    skippy_plugin_tokens_v1,
    skippy_plugin_begin_v1,
    skippy_plugin_query_v1,
    skippy_plugin_outcome_v1,
    skippy_plugin_receipt_v1,
    skippy_plugin_activation_v1,
    skippy_plugin_v1,
)
"""Every struct of skippy_plugin.h, for the layout test."""
