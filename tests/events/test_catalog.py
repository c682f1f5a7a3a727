from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from skippyctl.events.catalog import CATALOG, EventId
from skippyctl.events.reasons import Category, ReasonCode

GOLDEN = Path(__file__).with_name("catalog.golden.json")

# Ids the reference catalog names (skippy-facts.md); ours must keep them.
REFERENCE_IDS = """
runtime_resolution_started runtime_resolution_completed runtime_resolution_failed
native_library_loaded native_library_rejected native_library_unavailable
abi_feature_compatibility_established abi_feature_compatibility_failed runtime_initialized
runtime_stopping runtime_stopped runtime_crashed model_queued model_download_started
model_download_progress model_download_completed model_download_failed model_download_cancelled
model_load_requested model_load_started model_load_phase_changed model_load_progress
backend_device_selected model_memory_allocation_summary model_memory_pressure
native_model_load_completed model_load_failed model_load_cancelled native_model_loaded
model_available model_degraded model_unavailable model_capacity_changed unload_requested
unload_started unload_completed unload_failed forced_unload session_draining_started
session_draining_completed request_received request_queued request_admitted request_rejected
request_execution_started request_completed request_cancelled request_timed_out request_failed
prompt_processing_started prompt_cache_restore_hit prompt_cache_restore_miss
prompt_cache_restore_partial prompt_cache_restore_error generation_started first_token_produced
generation_progress generation_completed generation_cancelled generation_timed_out
generation_failed stop_condition_reached cache_pressure_crossed cache_pressure_cleared
context_capacity_approaching_limit context_exhausted kv_cache_initialization_completed
backend_initialization_completed device_ready device_degraded device_unavailable device_recovered
device_lost device_reset out_of_memory_condition backend_fallback_activated
cpu_fallback_activated compute_failure resource_allocation_completed warning_raised
warning_cleared recoverable_native_failure fallback_applied degraded_operation_entered
degraded_operation_exited fatal_native_failure invariant_protocol_violation node_starting
node_accepting_requests node_degraded node_unavailable node_draining node_stopped
available_model_set_changed ingress_queue_pressure events_coalesced events_sampled
events_dropped_by_class subscriber_lagging subscriber_disconnected reducer_error
telemetry_exporter_degraded telemetry_exporter_recovered event_schema_incompatibility
unknown_native_event_received
""".split()


def _table() -> list[dict[str, str]]:
    return [
        {
            "id": spec.id.value,
            "category": spec.category.value,
            "class": spec.delivery.value,
            "severity": spec.severity.value,
        }
        for spec in CATALOG.values()
    ]


def test_every_event_id_has_exactly_one_catalog_entry() -> None:
    assert set(CATALOG) == set(EventId)
    assert all(CATALOG[event_id].id is event_id for event_id in EventId)


def test_catalog_matches_the_golden_contract() -> None:
    """Ids are a public contract: this fails on any rename, removal or reclassification.

    Adding an id is allowed: regenerate the golden file and say so in CHANGELOG.md.
    """
    golden = orjson.loads(GOLDEN.read_bytes())
    current = {row["id"]: row for row in _table()}
    for row in golden:
        assert current.get(row["id"]) == row, f"changed or removed: {row['id']}"


@pytest.mark.parametrize("event_id", REFERENCE_IDS)
def test_reference_ids_are_kept(event_id: str) -> None:
    assert EventId(event_id) in CATALOG


def test_ids_are_flat_snake_case_and_described() -> None:
    for spec in CATALOG.values():
        assert re.fullmatch(r"[a-z]+(_[a-z0-9]+)*", spec.id.value)
        assert spec.description.endswith(".") and len(spec.description) <= 100


def test_every_category_has_events() -> None:
    assert {spec.category for spec in CATALOG.values()} == set(Category)


def test_reason_codes_are_the_reference_set_and_our_additions() -> None:
    reference = {
        "invalid_configuration", "unsupported_capability", "missing_artifact",
        "artifact_io_failure", "model_format_or_load_failure", "backend_initialization_failure",
        "device_unavailable", "resource_allocation_failure", "out_of_memory", "context_exhausted",
        "stage_unavailable", "timeout", "cancellation", "process_crash",
        "incompatible_abi_or_feature_set", "internal_runtime_failure", "unknown_failure",
        "terminal_not_delivered", "reservation_exhausted",
    }  # fmt: skip
    added = {
        "idle",
        "max_models",
        "memory_budget",
        "insufficient_memory",
        "crash_loop",
    }  # ours, each in CHANGELOG.md: add, never rename
    assert {r.value for r in ReasonCode} == reference | added
