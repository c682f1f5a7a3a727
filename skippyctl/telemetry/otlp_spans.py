"""Requests as OTLP traces: one span tree per request, built from its lifecycle events.

    request        request_received → request_{completed,cancelled,timed_out,failed,rejected}
    ├─ queue       request_received → request_admitted (or the terminal, if never admitted)
    ├─ prefill     prompt_processing_started / prefill_started → prefill_completed
    └─ decode      generation_started → generation_{completed,cancelled,timed_out,failed}

Ids come from the events' scope, times from their wall clocks; attributes are ids, counts,
durations and closed vocabularies from the same typed events. Open trees are bounded
(`max_open`): beyond it the oldest is ended early, marked and counted `evicted`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.events.figures import SUMMARY_KEYS
from skippyctl.events.reasons import Outcome
from skippyctl.telemetry.otlp import SpanStats

_REQUEST_TERMINALS: Final = frozenset(
    {
        EventId.REQUEST_COMPLETED,
        EventId.REQUEST_CANCELLED,
        EventId.REQUEST_TIMED_OUT,
        EventId.REQUEST_FAILED,
        EventId.REQUEST_REJECTED,
    }
)
_PREFILL_STARTS: Final = frozenset({EventId.PROMPT_PROCESSING_STARTED, EventId.PREFILL_STARTED})
_PREFILL_ENDS: Final = frozenset(
    {EventId.PREFILL_COMPLETED, EventId.PREFILL_CANCELLED, EventId.PREFILL_FAILED}
)
_GENERATION_ENDS: Final = frozenset(
    {
        EventId.GENERATION_COMPLETED,
        EventId.GENERATION_CANCELLED,
        EventId.GENERATION_TIMED_OUT,
        EventId.GENERATION_FAILED,
    }
)
# Numbers copied onto the request span (and the child that measured them), by summary key: a
# request's generation figures (the one table, events/figures.py) and the host's queue figures.
_SPAN_NUMBERS: Final = (*SUMMARY_KEYS, SummaryKey.QUEUE_DEPTH, SummaryKey.QUEUE_WAIT_MS)


@dataclass(slots=True)
class _RequestTree:
    root: Span
    queue: Span | None = None
    prefill: Span | None = None
    decode: Span | None = None
    children: list[Span] = field(default_factory=list)

    def current(self) -> Span:
        for span in (self.decode, self.prefill, self.queue):
            if span is not None and span.is_recording():
                return span
        return self.root


def _scope_attributes(event: Event) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    scope = event.scope
    if scope.request_id is not None:
        attributes["request_id"] = str(scope.request_id)
    if scope.model_id is not None:
        attributes["model_id"] = str(scope.model_id)
        attributes["gen_ai.request.model"] = str(scope.model_id)
    if scope.session_id is not None:
        attributes["session_id"] = str(scope.session_id)
    return attributes


def _numbers(event: Event) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for key in _SPAN_NUMBERS:
        value = event.summary_value(key)
        if value is not None:
            attributes[key.value] = value
    if SummaryKey.PROMPT_TOKENS.value in attributes and event.id in _GENERATION_ENDS:
        attributes["gen_ai.usage.input_tokens"] = attributes[SummaryKey.PROMPT_TOKENS.value]
    if SummaryKey.GENERATED_TOKENS.value in attributes:
        attributes["gen_ai.usage.output_tokens"] = attributes[SummaryKey.GENERATED_TOKENS.value]
    return attributes


def _end(span: Span | None, event: Event, failed: bool = False) -> None:
    if span is None or not span.is_recording():
        return
    if failed:
        span.set_status(Status(StatusCode.ERROR, event.reason_code or None))
    span.end(end_time=event.wall_ns)


def _failed(event: Event) -> bool:
    return event.outcome in (Outcome.FAILURE, Outcome.REJECTED)


class RequestSpans:
    """Builds one span tree per request from its lifecycle events (intake thread only).

    At most `max_open` trees are open; a new request beyond that ends the oldest tree early
    (`skippy.span.evicted=true`, counted). Events for a request without an open tree (evicted,
    or received before the exporter subscribed) are counted `unmatched_events`."""

    def __init__(self, tracer: trace_api.Tracer, max_open: int) -> None:
        self._tracer = tracer
        self._max_open = max_open
        self._open: dict[str, _RequestTree] = {}
        self._lock = threading.Lock()  # guards the counters; the trees are intake-thread only
        self._started = 0
        self._ended = 0
        self._evicted = 0
        self._discarded = 0
        self._unmatched = 0

    def observe(self, event: Event) -> Span | None:
        """Advance the tree of the event's request; the span the event belongs to, if any."""
        request_id = event.scope.request_id
        if request_id is None:
            return None
        key = str(request_id)
        if event.id is EventId.REQUEST_RECEIVED:
            return self._start(key, event)
        tree = self._open.get(key)
        if tree is None:
            if event.category.value in ("request", "prefill", "generation"):
                with self._lock:
                    self._unmatched += 1
            return None
        self._advance(key, tree, event)
        return tree.current()

    def _start(self, key: str, event: Event) -> Span:
        if key in self._open:  # a duplicate: end the stale tree, start over
            self._finish(key, self._open[key], event, evicted=True)
        while len(self._open) >= self._max_open:
            oldest = next(iter(self._open))
            self._finish(oldest, self._open[oldest], event, evicted=True)
        attributes = _scope_attributes(event)
        root = self._tracer.start_span(
            "skippy.request",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=event.wall_ns,
        )
        tree = _RequestTree(root)
        tree.queue = self._child(tree, "queue", event)
        self._open[key] = tree
        with self._lock:
            self._started += 1
        return tree.queue

    def _child(self, tree: _RequestTree, name: str, event: Event) -> Span:
        span = self._tracer.start_span(
            name,
            context=trace_api.set_span_in_context(tree.root),
            kind=SpanKind.INTERNAL,
            attributes=_scope_attributes(event),
            start_time=event.wall_ns,
        )
        tree.children.append(span)
        return span

    def _advance(self, key: str, tree: _RequestTree, event: Event) -> None:
        numbers = _numbers(event)
        if numbers:
            tree.root.set_attributes(numbers)
        match event.id:
            case EventId.REQUEST_QUEUED if tree.queue is not None:
                tree.queue.set_attributes(numbers)
            case EventId.REQUEST_ADMITTED:
                if tree.queue is not None:
                    tree.queue.set_attributes(numbers)
                _end(tree.queue, event)
            case event_id if event_id in _PREFILL_STARTS:
                if tree.prefill is None:
                    _end(tree.queue, event)  # admission precedes it: never left open
                    tree.prefill = self._child(tree, "prefill", event)
                tree.prefill.set_attributes(numbers)
            case event_id if event_id in _PREFILL_ENDS:
                if tree.prefill is not None:
                    tree.prefill.set_attributes(numbers)
                    if event.duration_ms is not None:
                        tree.prefill.set_attribute("duration_ms", event.duration_ms)
                _end(tree.prefill, event, failed=event.id is EventId.PREFILL_FAILED)
            case EventId.GENERATION_STARTED:
                _end(tree.prefill, event)
                if tree.decode is None:
                    tree.decode = self._child(tree, "decode", event)
            case EventId.FIRST_TOKEN_PRODUCED if tree.decode is not None:
                tree.decode.add_event("first_token_produced", numbers, timestamp=event.wall_ns)
            case event_id if event_id in _GENERATION_ENDS:
                outcome: dict[str, AttributeValue] = {}
                if event.stop_reason is not None:
                    outcome["stop_reason"] = event.stop_reason.value
                    outcome["gen_ai.response.finish_reasons"] = (event.stop_reason.value,)
                if event.batching is not None:
                    outcome["batching"] = event.batching.value
                tree.root.set_attributes(outcome)
                if tree.decode is not None:
                    tree.decode.set_attributes({**numbers, **outcome})
                _end(tree.decode, event, failed=_failed(event))
            case event_id if event_id in _REQUEST_TERMINALS:
                self._finish(key, tree, event, evicted=False)
            case _:
                pass

    def _finish(self, key: str, tree: _RequestTree, event: Event, *, evicted: bool) -> None:
        failed = _failed(event) and not evicted
        for span in tree.children:
            _end(span, event, failed=failed)
        attributes: dict[str, AttributeValue] = {}
        if evicted:
            attributes["skippy.span.evicted"] = True
        else:
            if event.outcome is not None:
                attributes["outcome"] = event.outcome.value
            if event.reason_code is not None:
                attributes["reason_code"] = event.reason_code.value
            if event.duration_ms is not None:
                attributes["duration_ms"] = event.duration_ms
            attributes["terminal_event"] = event.id.value
        tree.root.set_attributes(attributes)
        _end(tree.root, event, failed=failed)
        del self._open[key]
        with self._lock:
            if evicted:
                self._evicted += 1
            else:
                self._ended += 1

    def discard(self) -> None:
        """Shutdown: forget the open trees (never ended, so never exported), counted."""
        with self._lock:
            self._discarded += len(self._open)
        self._open.clear()

    def stats(self) -> SpanStats:
        with self._lock:
            return SpanStats(
                open_requests=self._started - self._ended - self._evicted - self._discarded,
                started=self._started,
                ended=self._ended,
                evicted=self._evicted,
                discarded_at_shutdown=self._discarded,
                unmatched_events=self._unmatched,
            )
