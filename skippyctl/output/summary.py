"""Human one-line summaries rendered from typed event fields (events carry no free text)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.events.reasons import DegradedMode, WarningCode


def format_bytes(value: float) -> str:
    """Bytes for people, in powers of 1024: `512 B`, `401.2 KiB`, `23.5 GiB` (every surface
    that shows a size: summaries, `ps`, `load --estimate`, `models`, the dashboard)."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _bytes(value: float | None) -> str:
    return "?" if value is None else format_bytes(value)


def _progress(event: Event) -> str:
    if event.progress is None or not event.progress.total:
        return "loading"
    percent = 100.0 * event.progress.current / event.progress.total
    return f"loading {percent:.1f}%"


def _download(event: Event) -> str:
    """A download's bytes (`model_download_*`); the catalog's text without a progress."""
    progress = event.progress
    if progress is None:
        return spec_of(event.id).description
    done, total = progress.current, progress.total
    if event.id is EventId.MODEL_DOWNLOAD_STARTED:
        return f"download started ({_bytes(total)})" if total else "download started"
    if event.id is EventId.MODEL_DOWNLOAD_COMPLETED:
        took = f" in {event.duration_ms:.0f} ms" if event.duration_ms is not None else ""
        return f"downloaded {_bytes(done)}{took}"
    if total:
        return f"downloading {100.0 * done / total:.1f}% ({_bytes(done)} of {_bytes(total)})"
    return f"downloading ({_bytes(done)})"


def _device(event: Event) -> str:
    free = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
    total = event.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
    name = event.scope.device_id or "unknown device"
    if total:
        return f"device {name} ({_bytes(free)} free of {_bytes(total)})"
    return f"device {name}"


def _failed(event: Event) -> str:
    reason = event.reason_code.value if event.reason_code else "unknown_failure"
    return f"{spec_of(event.id).description.rstrip('.')} ({reason})"


def _available(event: Event) -> str:
    ctx = event.summary_value(SummaryKey.CONTEXT_TOKENS)
    lanes = event.summary_value(SummaryKey.LANES)
    per_lane = event.summary_value(SummaryKey.CONTEXT_TOKENS_PER_LANE)
    took = f" after {event.duration_ms:.0f} ms" if event.duration_ms is not None else ""
    context = f", context {int(ctx)} tokens" if ctx else ""
    if ctx and lanes and per_lane and lanes > 1:
        context += f" ({int(lanes)} lanes × {int(per_lane)})"
    return f"model available{took}{context}"


def _native_completed(event: Event) -> str:
    size = event.summary_value(SummaryKey.MODEL_SIZE_BYTES)
    params = event.summary_value(SummaryKey.PARAMETERS)
    parts = ["weights loaded"]
    if size is not None:
        parts.append(_bytes(size))
    if params is not None:
        parts.append(f"{int(params):,} parameters")
    return ", ".join(parts)


def _phase(event: Event) -> str:
    """A load phase the engine observed (its name is the event's state); a native phase kind
    keeps the catalog's text."""
    if event.state is None:
        return spec_of(event.id).description
    return f"load phase: {event.state.current}"


def _allocation(event: Event) -> str:
    """Bytes held on one device (model_memory_allocation_summary, resource_allocation_*)."""
    weights = event.summary_value(SummaryKey.WEIGHTS_BYTES)
    kv = event.summary_value(SummaryKey.KV_BYTES)
    requested = event.summary_value(SummaryKey.REQUESTED_BYTES)
    device = event.scope.device_id or "unknown device"
    if requested is not None:
        available = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
        reason = event.reason_code.value if event.reason_code else "unknown_failure"
        text = f"{device}: {_bytes(requested)} requested"
        if available is not None:
            text += f", {_bytes(available)} available"
        return f"{text} ({reason})"
    if weights is None and kv is None:
        return spec_of(event.id).description
    parts = [f"weights {_bytes(weights)}", f"KV {_bytes(kv)}"]
    compute = event.summary_value(SummaryKey.COMPUTE_BYTES)
    parts.append(f"compute {_bytes(compute)}" if compute is not None else "compute unknown")
    return f"{device}: " + ", ".join(parts)


def _pressure(event: Event) -> str:
    free = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
    total = event.summary_value(SummaryKey.MEMORY_TOTAL_BYTES)
    device = event.scope.device_id or "unknown device"
    verb = "under memory pressure" if event.id is EventId.MEMORY_PRESSURE_CROSSED else "recovered"
    if total:
        return f"{device} {verb}: {_bytes(free)} available of {_bytes(total)}"
    return f"{device} {verb}"


