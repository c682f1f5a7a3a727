"""Documented process exit codes (README "Exit codes"). Values are a public contract."""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from skippyctl.events.reasons import ReasonCode


class ExitCode(IntEnum):
    SUCCESS = 0
    """The command did what was asked (for `load`: the model is available)."""
    FAILURE = 1
    """A failure with no more specific code (`unknown_failure`)."""
    USAGE = 2
    """Bad command line: unknown option, missing argument, wrong type."""
    RUNTIME_UNREACHABLE = 3
    """No runtime could be reached or started."""
    INVALID_CONFIGURATION = 10
    """`invalid_configuration`: an option value was refused before anything was loaded."""
    UNSUPPORTED_CAPABILITY = 11
    """`unsupported_capability`."""
    MISSING_ARTIFACT = 12
    """`missing_artifact`: the model file (or a part of a split set) does not exist."""
    ARTIFACT_IO_FAILURE = 13
    """`artifact_io_failure`: the path is a directory, unreadable or not a regular file."""
    MODEL_FORMAT_OR_LOAD_FAILURE = 14
    """`model_format_or_load_failure`: not GGUF, truncated, or refused by llama.cpp."""
    BACKEND_INITIALIZATION_FAILURE = 15
    """`backend_initialization_failure`: the serving context could not be created."""
    DEVICE_UNAVAILABLE = 16
    """`device_unavailable`."""
    RESOURCE_ALLOCATION_FAILURE = 17
    """`resource_allocation_failure`."""
    OUT_OF_MEMORY = 18
    """`out_of_memory`."""
    CONTEXT_EXHAUSTED = 19
    """`context_exhausted`."""
    STAGE_UNAVAILABLE = 20
    """`stage_unavailable`."""
    PROCESS_CRASH = 21
    """`process_crash`: the engine process died (for example a llama.cpp abort)."""
    INCOMPATIBLE_ABI_OR_FEATURE_SET = 22
    """`incompatible_abi_or_feature_set`."""
    INTERNAL_RUNTIME_FAILURE = 23
    """`internal_runtime_failure`."""
    TERMINAL_NOT_DELIVERED = 24
    """`terminal_not_delivered`: the outcome was lost under pressure (state says failed)."""
    RESERVATION_EXHAUSTED = 25
    """`reservation_exhausted`: capacity refused the work."""
    TIMEOUT = 124
    """`timeout`: the operation hit `--timeout` (same code as timeout(1))."""
    CANCELLED = 130
    """`cancellation`: cancelled, for example by Ctrl-C (128 + SIGINT)."""


REASON_EXIT_CODES: Final[dict[ReasonCode, ExitCode]] = {
    ReasonCode.INVALID_CONFIGURATION: ExitCode.INVALID_CONFIGURATION,
    ReasonCode.UNSUPPORTED_CAPABILITY: ExitCode.UNSUPPORTED_CAPABILITY,
    ReasonCode.MISSING_ARTIFACT: ExitCode.MISSING_ARTIFACT,
    ReasonCode.ARTIFACT_IO_FAILURE: ExitCode.ARTIFACT_IO_FAILURE,
    ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE: ExitCode.MODEL_FORMAT_OR_LOAD_FAILURE,
    ReasonCode.BACKEND_INITIALIZATION_FAILURE: ExitCode.BACKEND_INITIALIZATION_FAILURE,
    ReasonCode.DEVICE_UNAVAILABLE: ExitCode.DEVICE_UNAVAILABLE,
    ReasonCode.RESOURCE_ALLOCATION_FAILURE: ExitCode.RESOURCE_ALLOCATION_FAILURE,
    ReasonCode.OUT_OF_MEMORY: ExitCode.OUT_OF_MEMORY,
    ReasonCode.CONTEXT_EXHAUSTED: ExitCode.CONTEXT_EXHAUSTED,
    ReasonCode.STAGE_UNAVAILABLE: ExitCode.STAGE_UNAVAILABLE,
    ReasonCode.TIMEOUT: ExitCode.TIMEOUT,
    ReasonCode.CANCELLATION: ExitCode.CANCELLED,
    ReasonCode.PROCESS_CRASH: ExitCode.PROCESS_CRASH,
    ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET: ExitCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
    ReasonCode.INTERNAL_RUNTIME_FAILURE: ExitCode.INTERNAL_RUNTIME_FAILURE,
    ReasonCode.UNKNOWN_FAILURE: ExitCode.FAILURE,
    ReasonCode.TERMINAL_NOT_DELIVERED: ExitCode.TERMINAL_NOT_DELIVERED,
    ReasonCode.RESERVATION_EXHAUSTED: ExitCode.RESERVATION_EXHAUSTED,
}


def exit_code_for(reason: ReasonCode | None) -> ExitCode:
    return REASON_EXIT_CODES.get(reason, ExitCode.FAILURE) if reason else ExitCode.FAILURE


def exit_code_for_text(reason: object) -> ExitCode:
    """The exit code of a reason code as a runtime spelled it (an API error body, a state
    document); one this build does not know, or none, is exit 1 (as `unknown_failure`)."""
    try:
        return exit_code_for(ReasonCode(reason)) if isinstance(reason, str) else ExitCode.FAILURE
    except ValueError:
        return ExitCode.FAILURE
