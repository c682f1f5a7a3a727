"""Privacy by construction: no event field can carry a prompt, a path, or a forbidden key."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import (
    Event,
    InvalidLogicalId,
    LogicalId,
    NativeStamp,
    Progress,
    Scope,
    SequenceEvidence,
    StateChange,
    SummaryKey,
    make_event,
    summaries,
)
from skippyctl.events.identity import model_id_for
from skippyctl.events.reasons import Outcome, ProgressUnit, ReasonCode
from skippyctl.output.codec import event_record

FORBIDDEN_KEYS = {
    "prompt", "completion", "tool_arguments", "tool_results", "media_content", "token_ids",
    "token_text", "logits", "absolute_path", "private_url", "credential", "native_pointer",
    "hardware_identifier", "cache_key", "path", "text", "body",
}  # fmt: skip
CANARY = "CANARY-7f3a9"


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _canary_event(event_id: EventId) -> Event:
    canary = LogicalId(CANARY)
    return make_event(
        event_id,
        operation_id=canary,
        parent_operation_id=canary,
        scope=Scope(
            model_id=canary,
            topology_id=canary,
            stage_id=canary,
            stage_index=1,
            session_id=canary,
            request_id=canary,
            device_id=LogicalId("CPU"),
        ),
        native=NativeStamp(1, 1, SequenceEvidence.FIRST),
        state=StateChange("idle", "active"),
        progress=Progress(1, 2, ProgressUnit.STEPS),
        outcome=Outcome.FAILURE,
        reason_code=ReasonCode.UNKNOWN_FAILURE,
        duration_ms=1.0,
        summaries=tuple(summary for key in SummaryKey for summary in summaries(**{key.value: 1})),
    )


def test_event_has_no_free_text_field() -> None:
    """Every str-typed field of the envelope is a LogicalId or an enum (a closed vocabulary)."""
    for field in dataclasses.fields(Event):
        assert field.type not in ("str", "str | None"), field.name
    for field in dataclasses.fields(Scope):
        assert field.type in ("LogicalId | None", "int | None"), field.name


@pytest.mark.parametrize("event_id", list(EventId))
def test_every_event_serialises_without_forbidden_keys_or_paths(event_id: EventId) -> None:
    record = event_record(_canary_event(event_id), seq=1)
    assert not (_keys(record) & FORBIDDEN_KEYS)
    text = orjson.dumps(record).decode()
    assert "/" not in text.replace("\\/", "")
    # the canary only travels in identity fields, never in the human summary
    assert CANARY not in record["summary"]


@pytest.mark.parametrize(
    "value",
    [
        "/home/alice/models/secret.gguf",
        "Tell me the launch codes",
        "../../etc/passwd",
        "x" * 65,
        "",
        "0x7ffd5e8a1234\n",
    ],
)
def test_identities_refuse_prompts_paths_and_blobs(value: str) -> None:
    with pytest.raises(InvalidLogicalId):
        LogicalId(value)


def test_model_ids_from_paths_keep_only_the_basename() -> None:
    assert model_id_for("/home/alice/models/secret-model.gguf") == "secret-model"
    assert model_id_for("C:/x/tiny-split-00001-of-00003.gguf") == "tiny-split"
    assert model_id_for("/tmp/we ird name!.gguf") == "we_ird_name"
    assert model_id_for("/x/y.gguf", alias="chat") == "chat"