def _fallback(event: Event) -> str:
    layers = event.summary_value(SummaryKey.GPU_LAYERS)
    asked = f" ({int(layers)} GPU layers asked for)" if layers is not None else ""
    return f"no GPU: running on the CPU{asked}"


def _compute(event: Event) -> str:
    code = event.summary_value(SummaryKey.RETURN_CODE)
    reason = event.reason_code.value if event.reason_code else "unknown_failure"
    returned = f" (llama_decode returned {int(code)})" if code is not None else ""
    return f"a compute step failed: {reason}{returned}"


def _stage(event: Event) -> str:
    """A stage worker's lifecycle (`stage serve`); events without a port (a stage of a
    topology) keep the catalog's text."""
    port = event.summary_value(SummaryKey.PORT)
    if port is None:
        return spec_of(event.id).description
    threads = event.summary_value(SummaryKey.THREADS)
    limit = event.summary_value(SummaryKey.MEMORY_LIMIT_BYTES)
    free = event.summary_value(SummaryKey.MEMORY_FREE_BYTES)
    verb = _STAGE_VERBS.get(event.id, "stage")
    details = []
    if event.id is EventId.STAGE_READY and event.scope.device_id:
        details.append(str(event.scope.device_id))
    if event.id in (EventId.STAGE_STARTING, EventId.STAGE_READY):
        if threads is not None:
            details.append(f"{int(threads)} threads")
        if limit is not None:
            details.append(f"offers {_bytes(limit)}")
        elif event.id is EventId.STAGE_READY and free is not None:
            details.append(f"{_bytes(free)} free")
    text = f"{verb} on port {int(port)}"
    return f"{text} ({', '.join(details)})" if details else text


def _link(event: Event) -> str:
    """A link's figures (``stage_link_observed``, ``stage_degraded``): the catalog's text
    without them."""
    rtt = event.summary_value(SummaryKey.LINK_RTT_MS)
    if rtt is None:
        return spec_of(event.id).description
    p95 = event.summary_value(SummaryKey.LINK_P95_MS)
    jitter = event.summary_value(SummaryKey.LINK_JITTER_MS)
    threshold = event.summary_value(SummaryKey.LINK_P95_THRESHOLD_MS)
    text = f"link rtt {rtt:.2f} ms"
    if p95 is not None:
        text += f", p95 {p95:.2f} ms"
    if jitter is not None:
        text += f", jitter {jitter:.2f} ms"
    if event.id is EventId.STAGE_DEGRADED:
        limit = f" above {threshold:.1f} ms" if threshold is not None else ""
        return f"stage degraded: {text}{limit}"
    return text


_WARNING_CODES: Final = frozenset(code.value for code in WarningCode)
_MODES: Final = frozenset(mode.value for mode in DegradedMode)


def _warning(event: Event) -> str:
    """A structured warning: its code, what it is about and its figures."""
    change = event.state
    raised = event.id is EventId.WARNING_RAISED
    code = (change.current if raised else change.previous) if change is not None else None
    # Identities stay out of summaries (they are in the scope); only known codes are named.
    if code not in _WARNING_CODES:
        return spec_of(event.id).description
    text = f"warning {code}" + ("" if raised else " cleared")
    used = event.summary_value(SummaryKey.KV_CELLS_USED)
    total = event.summary_value(SummaryKey.KV_CELLS_TOTAL)
    depth = event.summary_value(SummaryKey.QUEUE_DEPTH)
    capacity = event.summary_value(SummaryKey.QUEUE_CAPACITY)
    p95 = event.summary_value(SummaryKey.LINK_P95_MS)
    lagging = event.summary_value(SummaryKey.LAGGING_SUBSCRIBERS)
    if used is not None and total:
        text += f": KV {100.0 * used / total:.0f}% used ({int(used)} of {int(total)} cells)"
    elif depth is not None and capacity is not None:
        text += f": queue {int(depth)} of {int(capacity)}, new requests get 429"
    elif depth is not None:
        text += f": queue {int(depth)}"
    elif p95 is not None:
        text += f": link p95 {p95:.1f} ms"
    elif lagging is not None:
        text += f": {int(lagging)} subscriber(s) lagging"
    return text


