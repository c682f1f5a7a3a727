"""Serving plugins' health as events: what the engine's plugin link reported
(``engine/protocol_messages.py`` :class:`~skippyctl.engine.protocol_messages.PluginReported`).

- ``loaded`` → ``serving_plugin_loaded``; ``load_failed`` → ``serving_plugin_load_failed``;
  ``failed`` → ``serving_plugin_failed``; ``restarted`` → ``serving_plugin_restarted``;
  ``disabled`` → ``serving_plugin_disabled``. Scope: the model and ``plugin_id`` (the plugin's
  short name); the reason word becomes a reason code (:data:`REASONS`); summary ``count`` = the
  plugin's failures so far. A kind this host does not know, or a name that is not a safe
  logical id, is left out rather than reported wrong.
"""

from __future__ import annotations

from typing import Final

from skippyctl.engine.protocol_messages import PluginReported
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
    "invalid_tokens": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "init_failed": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "spawn_failed": ReasonCode.INTERNAL_RUNTIME_FAILURE,
    "load_error": ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE,
    "not_found": ReasonCode.MISSING_ARTIFACT,
    "no_entry_point": ReasonCode.MISSING_ARTIFACT,
    "abi_mismatch": ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET,
}
"""The plugin link's reason words (``skippyctl.plugins.link``) as reason codes; any other word
of a failure is ``unknown_failure``."""
_HEALTHY: Final = frozenset({"loaded", "restarted"})


def plugin_events(message: PluginReported, model_id: LogicalId) -> list[Event]:
    event_id = KINDS.get(message.kind)
    if event_id is None:
        return []
    try:
        plugin = LogicalId(message.plugin)
    except InvalidLogicalId:
        return []
    healthy = message.kind in _HEALTHY
    return [
        make_event(
            event_id,
            scope=Scope(model_id=model_id, plugin_id=plugin),
            outcome=Outcome.SUCCESS if healthy else Outcome.FAILURE,
            reason_code=None
            if healthy
            else REASONS.get(message.reason, ReasonCode.UNKNOWN_FAILURE),
            summaries=summaries(count=message.failures),
        )
    ]
