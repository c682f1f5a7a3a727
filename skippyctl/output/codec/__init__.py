"""The wire codec: the one place an `Event` becomes JSON, and JSON becomes an `Event` again.

Two public shapes, both laid out by one field mapping (`RECORD` and `OBJECT` in codec.layout say
which parts an event has in each, in which order, under which keys); `encode` writes them,
`decode` reads them:

- The **record** (`event_record`): one `--json` NDJSON line; also the OTLP log attributes,
  the state document's `recent_events` and
  `GET /api/runtime/events/recent`. Keys: `schema_version`, `event` (the id), `category`,
  `severity`, `ts`, `seq`, `cursor`, `producer`, then only when they apply `operation_id`, the
  scope flat (`model_id`, `topology_id`, `stage_id`, `session_id`, `request_id`, `device_id`,
  `plugin_id`, `stage_index`), `progress` {current,total,unit}, `outcome`, `reason_code`,
  `duration_ms`, `stop_reason`, `batching`, `state` {current,previous}, `native`
  {sequence,evidence}, `summaries` {key: number}, `settings` {key: number, flag or token}; last
  `summary`.
- The **event object** (`event_object`): the `event` of an SSE `runtime_event` frame (`frame`
  adds the envelope `version`, `cursor`, `process_instance_id`, `sequence`). Keys: `category`,
  `kind` (the id), `producer`, `severity`, `ts`, `scope` {the same ids}, `operation`
  {root,child}, the same outcome fields, `native` {sequence,timestamp_ns,evidence},
  `numeric_summaries` [{key,value}], `settings` {key: value}; last `summary`.

Both are version 1: fields are added, never renamed, and the key order is part of the contract
(tests pin the bytes). `ts` is UTC RFC 3339 with microseconds.

Decoding (`decode_record`, `decode_object`, `decode_line`, `decode_frame_event`) never raises.
It returns the event (None when the whole input is skipped) and one `SkipReason` per record,
field or value it did not take as it came:

- input that is not a JSON object: `malformed_line` (a line) or `invalid_record` (a value);
- a record `schema_version` or frame `version` other than this build's: `unsupported_schema`;
- an event id not in this build's catalog: `unknown_event`;
- a missing or unparseable `ts`, a missing `schema_version`/`version`, an invalid identity,
  number, text or shape: `invalid_record` (the record is skipped, never given a made-up value);
- an unknown key, at the top or inside a nested object, or an unknown summary key: the key is
  dropped and counted, the record kept (`unknown_field`);
- an unknown enum value (severity, producer, outcome, reason code, stop reason, batching, unit,
  evidence), or a setting whose key or value an `Event` cannot hold: dropped, or replaced by the
  catalog default, and counted (`unknown_value`).

What a shape does not carry is reconstructed, never invented as a sentinel: the monotonic time
is the wall time (`ts`), the record's native stamp takes that same time, the record carries no
parent operation, the category comes from the catalog and the human `summary` is re-rendered.
"""

from __future__ import annotations

from skippyctl.output.codec.decode import (
    RECORD_SKIPS,
    Decoded,
    RecordError,
    SkipReason,
    decode,
    decode_frame_event,
    decode_line,
    decode_object,
    decode_record,
    event_from_object,
    event_from_record,
)
from skippyctl.output.codec.encode import (
    Encoder,
    dumps_line,
    event_frame,
    event_object,
    event_record,
    frame,
    rfc3339,
)
from skippyctl.output.codec.layout import OBJECT, RECORD, WIRE_VERSION, Layout

__all__ = [
    "OBJECT",
    "RECORD",
    "RECORD_SKIPS",
    "WIRE_VERSION",
    "Decoded",
    "Encoder",
    "Layout",
    "RecordError",
    "SkipReason",
    "decode",
    "decode_frame_event",
    "decode_line",
    "decode_object",
    "decode_record",
    "dumps_line",
    "event_frame",
    "event_from_object",
    "event_from_record",
    "event_object",
    "event_record",
    "frame",
    "rfc3339",
]
