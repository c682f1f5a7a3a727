"""Generation requests as the host sees them: validated parameters and the stream handle.

A request's text travels only in its own stream (to the caller), never in an event. The
`RequestHandle` is the bridge between the engine reader thread (which produces chunks) and the
caller (an asyncio API handler or a blocking CLI): `deliver` is thread-safe and never blocks.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from skippyctl.engine.chat_template import ChatMessage, ToolCall
from skippyctl.engine.protocol_commands import Generate, Sampling
from skippyctl.engine.protocol_messages import (
    EmbeddingAnswer,
    TokenLogprob,
    TopLogprob,
    VocabularyAnswer,
)
from skippyctl.events.envelope import LogicalId
from skippyctl.events.figures import NO_FIGURES, GenerationFigures
from skippyctl.events.reasons import ReasonCode

__all__ = [
    "ChatMessage",  # the chat's shape, for the API (which may not import the engine)
    "EmbeddingAnswer",  # an embeddings answer, for the API likewise
    "Chunk",
    "Finished",
    "GenerationParams",
    "InvalidRequest",
    "RequestHandle",
    "StreamOffer",
    "TextChunk",
    "TextSink",
    "TokenLogprob",  # a token's log-probabilities, for the API likewise
    "ToolCall",
    "TopLogprob",
    "VocabularyAnswer",  # a tokenize/detokenize answer, for the API likewise
]


class InvalidRequest(ValueError):
    """A request parameter is out of range; the message says which (OpenAI-style 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class GenerationParams:
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    max_tokens: int = 128
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    # -- sampling: penalties and constrained output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    grammar: str | None = None
    """A GBNF grammar the reply must match (request text: never in an event)."""
    json_schema: str | None = None
    """A JSON schema (JSON text) the reply must satisfy; the engine makes its grammar."""
    json_schema_tags: tuple[str, str] | None = None
    """Literal text before and after that JSON (a forced Hermes tool call's tags)."""
    logprobs: int | None = None
    """Each token's log-probability with this many top candidates (0..20); None: off."""
    # -- end sampling
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop: tuple[str, ...] = ()
    timeout_s: float | None = None
    keep_alive_s: float | None = None
    """How long the model stays loaded once idle after this request (seconds; -1: forever, 0:
    unload as soon as it is idle); None: the model's TTL. Host-only: not sent to the engine."""
    # -- chat template inputs (jinja): request text, never in an event
    tools: tuple[dict[str, Any], ...] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # -- end chat template inputs

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("prompt", "exactly one of prompt or messages is required")
        if not 1 <= self.max_tokens <= 1_000_000:
            raise InvalidRequest("max_tokens", "max_tokens must be between 1 and 1000000")
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidRequest("temperature", "temperature must be between 0 and 5")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest("top_p", "top_p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequest("min_p", "min_p must be in [0, 1]")
        if self.top_k < 0:
            raise InvalidRequest("top_k", "top_k must not be negative")
        if not 0.0 < self.repeat_penalty <= 10.0:
            raise InvalidRequest("repeat_penalty", "repeat_penalty must be in (0, 10]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequest(name, f"{name} must be between -2 and 2")
        if not 0 <= self.repeat_last_n <= 1_000_000:
            raise InvalidRequest("repeat_last_n", "repeat_last_n must be between 0 and 1000000")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequest("top_logprobs", "top_logprobs must be between 0 and 20")
        if self.grammar is not None and self.json_schema is not None:
            raise InvalidRequest("grammar", "give either grammar or a JSON response_format")
        if len(self.stop) > 8 or any(not s or len(s) > 256 for s in self.stop):
            raise InvalidRequest("stop", "at most 8 non-empty stop strings of up to 256 characters")
        if self.timeout_s is not None and not 0 < self.timeout_s <= 86_400:
            raise InvalidRequest("timeout", "timeout must be positive seconds (at most a day)")
        if self.keep_alive_s is not None and not (
            self.keep_alive_s == -1 or 0 <= self.keep_alive_s <= 86_400
        ):
            raise InvalidRequest(
                "keep_alive", "keep_alive must be -1 (forever) or 0 to 86400 seconds"
            )

    @property
    def constraint(self) -> str | None:
        """What constrains the reply: ``grammar``, ``json_schema`` or None (receipts say it)."""
        if self.grammar is not None:
            return "grammar"
        return "json_schema" if self.json_schema is not None else None

    def engine_command(
        self, request_id: LogicalId, session: LogicalId | None, timeout_s: float | None
    ) -> Generate:
        """This request as the engine's command; ``timeout_s`` is what is left of its deadline
        when it is sent (the engine keeps it from receipt)."""
        return Generate(
            request_id=str(request_id),
            prompt=self.prompt,
            messages=self.messages,
            tools=self.tools,
            chat_template_kwargs=self.chat_template_kwargs,
            session=None if session is None else str(session),
            max_tokens=self.max_tokens,
            stop=self.stop,
            sampling=Sampling(
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                min_p=self.min_p,
                repeat_penalty=self.repeat_penalty,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                repeat_last_n=self.repeat_last_n,
                grammar=self.grammar,
                json_schema=self.json_schema,
                json_schema_tags=self.json_schema_tags,
                logprobs=self.logprobs,
                seed=self.seed,
                logit_bias=self.logit_bias,
            ),
            timeout_s=timeout_s,
        )


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    """The log-probabilities of the tokens of ``text`` (requests that asked for them)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The one terminal of a request."""

    outcome: str
    """A :class:`~skippyctl.events.reasons.GenerationOutcome` value, or ``rejected`` (refused
    before it reached a lane)."""
    reason: ReasonCode | None
    stop_reason: str | None
    figures: GenerationFigures = NO_FIGURES
    """The engine's figures when the engine ended the request (its ``GenDone.figures``,
    unchanged); :data:`~skippyctl.events.figures.NO_FIGURES` on every path the host ended."""
    spec_mode: str = "off"
    """How the model's engine speculates (its load's ``speculation``) when the engine ended the
    request; ``off`` on the paths the host ended (whose figures are all 0)."""
    detail: str | None = None
    """Why the engine refused a chat (its template's message), for the requester only."""
    written_by: str = "host"
    """``engine`` when the engine wrote the streamed text to the client's connection itself
    (its ``GenDone.wrote_stream``); ``host`` otherwise."""


Chunk = TextChunk | Finished


class TextSink(Protocol):
    """Where a request's plain text goes straight from the engine reader thread, instead of
    through the caller's queue (:meth:`RequestHandle.attach_sink`)."""

    def write(self, text: str) -> bool:
        """Take `text` (never blocking); False when the sink can take nothing more (the chunk
        then goes through the queue, and so does everything after it)."""
        ...

    def close(self) -> None:
        """Release what the sink holds (idempotent); called under the handle's lock when the
        sink is detached: it refused a chunk, a chunk carries log-probabilities, or the
        terminal is about to be delivered."""
        ...


class StreamOffer:
    """A client connection the engine may write a request's plain text to itself (the API
    makes it, the model server hands it to the engine: ``AttachStream``). It owns a
    descriptor of the connection's socket until :meth:`close`; `head` and `tail` are the SSE
    event around a chunk's text; `write_rest` writes bytes to the connection in order with the
    caller's own writes (call it on the caller's loop)."""

    __slots__ = ("_fd", "_lock", "head", "tail", "write_rest")

    def __init__(
        self, fd: int, head: bytes, tail: bytes, write_rest: Callable[[bytes], None]
    ) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()
        self.head = head
        self.tail = tail
        self.write_rest = write_rest

    @property
    def fd(self) -> int | None:
        return self._fd

    def close(self) -> None:
        """Release the descriptor (idempotent; the engine keeps its own if it was handed)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@dataclass(slots=True)
class RequestHandle:
    """One request's stream. Exactly one `Finished` is delivered, always last."""

    request_id: LogicalId
    model_id: LogicalId
    session_id: LogicalId | None
    params: GenerationParams
    received_mono_ns: int
    loop: asyncio.AbstractEventLoop | None = None
    _async_queue: asyncio.Queue[Chunk] | None = None
    _sync_queue: queue.SimpleQueue[Chunk] = field(default_factory=queue.SimpleQueue)
    _finished: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    admitted_mono_ns: int | None = None
    finished: Finished | None = None
    on_finished: Callable[[RequestHandle, Finished], None] | None = None
    """Called once with the terminal, before the caller can see it (the scheduler records the
    request's receipt, so whoever read the terminal finds the receipt)."""

    _sink: TextSink | None = None
    _queued: int = 0
    """Chunks handed to the caller's queue (`deliver`) ..."""
    _taken: int = 0
    """... and taken from it (`next_chunk`): equal when none is in flight."""
    hold_text: bool = False
    """The engine holds the request's text until told who writes the stream
    (:meth:`resolve_stream`): set by the caller before the request is enqueued."""
    _resolved: bool = False
    _resolution_taken: bool = False
    _offer: StreamOffer | None = None
    prefilling: bool = False
    """Between its ``prefill_started`` and ``prefill_completed``: a request that ends meanwhile
    gives its prefill a terminal too (``observations.prefill_ended``)."""
    engine_stream: bool = False
    """The engine may be writing this request's text to the client's connection: set when the
    offer was handed to it, cleared when the engine has let go of it (its ``GenDone``, or its
    exit). While set, nobody else may write to the connection."""

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._async_queue = asyncio.Queue()

    def attach_sink(self, sink: TextSink) -> bool:
        """From now on, plain text chunks (no log-probabilities) go to `sink` on the thread that
        delivers them, so the caller's thread does nothing per token. Attached only while no
        chunk is in flight to the caller (the sink's writes must follow everything the caller
        wrote) and before the terminal; False otherwise (the caller may try again later, and
        keeps ownership of `sink`). The sink is closed before the terminal is delivered."""
        with self._lock:
            if self._finished or self._sink is not None or self._queued != self._taken:
                return False
            self._sink = sink
            return True

    def resolve_stream(self, offer: StreamOffer | None) -> bool:
        """Say who writes a stream whose engine holds its text (`hold_text`): the engine, through
        `offer`, or the host (None). Once; the model server tells the engine
        (:meth:`take_resolution`). False if it was said already or the text is not held, or,
        with an offer, if a chunk is in flight to the caller or a sink writes the text (the
        caller then keeps `offer`)."""
        with self._lock:
            if not self.hold_text or self._resolved:
                return False
            if offer is not None and (
                self._finished or self._sink is not None or self._queued != self._taken
            ):
                return False
            self._resolved = True
            self._offer = offer
            return True

    def take_resolution(self) -> tuple[StreamOffer | None] | None:
        """Who writes the stream, for the engine, once it was said and not yet taken (called
        under the model server's lock, after the request's ``Generate``); None otherwise."""
        with self._lock:
            if not self._resolved or self._resolution_taken or self._finished:
                return None
            self._resolution_taken = True
            return (self._offer,)

    def deliver_framed(self, data: bytes) -> None:
        """Bytes the engine wrote in part to the client's connection: the rest goes out through
        the offer's writer, in order with the chunks delivered after it. Thread-safe."""
        with self._lock:
            offer = self._offer
            if self._finished or offer is None or self.loop is None:
                return
            self.loop.call_soon_threadsafe(offer.write_rest, data)

    def deliver(self, chunk: Chunk) -> bool:
        """Thread-safe. False (and dropped) after the terminal was delivered."""
        with self._lock:
            if self._finished:
                return False
            sink = self._sink
            if isinstance(chunk, Finished):
                self._finished = True
                self.finished = chunk
                if sink is not None:
                    self._sink = None
                    sink.close()
                if self._offer is not None:
                    self._offer.close()
            elif sink is not None:
                if chunk.logprobs is None and sink.write(chunk.text):
                    return True
                self._sink = None
                sink.close()
            self._queued += 1
        if isinstance(chunk, Finished) and self.on_finished is not None:
            self.on_finished(self, chunk)
        if self.loop is not None and self._async_queue is not None:
            try:
                self.loop.call_soon_threadsafe(self._async_queue.put_nowait, chunk)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                return False
        else:
            self._sync_queue.put(chunk)
        return True

    @property
    def done(self) -> bool:
        return self._finished

    async def next_chunk(self) -> Chunk:
        assert self._async_queue is not None, "bind_loop first"
        chunk = await self._async_queue.get()
        # Only the caller's thread takes chunks and attaches sinks: it reads its own count.
        self._taken += 1
        return chunk

    def next_chunk_blocking(self, timeout_s: float | None = None) -> Chunk | None:
        try:
            return self._sync_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
