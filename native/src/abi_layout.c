/*
 * abi_layout.c — versions, feature mask and the layout table of every boundary struct, so the
 * Python binding can refuse to run against a library whose layout differs from its ctypes mirrors.
 */
#include "skippy_internal.h"

#define FIELD(S, f) {#S, #f, (uint32_t)offsetof(S, f), (uint32_t)sizeof(((S *)0)->f)}
#define SIZE(S) {#S, "", 0u, (uint32_t)sizeof(S)}

static const skippy_abi_field_v1 k_fields[] = {
    SIZE(skippy_runtime_event_v1),
    FIELD(skippy_runtime_event_v1, abi_version),
    FIELD(skippy_runtime_event_v1, struct_size),
    FIELD(skippy_runtime_event_v1, category),
    FIELD(skippy_runtime_event_v1, kind),
    FIELD(skippy_runtime_event_v1, emitter),
    FIELD(skippy_runtime_event_v1, reserved0),
    FIELD(skippy_runtime_event_v1, sequence),
    FIELD(skippy_runtime_event_v1, timestamp_mono_ns),
    FIELD(skippy_runtime_event_v1, model_id),
    FIELD(skippy_runtime_event_v1, stage_id),
    FIELD(skippy_runtime_event_v1, session_id),
    FIELD(skippy_runtime_event_v1, progress_current),
    FIELD(skippy_runtime_event_v1, progress_total),
    FIELD(skippy_runtime_event_v1, progress_unit),
    FIELD(skippy_runtime_event_v1, failure_code),
    FIELD(skippy_runtime_event_v1, status),
    FIELD(skippy_runtime_event_v1, reserved1),
    FIELD(skippy_runtime_event_v1, detail_ptr),
    FIELD(skippy_runtime_event_v1, detail_len),
    FIELD(skippy_runtime_event_v1, numeric_summary_0),
    FIELD(skippy_runtime_event_v1, numeric_summary_1),
    FIELD(skippy_runtime_event_v1, numeric_summary_2),
    FIELD(skippy_runtime_event_v1, numeric_summary_3),

    SIZE(skippy_runtime_event_reporter_v1),
    FIELD(skippy_runtime_event_reporter_v1, abi_version),
    FIELD(skippy_runtime_event_reporter_v1, struct_size),
    FIELD(skippy_runtime_event_reporter_v1, callback),
    FIELD(skippy_runtime_event_reporter_v1, user_data),

    SIZE(skippy_ingress_config_v1),
    FIELD(skippy_ingress_config_v1, struct_size),
    FIELD(skippy_ingress_config_v1, terminal_capacity),
    FIELD(skippy_ingress_config_v1, diagnostic_capacity),
    FIELD(skippy_ingress_config_v1, progress_slots),
    FIELD(skippy_ingress_config_v1, debug_bytes),
    FIELD(skippy_ingress_config_v1, reserved),

    SIZE(skippy_native_fact_v1),
    FIELD(skippy_native_fact_v1, struct_size),
    FIELD(skippy_native_fact_v1, lane),
    FIELD(skippy_native_fact_v1, flags),
    FIELD(skippy_native_fact_v1, source_struct_size),
    FIELD(skippy_native_fact_v1, operation_id),
    FIELD(skippy_native_fact_v1, ingress_sequence),
    FIELD(skippy_native_fact_v1, coalesced_count),
    FIELD(skippy_native_fact_v1, event),
    FIELD(skippy_native_fact_v1, detail_copied_len),
    FIELD(skippy_native_fact_v1, reserved),
    FIELD(skippy_native_fact_v1, detail),

    SIZE(skippy_lane_stats_v1),
    FIELD(skippy_lane_stats_v1, accepted),
    FIELD(skippy_lane_stats_v1, drained),
    FIELD(skippy_lane_stats_v1, dropped_full),
    FIELD(skippy_lane_stats_v1, coalesced),

    SIZE(skippy_ingress_stats_v1),
    FIELD(skippy_ingress_stats_v1, struct_size),
    FIELD(skippy_ingress_stats_v1, reserved),
    FIELD(skippy_ingress_stats_v1, lanes),
    FIELD(skippy_ingress_stats_v1, suppressed_regression),
    FIELD(skippy_ingress_stats_v1, progress_contended),
    FIELD(skippy_ingress_stats_v1, rejected_abi_version),
    FIELD(skippy_ingress_stats_v1, rejected_struct_size),
    FIELD(skippy_ingress_stats_v1, rejected_detail),
    FIELD(skippy_ingress_stats_v1, rejected_discriminant),
    FIELD(skippy_ingress_stats_v1, rejected_closed),
    FIELD(skippy_ingress_stats_v1, unknown_kind),
    FIELD(skippy_ingress_stats_v1, detail_truncated),
    FIELD(skippy_ingress_stats_v1, log_messages_by_level),
    FIELD(skippy_ingress_stats_v1, debug_lines_captured),
    FIELD(skippy_ingress_stats_v1, debug_bytes_dropped),

    SIZE(skippy_device_info_v1),
    FIELD(skippy_device_info_v1, struct_size),
    FIELD(skippy_device_info_v1, type),
    FIELD(skippy_device_info_v1, memory_free),
    FIELD(skippy_device_info_v1, memory_total),
    FIELD(skippy_device_info_v1, name),
    FIELD(skippy_device_info_v1, description),

    SIZE(skippy_abi_field_v1),
    FIELD(skippy_abi_field_v1, struct_name),
    FIELD(skippy_abi_field_v1, field_name),
    FIELD(skippy_abi_field_v1, offset),
    FIELD(skippy_abi_field_v1, size),

    SIZE(skippy_test_producer_report_v1),
    FIELD(skippy_test_producer_report_v1, struct_size),
    FIELD(skippy_test_producer_report_v1, threads),
    FIELD(skippy_test_producer_report_v1, records_attempted),
    FIELD(skippy_test_producer_report_v1, elapsed_ns),
    FIELD(skippy_test_producer_report_v1, latency_p50_ns),
    FIELD(skippy_test_producer_report_v1, latency_p99_ns),
    FIELD(skippy_test_producer_report_v1, latency_max_ns),
};

SKIPPY_API uint32_t skippy_native_abi_version(void) { return SKIPPY_RUNTIME_EVENT_ABI_VERSION; }

SKIPPY_API uint32_t skippy_ingress_abi_version(void) { return SKIPPY_INGRESS_ABI_VERSION; }

SKIPPY_API uint64_t skippy_native_features(void) {
    /* The families this library implements: the per-call model-open reporter (load begin,
     * progress, device, end), the process-global reporter (skippy_adapter_reporter), the ggml
     * device registry (resolve, devices, backends) and llama.cpp log counting (the log
     * callback). The binding disables a family alone when one of its symbols is missing. KV and
     * unload facts are not native here (the engine reports them from return values). */
    return SKIPPY_FEATURE_RUNTIME_EVENTS | SKIPPY_FEATURE_RUNTIME_EVENT_REPORTER |
           SKIPPY_FEATURE_DEVICE_EVENTS | SKIPPY_FEATURE_DIAGNOSTIC_EVENTS;
}

SKIPPY_API const skippy_abi_field_v1 *skippy_abi_fields(size_t *count) {
    if (count != NULL) *count = sizeof(k_fields) / sizeof(k_fields[0]);
    return k_fields;
}
