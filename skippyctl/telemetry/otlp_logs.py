"""Events as OTLP log records: the `skippyctl events --json` record, flattened.

A log record's body is the event id and its attributes are the record's fields
(`summaries.prompt_tokens`, `progress.current`, …), nothing added: events have no free-text
field (events/envelope.py), so no prompt, completion, token id or path can reach a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry._logs import SeverityNumber
from opentelemetry.util.types import AttributeValue

from skippyctl.events.reasons import Severity
from skippyctl.output.codec import event_record
from skippyctl.pipeline.dispatch import Dispatched, Dispatcher

SEVERITY_NUMBERS: Final = {
    Severity.TRACE: SeverityNumber.TRACE,
    Severity.DEBUG: SeverityNumber.DEBUG,
    Severity.INFO: SeverityNumber.INFO,
    Severity.WARNING: SeverityNumber.WARN,
    Severity.ERROR: SeverityNumber.ERROR,
    Severity.FATAL: SeverityNumber.FATAL,
}


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, AttributeValue]:
    """A JSON record as OTLP attributes: nested objects become dotted keys
    (`summaries.prompt_tokens`, `progress.current`); scalars stay typed; None is skipped."""
    out: dict[str, AttributeValue] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
    return out


def log_attributes(item: Dispatched, dispatcher: Dispatcher | None) -> dict[str, AttributeValue]:
    cursor = dispatcher.cursor(item.sequence) if dispatcher is not None else None
    return flatten(event_record(item.event, item.sequence, cursor))
