"""`skippyctl generate MODEL PROMPT`: stream a completion from a loaded model.

The text streams to stdout as it is generated; the request's lifecycle (queueing, time to
first token, rates, stop reason) comes from the runtime's event stream and is summarised on
stderr. The request is matched to its events as the first request on MODEL the runtime
received after this command started sending (the OpenAI-compatible API names no request id).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Annotated, Any, Final

import httpx
import orjson
import typer
from rich.console import Console
from rich.markup import escape

from skippyctl.cli.exit_codes import ExitCode, exit_code_for_text
from skippyctl.cli.feeds import LiveStream, StreamEnded, StreamItem
from skippyctl.cli.fleet_flags import FleetFileOption, NodeOption, attach_node_or_exit
from skippyctl.cli.follow import InterruptRequests, follow
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json, error_record
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, SummaryKey
from skippyctl.events.reasons import Category
from skippyctl.output.codec import event_record

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient

_REQUEST_CATEGORIES: Final = frozenset(
    {Category.REQUEST, Category.PREFILL, Category.GENERATION, Category.KV_RUNTIME_STATE}
)
_REQUEST_TERMINALS: Final = frozenset(
    {
        EventId.REQUEST_COMPLETED,
        EventId.REQUEST_CANCELLED,
        EventId.REQUEST_TIMED_OUT,
        EventId.REQUEST_FAILED,
        EventId.REQUEST_REJECTED,
    }
)
EVENTS_GRACE_S: Final = 3.0
"""How long to wait after the text ended for the request's terminal event."""


class _Completion:
    """POST /v1/completions with stream=true on a thread; items go to `queue`:
    ("text", str), ("error", dict), ("done", None) or ("broken", str)."""

    def __init__(self, client: RuntimeClient, body: dict[str, Any], session: str | None) -> None:
        self.queue: SimpleQueue[tuple[str, Any]] = SimpleQueue()
        token = client.discovery.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if session:
            headers["X-Session-Id"] = session
        self._http = httpx.Client(
            base_url=client.discovery.url,
            headers=headers,
            timeout=httpx.Timeout(30.0, read=None),
            verify=client.ssl_context or True,
            trust_env=False,  # the runtime is reached directly, never through a proxy
        )
        self._body = body
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skippy-generate", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop reading: closing the connection makes the runtime cancel the request."""
        self._closed.set()
        self._http.close()

    def _run(self) -> None:
        try:
            with self._http.stream(
                "POST", "/v1/completions", content=orjson.dumps(self._body)
            ) as r:
                if r.status_code != 200:
                    r.read()
                    try:
                        payload = orjson.loads(r.content)
                    except orjson.JSONDecodeError:
                        payload = {}
                    error = payload.get("error") if isinstance(payload, dict) else None
                    self.queue.put(("error", {"status": r.status_code, **(error or {})}))
                    return
                self.queue.put(("request_id", r.headers.get("x-request-id")))
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    chunk = orjson.loads(data)
                    if "error" in chunk:
                        self.queue.put(("error", chunk["error"] or {}))
                        continue
                    for choice in chunk.get("choices") or ():
                        text = choice.get("text")
                        if text:
                            self.queue.put(("text", text))
            self.queue.put(("done", None))
        except (httpx.HTTPError, orjson.JSONDecodeError) as error:
            if not self._closed.is_set():
                self.queue.put(("broken", str(error)))


MAX_EARLY_EVENTS: Final = 512
"""Request events held back until the response names its request (X-Request-Id)."""


