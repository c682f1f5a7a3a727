"""A model's serving plugins in the state document: state, failures and delivery counters,
discards by reason — counts only."""

from __future__ import annotations

from skippyctl.events.envelope import LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.state import model_document
from skippyctl.reducer.state import ModelState, ModelView, PluginState, PluginView, RuntimeView


def test_a_models_plugins_are_listed_with_their_counters() -> None:
    plugin = PluginView(
        LogicalId("ngram"),
        PluginState.DISABLED,
        reason_code=ReasonCode.PROCESS_CRASH,
        failures=3,
        restarts=2,
        delivered=40,
        deferred=1,
        dropped=2,
        late=5,
        discarded_invalid_token_id=7,
    )
    model = ModelView(LogicalId("tiny"), ModelState.AVAILABLE, plugins=(plugin,))
    document = model_document(RuntimeView(models={model.model_id: model}), model)
    assert document["plugins"] == [
        {
            "plugin_id": "ngram",
            "state": "disabled",
            "reason_code": "process_crash",
            "failures": 3,
            "restarts": 2,
            "delivered": 40,
            "deferred": 1,
            "dropped": 2,
            "late": 5,
            "discarded": {
                "deadline_exceeded": 5,
                "invalid_token_count": 0,
                "invalid_token_id": 7,
                "position_mismatch": 0,
                "execution_failed": 0,
            },
        }
    ]


def test_a_model_without_plugins_has_no_plugins_key() -> None:
    model = ModelView(LogicalId("tiny"), ModelState.AVAILABLE)
    assert "plugins" not in model_document(RuntimeView(models={model.model_id: model}), model)
