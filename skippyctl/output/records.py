"""The JSON record projection of an event (one object per line in `--json` output).

Contract (schema_version 1; add fields, never rename): `schema_version`, `event` (the id),
`category`, `severity`, `ts` (UTC RFC 3339), `seq`, `producer`, and — only when they apply —
`operation_id`, `model_id`, `session_id`, `request_id`, `device_id`, `stage_id`, `topology_id`,
`progress` {current,total,unit}, `outcome`, `reason_code`, `duration_ms`, `stop_reason`,
`batching`, `state`
{previous,current}, `native` {sequence,evidence}, `summaries` {key: number}, `summary`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from skippyctl.events.envelope import SCHEMA_VERSION, Event
from skippyctl.output.summary import render_summary


def rfc3339(wall_ns: int) -> str:
    stamp = datetime.fromtimestamp(wall_ns / 1e9, tz=UTC)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


def outcome_fields(event: Event) -> dict[str, Any]:
    """The fields the NDJSON record and the SSE event object share, with the same names:
    progress, outcome, reason_code, duration_ms, stop_reason, batching, state."""
    fields: dict[str, Any] = {}
    if event.progress is not None:
        progress: dict[str, Any] = {"current": event.progress.current}
        if event.progress.total is not None:
            progress["total"] = event.progress.total
        progress["unit"] = event.progress.unit.value
        fields["progress"] = progress
    if event.outcome is not None:
        fields["outcome"] = event.outcome.value
    if event.reason_code is not None:
        fields["reason_code"] = event.reason_code.value
    if event.duration_ms is not None:
        fields["duration_ms"] = event.duration_ms
    if event.stop_reason is not None:
        fields["stop_reason"] = event.stop_reason.value
    if event.batching is not None:
        fields["batching"] = event.batching.value
    if event.state is not None:
        state: dict[str, Any] = {"current": event.state.current}
        if event.state.previous is not None:
            state["previous"] = event.state.previous
        fields["state"] = state
    return fields


def event_record(event: Event, seq: int | None = None, cursor: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event": event.id.value,
        "category": event.category.value,
        "severity": event.severity.value,
        "ts": rfc3339(event.wall_ns),
    }
    if seq is not None:
        record["seq"] = seq
    if cursor is not None:
        record["cursor"] = cursor
    record["producer"] = event.producer.value
    if event.operation_id is not None:
        record["operation_id"] = str(event.operation_id)
    scope = event.scope
    for key in ("model_id", "topology_id", "stage_id", "session_id", "request_id", "device_id"):
        value = getattr(scope, key)
        if value is not None:
            record[key] = str(value)
    if scope.stage_index is not None:
        record["stage_index"] = scope.stage_index
    record.update(outcome_fields(event))
    if event.native is not None:
        record["native"] = {
            "sequence": event.native.sequence,
            "evidence": event.native.evidence.value,
        }
    if event.summaries:
        record["summaries"] = {item.key.value: item.value for item in event.summaries}
    record["summary"] = render_summary(event)
    return record


def dumps_line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"