class _Lifecycle:
    """Picks out this request's events and remembers what the summary needs."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.request_id: str | None = None
        self._early: list[Event] = []
        self.terminal: Event | None = None
        self.completed: Event | None = None
        self.first_token: Event | None = None
        self.rejected: Event | None = None

    def bind(self, request_id: str) -> list[Event]:
        """The runtime named this request (`X-Request-Id`): returns the events of it that
        arrived before the name did, now recorded, in order."""
        self.request_id = request_id
        early, self._early = self._early, []
        return [event for event in early if self.take(event)]

    def take(self, event: Event) -> bool:
        """True when `event` belongs to this request (and records it). Until the request's id
        is known, request events are held back (bounded) for `bind`."""
        request = event.scope.request_id
        if request is None or event.category not in _REQUEST_CATEGORIES:
            return False
        if self.request_id is None:
            if len(self._early) < MAX_EARLY_EVENTS:
                self._early.append(event)
            return False
        if str(request) != self.request_id:
            return False
        if event.id is EventId.FIRST_TOKEN_PRODUCED:
            self.first_token = event
        if event.category is Category.GENERATION and event.outcome is not None:
            self.completed = event
        if event.id in _REQUEST_TERMINALS:
            self.terminal = event
        return True

    def summary(self) -> str:
        parts: list[str] = []
        source = self.completed or self.first_token
        if source is None:
            return ""

        def value(key: SummaryKey) -> float | None:
            for event in (self.completed, self.first_token):
                if event is not None and event.summary_value(key) is not None:
                    return event.summary_value(key)
            return None

        ttft = value(SummaryKey.TIME_TO_FIRST_TOKEN_MS)
        if ttft is not None:
            parts.append(f"ttft {ttft:.0f} ms")
        for key, label in (
            (SummaryKey.PROMPT_TOKENS, "prompt tokens"),
            (SummaryKey.GENERATED_TOKENS, "generated tokens"),
        ):
            number = value(key)
            if number is not None:
                parts.append(f"{int(number)} {label}")
        for key, label in (
            (SummaryKey.PREFILL_TOKENS_PER_S, "prefill"),
            (SummaryKey.DECODE_TOKENS_PER_S, "decode"),
        ):
            rate = value(key)
            if rate is not None:
                parts.append(f"{label} {rate:.1f} tok/s")
        if self.completed is not None and self.completed.stop_reason is not None:
            parts.append(f"stop: {self.completed.stop_reason.value}")
        return " · ".join(parts)


def generate_command(
    model: Annotated[str, typer.Argument(help="A loaded model id (see `skippyctl ps`).")],
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    session: Annotated[
        str | None,
        typer.Option("--session", help="Session key: requests with the same key reuse the KV."),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, help="Tokens to generate at most.")
    ] = 64,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature.")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Sampler seed.")] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")
    ] = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='NDJSON on stdout: {"record":"output","text":…} for text, event records for '
            'the request\'s lifecycle events, then {"record":"receipt",…}: its counts, timings '
            "and stop reason.",
        ),
    ] = False,
    node: NodeOption = None,
    fleet_file: FleetFileOption = None,
) -> None:
    """Generate a completion of PROMPT with MODEL, streaming the text to stdout.

    The request's lifecycle (time to first token, prompt/decode rates, stop reason) is
    summarised on stderr. Exit 0 when the generation completed; otherwise the code of the
    failure's reason (for example 19 context_exhausted, 20 stage_unavailable when MODEL is not
    loaded); 3 when no runtime answers; 130 on Ctrl-C (the request is cancelled).

    Example:

        skippyctl generate tiny "Once upon a time" --max-tokens 32 --seed 1

        skippyctl generate tiny "Hello" --json | jq -r 'select(.record=="output") | .text'
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    client = attach_node_or_exit("generate", json_output, node, fleet_file)
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "stream": True,
        "max_tokens": max_tokens,
    }
    if temperature is not None:
        body["temperature"] = temperature
    if seed is not None:
        body["seed"] = seed
    if stop:
        body["stop"] = stop
    if session:
        body["user"] = session
    stream = LiveStream(client)
    stream.wait_connected()
    lifecycle = _Lifecycle(model)
    completion = _Completion(client, body, session)
    run = _Run(completion, lifecycle, json_output)
    receipt: dict[str, Any] | None = None
    try:
        with InterruptRequests() as interrupts:
            code, message = follow(
                _TextAndEvents(stream, completion, run.take),
                relevant=lambda item: lifecycle.take(item.event),
                show=run.show,
                ends=lambda _item: None,  # the text's end and the request's terminal: `over`
                watch=run.over,
                stream_ended=lambda ended: (ExitCode.RUNTIME_UNREACHABLE, str(ended)),
                interrupts=interrupts,
                on_interrupt=run.cancel,
                poll_s=TEXT_POLL_S,
            )
        receipt = _receipt(client, lifecycle)
        if receipt is not None and json_output:
            emit_json({"schema_version": RECORD_SCHEMA_VERSION, "record": "receipt", **receipt})
    finally:
        completion.close()
        client.close()
    run.end_text_line()
    summary = lifecycle.summary()
    if receipt is not None:
        summary = " · ".join(part for part in (summary, _receipt_summary(receipt)) if part)
    if code is ExitCode.SUCCESS:
        err.print(f"[green]✓[/] {escape(model)}: {escape(summary or 'completed')}")
    else:
        err.print(f"[red]✗[/] {escape(model)}: {escape(message)}")
    raise typer.Exit(int(code))


RECEIPT_WAIT_S: Final = 2.0
"""How long to wait for the receipt of a request whose terminal this command did not see (the
runtime records it as the request ends)."""


def _receipt(client: RuntimeClient, lifecycle: _Lifecycle) -> dict[str, Any] | None:
    """The request's receipt from the runtime, or None (no request id, or none in time)."""
    from skippyctl.client.http import RuntimeUnreachable

    if lifecycle.request_id is None:
        return None
    deadline = time.monotonic() + RECEIPT_WAIT_S
    while True:
        try:
            receipt = client.receipt(lifecycle.request_id)
        except RuntimeUnreachable:
            return None
        if receipt is not None or time.monotonic() >= deadline:
            return receipt
        time.sleep(0.05)


