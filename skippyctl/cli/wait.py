"""`skippyctl wait --for CONDITION`: block until the runtime reaches a state (or fails to).

The current state (the stream's `runtime_state` frame) is checked first, then every new event;
`--fail-on` conditions end the wait at once with the exit code of the event's reason, so a
known failure never waits out the timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape

from skippyctl.cli.exit_codes import ExitCode, exit_code_for
from skippyctl.cli.feeds import LiveStream, StreamItem
from skippyctl.cli.fleet_flags import FleetFileOption, NodeOption, attach_node_or_exit
from skippyctl.cli.follow import Deadline, InterruptRequests, follow
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.codec import event_record
from skippyctl.output.state_reader import EnumValue, StateDocumentView
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    SETTLED_MODEL_STATES,
    ModelState,
    NodeState,
)

_MODEL_KINDS: Final = (
    "model_available",
    "model_loading",
    "model_unavailable",
    "model_load_failed",
)
_NODE_KINDS: Final = ("node_accepting", "node_degraded")
KINDS: Final = (*_MODEL_KINDS, *_NODE_KINDS, "event")
_STATES: Final[dict[str, frozenset[ModelState]]] = {
    "model_available": SERVING_MODEL_STATES,
    "model_loading": LOADING_MODEL_STATES,
    "model_unavailable": SETTLED_MODEL_STATES,
    "model_load_failed": frozenset({ModelState.FAILED}),
}
_EVENTS: Final[dict[str, frozenset[EventId]]] = {
    "model_available": frozenset({EventId.MODEL_AVAILABLE, EventId.MODEL_RECOVERY_COMPLETED}),
    "model_loading": frozenset(
        {EventId.MODEL_LOAD_REQUESTED, EventId.MODEL_LOAD_STARTED, EventId.MODEL_LOAD_PROGRESS}
    ),
    "model_unavailable": frozenset(
        {
            EventId.MODEL_UNAVAILABLE,
            EventId.UNLOAD_COMPLETED,
            EventId.MODEL_LOAD_FAILED,
            EventId.MODEL_LOAD_CANCELLED,
        }
    ),
    "model_load_failed": frozenset({EventId.MODEL_LOAD_FAILED}),
    "node_accepting": frozenset({EventId.NODE_ACCEPTING_REQUESTS}),
    "node_degraded": frozenset({EventId.NODE_DEGRADED}),
}
_NODE_STATES: Final = {"node_accepting": NodeState.ACCEPTING, "node_degraded": NodeState.DEGRADED}


@dataclass(frozen=True, slots=True)
class Condition:
    """One parsed `--for`/`--fail-on` value: `kind`, `model` (for model_* and event=ID@MODEL)
    and `event` (for event=ID)."""

    text: str
    kind: str
    model: str | None = None
    event: EventId | None = None

    def holds_in(self, state: StateDocumentView) -> tuple[bool, EnumValue[ReasonCode] | None]:
        """(whether the state document satisfies it, the model's reason code if any)."""
        if self.kind in _NODE_STATES:
            return state.node.member is _NODE_STATES[self.kind], None
        if self.kind not in _STATES or self.model is None:
            return False, None  # event=… only matches events that happen from now on
        model = state.model(self.model)
        if model is None:
            return self.kind == "model_unavailable", None  # not loaded at all: unavailable
        return model.state.member in _STATES[self.kind], model.reason_code

    def holds_for(self, event: Event) -> bool:
        if self.kind == "event":
            return event.id is self.event and (
                self.model is None or str(event.scope.model_id) == self.model
            )
        if event.id not in _EVENTS[self.kind]:
            return False
        return self.model is None or str(event.scope.model_id) == self.model


def parse_condition(text: str, option: str) -> Condition:
    kind, sep, value = text.partition("=")
    if kind in _NODE_KINDS and not sep:
        return Condition(text, kind)
    if kind in _MODEL_KINDS and sep and value:
        return Condition(text, kind, model=value)
    if kind == "event" and sep and value:
        event_text, _, model = value.partition("@")
        try:
            event = EventId(event_text)
        except ValueError:
            valid = ", ".join(e.value for e in EventId)
            raise typer.BadParameter(
                f"unknown event id {event_text!r}; valid ids: {valid}", param_hint=option
            ) from None
        return Condition(text, kind, model=model or None, event=event)
    raise typer.BadParameter(
        f"{text!r} is not a condition; use one of: "
        + ", ".join(f"{k}=MODEL" for k in _MODEL_KINDS)
        + ", node_accepting, node_degraded, event=EVENT_ID[@MODEL]",
        param_hint=option,
    )


def wait_command(
    for_: Annotated[
        list[str] | None,
        typer.Option(
            "--for",
            metavar="CONDITION",
            help="Return 0 as soon as this holds (repeatable: any of them).",
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            metavar="MODEL",
            help="Wait for MODEL to serve — a load someone asked for, or one a request started"
            " on demand — and fail with its reason if its load fails: --for"
            " model_available=MODEL --fail-on model_load_failed=MODEL (repeatable).",
        ),
    ] = None,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            metavar="CONDITION",
            help="Fail at once when this holds, with the code of its reason (repeatable).",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", metavar="S", help="Give up after S seconds (exit 124)."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON record saying which condition ended it.")
    ] = False,
    node: NodeOption = None,
    fleet_file: FleetFileOption = None,
) -> None:
    """Wait until a condition holds: checks the current state first, then follows events.

    CONDITION is one of model_available=MODEL, model_loading=MODEL, model_unavailable=MODEL
    (also true when MODEL is not loaded), model_load_failed=MODEL, node_accepting,
    node_degraded, event=EVENT_ID or event=EVENT_ID@MODEL (event conditions match only events
    that happen after the wait starts).

    Exit 0 when a --for condition holds; when a --fail-on condition holds, the exit code of its
    reason (12 missing_artifact, 14 model_format_or_load_failure, …; 1 when it has none);
    124 on --timeout; 3 when no runtime answers or it goes away; 130 on Ctrl-C.

    Examples:

        skippyctl load model.gguf --no-wait && skippyctl wait --for model_available=model \\
            --fail-on model_load_failed=model --timeout 120

        skippyctl wait --model qwen --timeout 300   # a load a request started on demand
    """
    if not for_ and not model:
        raise typer.BadParameter("give a condition (--for) or a model (--model)")
    wanted = [parse_condition(text, "--for") for text in for_ or ()]
    failing = [parse_condition(text, "--fail-on") for text in fail_on or ()]
    for name in model or ():
        wanted.append(parse_condition(f"model_available={name}", "--model"))
        failing.append(parse_condition(f"model_load_failed={name}", "--model"))
    if timeout is not None and timeout < 0:
        raise typer.BadParameter("must not be negative", param_hint="--timeout")
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    started = time.monotonic()
    client = attach_node_or_exit("wait", json_output, node, fleet_file)
    try:
        with InterruptRequests() as interrupts:
            record = _wait(LiveStream(client), wanted, failing, timeout, started, interrupts)
    finally:
        client.close()
    record["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    code = ExitCode(record["exit_code"])
    if json_output:
        emit_json(record)
    condition = escape(str(record.get("condition") or ""))
    if code is ExitCode.SUCCESS:
        err.print(f"[green]✓[/] {condition} ({record['source']})")
    elif record["outcome"] == "failed":
        reason = record.get("reason_code") or "no reason"
        err.print(f"[red]✗[/] {condition} ({record['source']}, {reason})")
    else:
        err.print(f"[red]✗[/] {escape(str(record.get('message')))}")
    raise typer.Exit(int(code))


def _record(
    outcome: str,
    code: ExitCode,
    condition: Condition | None,
    source: str,
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record": "wait",
        "outcome": outcome,
        "condition": None if condition is None else condition.text,
        "source": source,
        "exit_code": int(code),
    }
    if reason is not None:
        record["reason_code"] = reason
    if message is not None:
        record["message"] = message
    return record


def _wait(
    stream: LiveStream,
    wanted: list[Condition],
    failing: list[Condition],
    timeout: float | None,
    started: float,
    interrupts: InterruptRequests,
) -> dict[str, Any]:
    checked_state = False

    def watch(_item: StreamItem | None) -> dict[str, Any] | None:
        """The current state, once: the stream's `runtime_state` frame, checked as it arrives."""
        nonlocal checked_state
        if checked_state or stream.state is None:
            return None
        checked_state = True
        for condition in failing:
            holds, known = condition.holds_in(stream.state)
            if holds:
                code = exit_code_for(None if known is None else known.member)
                text = None if known is None else known.text
                return _record("failed", code, condition, "state", text)
        for condition in wanted:
            if condition.holds_in(stream.state)[0]:
                return _record("matched", ExitCode.SUCCESS, condition, "state")
        return None

    def ends(item: StreamItem) -> dict[str, Any] | None:
        event = item.event
        for condition in failing:
            if condition.holds_for(event):
                reason = event.reason_code.value if event.reason_code else None
                record = _record(
                    "failed", exit_code_for(event.reason_code), condition, "event", reason
                )
                record["event"] = event_record(event, item.sequence, item.cursor)
                return record
        for condition in wanted:
            if condition.holds_for(event):
                record = _record("matched", ExitCode.SUCCESS, condition, "event")
                record["event"] = event_record(event, item.sequence, item.cursor)
                return record
        return None

    deadline: Deadline[dict[str, Any]] | None = None
    if timeout is not None:
        message = f"no condition held within {timeout:g} s"
        deadline = Deadline(
            started + timeout,
            lambda: _record("timeout", ExitCode.TIMEOUT, None, "timeout", message=message),
        )
    return follow(
        stream,
        show=lambda _item: None,
        ends=ends,
        watch=watch,
        stream_ended=lambda ended: _record(
            "unreachable", ExitCode.RUNTIME_UNREACHABLE, None, "stream", message=str(ended)
        ),
        interrupts=interrupts,
        on_interrupt=lambda _count: _record(
            "cancelled", ExitCode.CANCELLED, None, "interrupt", message="cancelled"
        ),
        deadline=deadline,
    )
