"""The state document: the JSON projection of the reduced state (`ps --json`, the management
API, SSE `runtime_state` frames). Schema version 1; add fields, never rename.

Fields that do not apply are absent. Only ids, enums and numbers appear (the state carries no
free text), so nothing private can leak through it.
"""

from __future__ import annotations

from typing import Any, Final

from skippyctl.events.envelope import Event, Progress
from skippyctl.output.codec import event_record
from skippyctl.output.codec.encode import rfc3339
from skippyctl.reducer.state import (
    ModelView,
    PluginView,
    RequestView,
    RuntimeView,
    StageView,
    TopologyView,
    lanes_in_use,
    queue_depth,
    topology_stages,
)

STATE_SCHEMA_VERSION: Final = 1


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _progress(progress: Progress | None) -> dict[str, Any] | None:
    if progress is None:
        return None
    return _clean(
        {"current": progress.current, "total": progress.total, "unit": progress.unit.value}
    )


def model_document(state: RuntimeView, view: ModelView) -> dict[str, Any]:
    return _clean(
        {
            "model_id": str(view.model_id),
            "state": view.state.value,
            "operation_id": None if view.operation_id is None else str(view.operation_id),
            "topology_id": None if view.topology_id is None else str(view.topology_id),
            "progress": _progress(view.progress),
            "device_id": None if view.device_id is None else str(view.device_id),
            "device_memory_free_bytes": view.device_memory_free_bytes,
            "device_memory_total_bytes": view.device_memory_total_bytes,
            "model_size_bytes": view.model_size_bytes,
            "parameters": view.parameters,
            "context_tokens": view.context_tokens,
            "lanes": view.lanes,
            "context_tokens_per_lane": view.context_tokens_per_lane,
            "batch_invariant": view.batch_invariant,
            "lanes_in_use": lanes_in_use(state, view.model_id),
            "queue_depth": queue_depth(state, view.model_id),
            "reason_code": None if view.reason_code is None else view.reason_code.value,
            "load_duration_ms": view.load_duration_ms,
            "recovery_attempt": view.recovery_attempt,
            "restarts": view.restarts or None,
            "kv": _clean(
                {
                    "cells_total": view.kv.cells_total,
                    "cells_used": view.kv.cells_used,
                    "pressure": view.kv.pressure,
                    "approaching_limit": view.kv.approaching_limit,
                    "exhausted": view.kv.exhausted,
                }
            ),
            "completed_requests": view.completed_requests,
            "generated_tokens": view.generated_tokens,
            "decode_tokens_per_s": view.decode_tokens_per_s,
            "spec_proposed_tokens": view.spec_proposed_tokens,
            "spec_accepted_tokens": view.spec_accepted_tokens,
            "settings": {s.key: s.value for s in view.settings} or None,
            "chat_template": {s.key: s.value for s in view.chat_template} or None,
            "idle_ttl_ms": view.idle_ttl_ms,
            "idle_expires_at": None
            if view.idle_expires_wall_ns is None
            else rfc3339(view.idle_expires_wall_ns),
            "plugins": [_plugin(p) for p in view.plugins] or None,
        }
    )


def _plugin(view: PluginView) -> dict[str, Any]:
    """A serving plugin of a model: its state, failures and delivery counters (counts only)."""
    discarded = {
        "deadline_exceeded": view.late,
        "invalid_token_count": view.discarded_invalid_token_count,
        "invalid_token_id": view.discarded_invalid_token_id,
        "position_mismatch": view.discarded_position_mismatch,
        "execution_failed": view.discarded_execution_failed,
    }
    return _clean(
        {
            "plugin_id": str(view.plugin_id),
            "state": view.state.value,
            "reason_code": None if view.reason_code is None else view.reason_code.value,
            "failures": view.failures,
            "restarts": view.restarts,
            "delivered": view.delivered,
            "deferred": view.deferred,
            "dropped": view.dropped,
            "late": view.late,
            "discarded": discarded,
        }
    )