def _receipt_summary(receipt: dict[str, Any]) -> str:
    parts = []
    queue_ms = receipt.get("queue_ms")
    if isinstance(queue_ms, int | float):
        parts.append(f"queued {queue_ms:.0f} ms")
    reused = receipt.get("reused_tokens")
    if isinstance(reused, int) and reused > 0:
        parts.append(f"{reused} prompt tokens reused")
    spec = receipt.get("speculative")
    if isinstance(spec, dict) and spec.get("mode") not in (None, "off"):
        parts.append(
            f"{spec.get('mode')}: {spec.get('accepted')}/{spec.get('proposed')} proposed tokens "
            "accepted"
        )
    return " · ".join(parts)


TEXT_POLL_S: Final = 0.05
"""How long one turn waits for the completion's next text."""


class _TextAndEvents:
    """The feed `generate` follows: the runtime's event stream and, whenever no event is ready,
    the completion's text, each item handed to `take` as it arrives (so the text streams as it
    is generated; `next` then returns None). After every wait for text the events that arrived
    meanwhile come first, then one quiet turn (None) on which `generate` asks whether it is over.
    The event stream ending is not the end of the command: it stops giving events, and the
    completion still decides."""

    def __init__(
        self, stream: LiveStream, completion: _Completion, take: Callable[[str, Any], None]
    ) -> None:
        self._stream = stream
        self._completion = completion
        self._take = take
        self._events_over = False
        self._waited = False

    def next(self, timeout_s: float) -> StreamItem | None:
        while True:
            item = self._ready_event()
            if item is not None:
                return item
            if self._waited:
                self._waited = False
                return None
            try:
                kind, payload = self._completion.queue.get(timeout=timeout_s)
            except Empty:
                pass
            else:
                self._take(kind, payload)
            self._waited = True

    def _ready_event(self) -> StreamItem | None:
        while not self._events_over:
            try:
                item = self._stream.next(0)
            except StreamEnded:
                self._events_over = True
                return None
            if item is not None:
                return item
            if self._stream.reader.queue.empty():
                return None
        return None


class _Run:
    """What `generate` has seen: the completion's items (`take`) and the request's events
    (`show`); `over` says when it has ended (the text ended, and the request's terminal event
    arrived or EVENTS_GRACE_S passed); `cancel` is Ctrl-C (the runtime cancels a request whose
    connection closes)."""

    def __init__(self, completion: _Completion, lifecycle: _Lifecycle, json_output: bool) -> None:
        self.completion = completion
        self.lifecycle = lifecycle
        self.json_output = json_output
        self.code = ExitCode.SUCCESS
        self.message = ""
        self.line_open = False
        self.text_done_at: float | None = None

    def take(self, kind: str, payload: Any) -> None:
        if kind == "request_id":
            for event in self.lifecycle.bind(str(payload)) if payload else ():
                if self.json_output:
                    emit_json(event_record(event))
            return
        if kind == "text":
            if self.json_output:
                emit_json(
                    {"schema_version": RECORD_SCHEMA_VERSION, "record": "output", "text": payload}
                )
            else:
                sys.stdout.write(payload)
                sys.stdout.flush()
                self.line_open = True
            return
        if kind == "error":
            reason = payload.get("reason_code")
            self.code = exit_code_for_text(reason)
            self.message = str(payload.get("message") or "generation failed")
            if self.json_output:
                emit_json(error_record("generate", self.code, self.message, reason))
        elif kind == "broken":
            self.code, self.message = ExitCode.RUNTIME_UNREACHABLE, str(payload)
        self.text_done_at = time.monotonic()
        self.end_text_line()

    def end_text_line(self) -> None:
        """People's text ends with a newline as soon as it ends: the summary on stderr (after
        the wait for the request's terminal event and receipt) always starts a line of its own."""
        if self.line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.line_open = False

    def show(self, item: StreamItem) -> None:
        if self.json_output:
            emit_json(event_record(item.event, item.sequence, item.cursor))

    def over(self, item: StreamItem | None) -> tuple[ExitCode, str] | None:
        if item is not None or self.text_done_at is None:
            return None
        if (
            self.lifecycle.terminal is not None
            or time.monotonic() - self.text_done_at > EVENTS_GRACE_S
        ):
            return self.code, self.message
        return None

    def cancel(self, _count: int) -> tuple[ExitCode, str]:
        self.completion.close()
        self.end_text_line()
        return ExitCode.CANCELLED, "cancelled"