def _degraded(event: Event) -> str:
    change = event.state
    if change is None or (change.current not in _MODES and change.previous not in _MODES):
        return spec_of(event.id).description
    if event.id is EventId.DEGRADED_OPERATION_ENTERED:
        return f"running degraded: {change.current}"
    return f"degraded operation ended: {change.previous}"


def _log_summary(event: Event) -> str:
    total = event.summary_value(SummaryKey.COUNT)
    warn = event.summary_value(SummaryKey.LOG_MESSAGES_WARN)
    error = event.summary_value(SummaryKey.LOG_MESSAGES_ERROR)
    return (
        f"llama.cpp logged {int(total or 0)} messages"
        f" ({int(warn or 0)} warnings, {int(error or 0)} errors)"
    )


def _plugin(event: Event) -> str:
    """A serving plugin's health (``serving_plugin_*``); the plugin is named by the scope."""
    failures = int(event.summary_value(SummaryKey.COUNT) or 0)
    reason = event.reason_code.value if event.reason_code is not None else None
    match event.id:
        case EventId.SERVING_PLUGIN_LOADED:
            return "serving plugin started"
        case EventId.SERVING_PLUGIN_RESTARTED:
            return f"serving plugin started again ({failures} failures so far)"
        case EventId.SERVING_PLUGIN_LOAD_FAILED:
            return f"serving plugin not loaded: {reason}; the model serves without it"
        case EventId.SERVING_PLUGIN_FAILED:
            return f"serving plugin failed: {reason} ({failures} failures so far)"
        case EventId.SERVING_PLUGIN_DISABLED:
            return f"serving plugin disabled after {failures} failures (last: {reason})"
        case EventId.SERVING_PLUGIN_OBSERVED:
            return _plugin_counters(event)
    return spec_of(event.id).description


_PLUGIN_DISCARDS: Final = (
    SummaryKey.PLUGIN_DISCARDED_INVALID_TOKEN_COUNT,
    SummaryKey.PLUGIN_DISCARDED_INVALID_TOKEN_ID,
    SummaryKey.PLUGIN_DISCARDED_POSITION_MISMATCH,
    SummaryKey.PLUGIN_DISCARDED_EXECUTION_FAILED,
)


def _plugin_counters(event: Event) -> str:
    """``serving_plugin_observed``: its delivery counters (counts only)."""

    def n(key: SummaryKey) -> int:
        return int(event.summary_value(key) or 0)

    discarded = sum(n(key) for key in _PLUGIN_DISCARDS)
    return (
        f"serving plugin: {n(SummaryKey.PLUGIN_DELIVERED)} delivered, "
        f"{n(SummaryKey.PLUGIN_DEFERRED)} deferred, {n(SummaryKey.PLUGIN_DROPPED)} dropped, "
        f"{n(SummaryKey.PLUGIN_LATE)} late, {discarded} discarded otherwise, "
        f"{n(SummaryKey.PLUGIN_FAILURES)} failures"
    )


def _speculation(event: Event) -> str:
    """A speculating request's proposal figures (``speculation_summarized``)."""
    proposed = int(event.summary_value(SummaryKey.SPEC_PROPOSED_TOKENS) or 0)
    accepted = int(event.summary_value(SummaryKey.SPEC_ACCEPTED_TOKENS) or 0)
    windows = int(event.summary_value(SummaryKey.SPEC_WINDOWS) or 0)
    late = int(event.summary_value(SummaryKey.SPEC_LATE_QUERIES) or 0)
    text = f"speculation: {accepted} of {proposed} proposed tokens accepted in {windows} windows"
    return text + (f", {late} proposal queries late" if late else "")


_STAGE_VERBS: Final = {
    EventId.STAGE_STARTING: "stage starting",
    EventId.STAGE_READY: "stage ready",
    EventId.STAGE_STOPPING: "stage stopping",
    EventId.STAGE_STOPPED: "stage stopped",
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: "client connected",
    EventId.UPSTREAM_CONNECTION_LOST: "client gone",
    EventId.UPSTREAM_CONNECTION_RECOVERED: "client connected again",
}