def _topology(state: RuntimeView, view: TopologyView) -> dict[str, Any]:
    return _clean(
        {
            "topology_id": str(view.topology_id),
            "state": view.state.value,
            "model_id": None if view.model_id is None else str(view.model_id),
            "reason_code": None if view.reason_code is None else view.reason_code.value,
            "stages": view.stages,
            "layers": view.layers,
            "planned_bytes": view.planned_bytes,
            "offered_bytes": view.offered_bytes,
            "stage_ids": [str(s.stage_id) for s in topology_stages(state, view.topology_id)],
        }
    )


def _stage(view: StageView) -> dict[str, Any]:
    return _clean(
        {
            "stage_id": str(view.stage_id),
            "state": view.state.value,
            "topology_id": None if view.topology_id is None else str(view.topology_id),
            "stage_index": view.stage_index,
            "upstream_connected": view.upstream_connected,
            "downstream_connected": view.downstream_connected,
            "reason_code": None if view.reason_code is None else view.reason_code.value,
            "layer_start": view.layer_start,
            "layer_count": view.layer_count,
            "planned_bytes": view.planned_bytes,
            "offered_bytes": view.offered_bytes,
            "link_rtt_ms": view.link_rtt_ms,
            "link_p95_ms": view.link_p95_ms,
            "link_jitter_ms": view.link_jitter_ms,
            "link_probes": view.link_probes,
        }
    )


def _request(view: RequestView) -> dict[str, Any]:
    return _clean(
        {
            "request_id": str(view.request_id),
            "state": view.state.value,
            "model_id": None if view.model_id is None else str(view.model_id),
            "session_id": None if view.session_id is None else str(view.session_id),
            "queue_depth": view.queue_depth,
            "queue_wait_ms": view.queue_wait_ms,
            "prompt_tokens": view.prompt_tokens,
            "generated_tokens": view.generated_tokens,
            "time_to_first_token_ms": view.time_to_first_token_ms,
        }
    )


def state_document(
    state: RuntimeView,
    *,
    health: dict[str, Any] | None = None,
    recent: tuple[Event, ...] | None = None,
) -> dict[str, Any]:
    """The whole reduced state as one JSON-ready object."""
    document: dict[str, Any] = {
        "schema_version": STATE_SCHEMA_VERSION,
        "record": "state",
        "runtime": state.runtime.value,
        "native_mode": state.native_mode.value,
        "node": state.node.value,
        "models": [model_document(state, m) for m in state.models.values()],
        "topologies": [_topology(state, t) for t in state.topologies.values()],
        "stages": [_stage(s) for s in state.stages.values()],
        "sessions": [
            _clean(
                {
                    "session_id": str(s.session_id),
                    "state": s.state.value,
                    "model_id": None if s.model_id is None else str(s.model_id),
                    "lane": s.lane,
                    "context_tokens": s.context_tokens,
                    "reused_tokens": s.reused_tokens,
                    "trimmed": s.trimmed,
                    "spec_proposed_tokens": s.spec_proposed_tokens,
                    "spec_accepted_tokens": s.spec_accepted_tokens,
                }
            )
            for s in state.sessions.values()
        ],
        "requests": [_request(r) for r in state.requests.values()],
        "devices": [
            _clean(
                {
                    "device_id": str(d.device_id),
                    "state": d.state.value,
                    "memory_free_bytes": d.memory_free_bytes,
                    "memory_total_bytes": d.memory_total_bytes,
                    "memory_pressure": d.memory_pressure,
                }
            )
            for d in state.devices.values()
        ],
        "event_system": {
            key: getattr(state.event_system, key) for key in state.event_system.__dataclass_fields__
        },
        "warnings": [
            _clean(
                {
                    "warning_id": str(w.warning_id),
                    "code": w.code,
                    "reason_code": None if w.reason_code is None else w.reason_code.value,
                    "model_id": None if w.model_id is None else str(w.model_id),
                    "stage_id": None if w.stage_id is None else str(w.stage_id),
                    "raised_ts": rfc3339(w.raised_wall_ns),
                }
            )
            for w in state.warnings.values()
        ],
        "degraded_modes": sorted(state.degraded_modes),
        "reducer": {
            key: getattr(state.counters, key) for key in state.counters.__dataclass_fields__
        },
    }
    if health is not None:
        document["health"] = health
    if recent is not None:
        document["recent_events"] = [event_record(e) for e in recent]
    return document
