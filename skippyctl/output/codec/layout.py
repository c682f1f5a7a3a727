"""The field mapping of the two public event shapes: which parts of an `Event` each carries, in
which order, under which keys. The encoder and the decoder both read it, so a shape is defined
once (skippyctl.output.codec describes both shapes in full).

Invariant: a key listed here is written by `encode` exactly when its part applies, and is
known to `decode`; any other key is an unknown field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Final, assert_never

WIRE_VERSION: Final = 1
"""The SSE frame envelope's `version`."""


class Part(Enum):
    """A group of keys an event contributes to a shape."""

    SCHEMA = auto()  # schema_version
    ID = auto()  # event | kind
    CATEGORY = auto()
    SEVERITY = auto()
    TS = auto()
    POSITION = auto()  # seq, cursor (the record's place in a stream)
    PRODUCER = auto()
    OPERATION = auto()
    SCOPE = auto()
    OUTCOME = auto()  # progress, outcome, reason_code, duration_ms, stop_reason, batching, state
    NATIVE = auto()
    SUMMARIES = auto()
    SETTINGS = auto()
    SUMMARY = auto()


SCOPE_KEYS: Final = (
    "model_id",
    "topology_id",
    "stage_id",
    "session_id",
    "request_id",
    "device_id",
    "plugin_id",
)
SCOPE_FIELDS: Final = frozenset({*SCOPE_KEYS, "stage_index"})
OUTCOME_KEYS: Final = (
    "progress",
    "outcome",
    "reason_code",
    "duration_ms",
    "stop_reason",
    "batching",
    "state",
)
PROGRESS_KEYS: Final = frozenset({"current", "total", "unit"})
STATE_KEYS: Final = frozenset({"current", "previous"})
OPERATION_KEYS: Final = frozenset({"root", "child"})
SUMMARY_ITEM_KEYS: Final = frozenset({"key", "value"})


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each part of an event sits in one JSON shape."""

    order: tuple[Part, ...]
    id_key: str
    scope_key: str | None
    """None: the scope ids sit at the top level; else nested under this key."""
    operation_key: str | None
    """None: flat `operation_id` (and `parent_operation_id`, read only); else {root, child}."""
    native_keys: tuple[str, ...]
    summaries_key: str
    summaries_listed: bool
    """True: [{key, value}, …]; False: {key: value}."""
    known_keys: frozenset[str] = field(init=False)
    """Every top-level key this shape may carry (anything else is an unknown field)."""

    def __post_init__(self) -> None:
        keys: set[str] = set()
        for part in self.order:
            match part:
                case Part.SCHEMA:
                    keys.add("schema_version")
                case Part.ID:
                    keys.add(self.id_key)
                case Part.CATEGORY:
                    keys.add("category")
                case Part.SEVERITY:
                    keys.add("severity")
                case Part.TS:
                    keys.add("ts")
                case Part.POSITION:
                    keys.update(("seq", "cursor"))
                case Part.PRODUCER:
                    keys.add("producer")
                case Part.OPERATION:
                    flat = ("operation_id", "parent_operation_id")
                    keys.update(flat if self.operation_key is None else (self.operation_key,))
                case Part.SCOPE:
                    keys.update(SCOPE_FIELDS if self.scope_key is None else (self.scope_key,))
                case Part.OUTCOME:
                    keys.update(OUTCOME_KEYS)
                case Part.NATIVE:
                    keys.add("native")
                case Part.SUMMARIES:
                    keys.add(self.summaries_key)
                case Part.SETTINGS:
                    keys.add("settings")
                case Part.SUMMARY:
                    keys.add("summary")
                case _:
                    assert_never(part)
        # A derived field nobody passes in: a frozen dataclass sets it through object.
        object.__setattr__(self, "known_keys", frozenset(keys))


RECORD: Final = Layout(
    order=(
        Part.SCHEMA,
        Part.ID,
        Part.CATEGORY,
        Part.SEVERITY,
        Part.TS,
        Part.POSITION,
        Part.PRODUCER,
        Part.OPERATION,
        Part.SCOPE,
        Part.OUTCOME,
        Part.NATIVE,
        Part.SUMMARIES,
        Part.SETTINGS,
        Part.SUMMARY,
    ),
    id_key="event",
    scope_key=None,
    operation_key=None,
    native_keys=("sequence", "evidence"),
    summaries_key="summaries",
    summaries_listed=False,
)
"""The NDJSON `--json` record."""

OBJECT: Final = Layout(
    order=(
        Part.CATEGORY,
        Part.ID,
        Part.PRODUCER,
        Part.SEVERITY,
        Part.TS,
        Part.SCOPE,
        Part.OPERATION,
        Part.OUTCOME,
        Part.NATIVE,
        Part.SUMMARIES,
        Part.SETTINGS,
        Part.SUMMARY,
    ),
    id_key="kind",
    scope_key="scope",
    operation_key="operation",
    native_keys=("sequence", "timestamp_ns", "evidence"),
    summaries_key="numeric_summaries",
    summaries_listed=True,
)
"""The SSE event object (the frame adds `version`, `cursor`, `process_instance_id`,
`sequence`)."""