_RENDERERS: Final[dict[EventId, Callable[[Event], str]]] = {
    EventId.WARNING_RAISED: _warning,
    EventId.WARNING_CLEARED: _warning,
    EventId.DEGRADED_OPERATION_ENTERED: _degraded,
    EventId.DEGRADED_OPERATION_EXITED: _degraded,
    EventId.NATIVE_LOG_SUMMARY: _log_summary,
    EventId.STAGE_STARTING: _stage,
    EventId.STAGE_READY: _stage,
    EventId.STAGE_STOPPING: _stage,
    EventId.STAGE_STOPPED: _stage,
    EventId.UPSTREAM_CONNECTION_ESTABLISHED: _stage,
    EventId.UPSTREAM_CONNECTION_LOST: _stage,
    EventId.UPSTREAM_CONNECTION_RECOVERED: _stage,
    EventId.STAGE_FAILED: _failed,
    EventId.STAGE_LINK_OBSERVED: _link,
    EventId.STAGE_DEGRADED: _link,
    EventId.MODEL_LOAD_PROGRESS: _progress,
    EventId.MODEL_DOWNLOAD_STARTED: _download,
    EventId.MODEL_DOWNLOAD_PROGRESS: _download,
    EventId.MODEL_DOWNLOAD_COMPLETED: _download,
    EventId.MODEL_RESOLUTION_FAILED: _failed,
    EventId.MODEL_DOWNLOAD_FAILED: _failed,
    EventId.MODEL_DOWNLOAD_CANCELLED: _failed,
    EventId.MODEL_PREPARATION_FAILED: _failed,
    EventId.MODEL_PREPARATION_CANCELLED: _failed,
    EventId.BACKEND_DEVICE_SELECTED: _device,
    EventId.MODEL_LOAD_FAILED: _failed,
    EventId.MODEL_LOAD_CANCELLED: _failed,
    EventId.SERVING_BACKEND_INITIALIZATION_FAILED: _failed,
    EventId.MODEL_AVAILABLE: _available,
    EventId.NATIVE_MODEL_LOAD_COMPLETED: _native_completed,
    EventId.MODEL_LOAD_PHASE_CHANGED: _phase,
    EventId.MODEL_MEMORY_ALLOCATION_SUMMARY: _allocation,
    EventId.RESOURCE_ALLOCATION_COMPLETED: _allocation,
    EventId.RESOURCE_ALLOCATION_FAILED: _allocation,
    EventId.OUT_OF_MEMORY_CONDITION: _allocation,
    EventId.MEMORY_PRESSURE_CROSSED: _pressure,
    EventId.MEMORY_PRESSURE_CLEARED: _pressure,
    EventId.CPU_FALLBACK_ACTIVATED: _fallback,
    EventId.FALLBACK_APPLIED: _fallback,
    EventId.COMPUTE_FAILURE: _compute,
    EventId.BACKEND_INITIALIZATION_FAILED: _failed,
    EventId.SERVING_PLUGIN_LOADED: _plugin,
    EventId.SERVING_PLUGIN_LOAD_FAILED: _plugin,
    EventId.SERVING_PLUGIN_FAILED: _plugin,
    EventId.SERVING_PLUGIN_RESTARTED: _plugin,
    EventId.SERVING_PLUGIN_DISABLED: _plugin,
    EventId.SERVING_PLUGIN_OBSERVED: _plugin,
    EventId.SPECULATION_SUMMARIZED: _speculation,
}


def render_summary(event: Event) -> str:
    """A bounded human summary (≤ 160 characters) of one event."""
    renderer = _RENDERERS.get(event.id)
    text = renderer(event) if renderer is not None else spec_of(event.id).description
    return text[:160]


_REASON_MESSAGES: Final[dict[str, str]] = {
    "invalid_configuration": "the configuration was refused",
    "missing_artifact": "the model file does not exist",
    "artifact_io_failure": "the model file cannot be read",
    "model_format_or_load_failure": "llama.cpp could not load the file (not GGUF, truncated "
    "or unsupported)",
    "backend_initialization_failure": "the serving context could not be created",
    "process_crash": "the engine process died (llama.cpp aborted or was killed)",
    "timeout": "gave up after the timeout; the load was cancelled",
    "cancellation": "cancelled",
    "terminal_not_delivered": "the outcome was lost under pressure",
    "incompatible_abi_or_feature_set": "the native library is incompatible",
    "out_of_memory": "not enough memory (the KV cache for this context does not fit; "
    "try a smaller --ctx)",
    "resource_allocation_failure": "llama.cpp could not allocate the context's buffers",
    "device_unavailable": "no usable compute device",
}


def reason_message(reason: str | None) -> str:
    """What a reason code means, for people."""
    if reason is None:
        return "failed for an unknown reason"
    return _REASON_MESSAGES.get(reason, reason.replace("_", " "))
