"""Serving plugins' health and counters as events: what the engine's plugin link reported
(``engine/protocol_messages.py`` :class:`~skippyctl.engine.protocol_messages.PluginReported`,
:class:`~skippyctl.engine.protocol_messages.PluginCounters`).

- ``loaded`` → ``serving_plugin_loaded``; ``load_failed`` → ``serving_plugin_load_failed``;
  ``failed`` → ``serving_plugin_failed``; ``restarted`` → ``serving_plugin_restarted``;
  ``disabled`` → ``serving_plugin_disabled``. Scope: the model and ``plugin_id`` (the plugin's
  short name); the reason word becomes a reason code (:data:`REASONS`); summary ``count`` = the
  plugin's failures so far. A report made while the model loads carries the load's operation
  id, so its event is part of that load (``load --json`` shows ``serving_plugin_loaded``).
- counters → ``serving_plugin_observed`` (progress class, no operation): the plugin's
  delivered / deferred / dropped / late / failures and discards by reason as summaries.

A kind this host does not know, or a name that is not a safe logical id, is left out rather than
reported wrong.
"""

from __future__ import annotations

from typing import Final

from skippyctl.engine.protocol_messages import PluginCounters, PluginReported
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    InvalidLogicalId,
    LogicalId,
    Scope,
    make_event,
    summaries,
)
from skippyctl.events.reasons import Outcome, ReasonCode

KINDS: Final[dict[str, EventId]] = {
    "loaded": EventId.SERVING_PLUGIN_LOADED,
    "load_failed": EventId.SERVING_PLUGIN_LOAD_FAILED,
    "failed": EventId.SERVING_PLUGIN_FAILED,
    "restarted": EventId.SERVING_PLUGIN_RESTARTED,
    "disabled": EventId.SERVING_PLUGIN_DISABLED,
}
REASONS: Final[dict[str, ReasonCode]] = {
    "crashed": ReasonCode.PROCESS_CRASH,
    "timeout": ReasonCode.TIMEOUT,
    "raised": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "error_status": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "protocol_error": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "init_failed": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "spawn_failed": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "activate_failed": ReasonCode.INVALID_CONFIGURATION,
    "load_error": ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE,
    "not_found": ReasonCode.MISSING_ARTIFACT,
    "no_entry_point": ReasonCode.MISSING_ARTIFACT,
    "abi_mismatch": ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
}
"""The plugin link's reason words (``skippyctl.plugins.link``) as reason codes; any other word
of a failure is ``unknown_failure``. A plugin that refuses its activation (its model or
``--plugin-config``) is ``invalid_configuration``."""
_HEALTHY: Final = frozenset({"loaded", "restarted"})


def _plugin_id(name: str) -> LogicalId | None:
    try:
        return LogicalId(name)
    except InvalidLogicalId:
        return None


def plugin_events(message: PluginReported | PluginCounters, model_id: LogicalId) -> list[Event]:
    if isinstance(message, PluginCounters):
        return counter_events(message, model_id)
    event_id = KINDS.get(message.kind)
    plugin = _plugin_id(message.plugin)
    if event_id is None or plugin is None:
        return []
    operation = None
    if message.operation_id is not None:
        try:
            operation = LogicalId(message.operation_id)
        except InvalidLogicalId:
            operation = None
    healthy = message.kind in _HEALTHY
    return [
        make_event(
            event_id,
            operation_id=operation,
            scope=Scope(model_id=model_id, plugin_id=plugin),
            outcome=Outcome.SUCCESS if healthy else Outcome.FAILURE,
            reason_code=None
            if healthy
            else REASONS.get(message.reason, ReasonCode.UNKNOWN_FAILURE),
            summaries=summaries(count=message.failures),
        )
    ]


def counter_events(message: PluginCounters, model_id: LogicalId) -> list[Event]:
    """``serving_plugin_observed`` with the plugin's counters (counts only)."""
    plugin = _plugin_id(message.plugin)
    if plugin is None:
        return []
    return [
        make_event(
            EventId.SERVING_PLUGIN_OBSERVED,
            scope=Scope(model_id=model_id, plugin_id=plugin),
            summaries=summaries(
                plugin_delivered=message.delivered,
                plugin_deferred=message.deferred,
                plugin_dropped=message.dropped,
                plugin_late=message.late,
                plugin_failures=message.failures,
                plugin_discarded_invalid_token_count=message.discarded_invalid_token_count,
                plugin_discarded_invalid_token_id=message.discarded_invalid_token_id,
                plugin_discarded_position_mismatch=message.discarded_position_mismatch,
                plugin_discarded_execution_failed=message.discarded_execution_failed,
            ),
        )
    ]
