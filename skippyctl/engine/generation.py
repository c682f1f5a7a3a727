"""The generation core of an engine worker: continuous batching over the lanes of one context.

One llama.cpp context holds ``lanes`` sequences (seq id = lane index). A single decode thread
("skippy-decode") owns the context; other threads only talk to it through :meth:`submit`,
:meth:`cancel`, :meth:`drop_session` and :meth:`stop`, which append to an inbox and never block.
Only the decode thread touches llama.cpp contexts, batches and samplers.

This module is the engine's face and its thread: the entry points, the inbox and the decode
loop. The work of each step — batching, sampling, text, terminals — is ``engine/decode_core.py``
(its ``llama_batch`` is ``engine/batch.py``); which lane a request runs in and what of its KV it
keeps is decided by ``engine/lanes.py``; a request's phase, counters and deadline live in
``engine/request_state.py``; the messages it sends are the types of ``engine/protocol_messages.py``
(their meaning is documented there). With ``observations=False`` (the events-off benchmark baseline)
only ``GenText``, ``GenDone`` and the session state outcomes (``StateExported``/``StateImported``,
which the host needs to find the files again) go.

Session state files (``engine/kv_state.py``): :meth:`BatchEngine.restore_sessions` (queued before
:meth:`start`, so ahead of every request) and :meth:`BatchEngine.save_sessions` (at shutdown;
waits) run on the decode thread like everything else that touches the context.

Invariants (decode thread):

- ``lane.tokens`` mirrors the lane's KV exactly (``engine/lanes.py``).
- Every submitted request gets exactly one ``GenDone``, whatever happens: invalid request,
  prompt too long for a lane, cancel, deadline, an exception while handling it, a failed
  ``llama_decode`` or :meth:`stop`. An exception fails only the request(s) it concerns with
  ``internal_runtime_failure``; the thread carries on.
- Messages carry counts, durations and logical ids only; completion text travels only in
  ``GenText.text``. No prompt text, token ids or paths, ever (ARCHITECTURE.md section 4).

The KV geometry (split or unified, cells per lane) is ``engine/lanes.py``'s
:class:`~skippyctl.engine.lanes.KvGeometry`. Idle sessions are evicted for pressure only with a
unified KV: there they occupy the shared pool and widen every attention window; in a split KV
their cells are the lane's own anyway.

Link probes (a split model, ``links``): between iterations — after a step's messages were
queued, before the next ``llama_decode`` — the decode thread probes each stage link that is due
(``engine/links.py``: at most once per interval per stage), and an idle thread wakes for them;
the ``Link`` messages go out with the step's. A probe that raises is counted in
``link_probe_failures`` (the thread carries on); a stage that is gone aborts the process, as the
next decode would.

Performance: the ggml CPU backend here is built with OpenMP, whose team belongs to the calling
OS thread. Keep every ``llama_decode`` of the process on the decode thread: a second thread that
computes (a warm-up, another context) leaves a second spinning team behind, and on a machine with
few cores both then run several times slower.
"""

from __future__ import annotations

import collections
import ctypes
import re
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from skippyctl.config.stream_wire import SocketChunks
from skippyctl.engine.chat_template import ChatMessage
from skippyctl.engine.decode_core import DecodeCore
from skippyctl.engine.draft import DraftModel
from skippyctl.engine.links import LinkProber
from skippyctl.engine.protocol_messages import EngineMessage
from skippyctl.engine.request_state import GenerateRequest, Phase, RequestState, validation_error
from skippyctl.engine.sampling import SamplingParams
from skippyctl.engine.speculation import SPEC_OFF, ServingPlugins, SpecConfig
from skippyctl.events.envelope import StopReason
from skippyctl.events.reasons import GenerationOutcome, ReasonCode
from skippyctl.plugins.api import ActivationContext

__all__ = ["BatchEngine", "ChatMessage", "GenerateRequest", "SamplingParams"]

DECODE_THREAD_NAME: Final = "skippy-decode"
_SESSION_REASON = re.compile(r"[a-z][a-z0-9_]{0,31}")
_DEFAULT_DROP_REASON: Final = "dropped"


class BatchEngine:
    """Continuous-batching generation over ``lanes`` sequences of one llama.cpp context.

    ``emit`` receives protocol messages from the decode thread (and, only for requests submitted
    after :meth:`stop` has finished, from the submitting thread). ``emit`` should not raise; if it
    does, the message is counted in :attr:`emit_failures` and the engine carries on.

    The engine does not own ``model`` or ``context`` (the worker frees them after :meth:`stop`).
    It does own its ``llama_batch`` and sampler chains. Construction raises ``ValueError`` for a
    context it cannot serve (see :class:`~skippyctl.engine.decode_core.DecodeCore`).
    """

    def __init__(
        self,
        llama: ModuleType,
        model: int | ctypes.c_void_p,
        context: Any,
        *,
        lanes: int,
        emit: Callable[[EngineMessage], None],
        emit_many: Callable[[list[EngineMessage]], int] | None = None,
        prefill_chunk_tokens: int | None = None,
        kv_pressure_high: float = 0.85,
        kv_pressure_low: float = 0.70,
        approaching_limit: float = 0.90,
        n_threads: int | None = None,
        observations: bool = True,
        token_observations: bool = False,
        links: LinkProber | None = None,
        speculation: SpecConfig = SPEC_OFF,
        plugins: ServingPlugins | None = None,
        draft: DraftModel | None = None,
        chat_template: str | None = None,
        plugin_activation: ActivationContext | None = None,
    ) -> None:
        self._links = links if links is not None and links.stages else None
        self.link_probe_failures = 0
        self._emit = emit
        self._emit_many = emit_many
        self._outbox: list[EngineMessage] = []
        """Decode thread only: what the core emitted since the last flush (with emit_many)."""
        self._flush_failures = 0
        self._core = DecodeCore(
            llama,
            model,
            context,
            lanes=lanes,
            emit=emit if emit_many is None else self._outbox.append,
            released=self._released,
            prefill_chunk_tokens=prefill_chunk_tokens,
            kv_pressure_high=kv_pressure_high,
            kv_pressure_low=kv_pressure_low,
            approaching_limit=approaching_limit,
            n_threads=n_threads,
            observations=observations,
            token_observations=token_observations,
            speculation=speculation,
            plugins=plugins,
            draft=draft,
            chat_template=chat_template,
            plugin_activation=plugin_activation,
        )
        self._cond = threading.Condition(threading.Lock())
        self._inbox: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self._ids: set[str] = set()  # request ids without a gen_done yet (guarded by _cond)
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- public, any thread

    @property
    def lanes(self) -> int:
        return self._core.lanes

    def context_tokens_per_lane(self) -> int:
        """Most tokens (prompt + completion) one lane's sequence may hold; enforced per request."""
        return self._core.context_tokens_per_lane

    @property
    def kv_unified(self) -> bool:
        """Whether the context shares one KV buffer across sequences (``kv_unified``)."""
        return self._core.kv_unified

    @property
    def emit_failures(self) -> int:
        """Messages whose ``emit`` raised or that ``emit_many`` could not send (each was
        dropped; the engine carried on)."""
        return self._core.emit_failures + self._flush_failures

    @property
    def proposal_failures(self) -> int:
        """Proposals lost to a plugin link call that raised or a failed draft decode (the
        requests carried on without them)."""
        return self._core.proposal_failures

    def start(self) -> None:
        """Start the decode thread (once). Requests submitted before are served from then on."""
        with self._cond:
            if self._thread is not None or self._stopping:
                raise RuntimeError("the engine was already started or stopped")
            self._thread = threading.Thread(target=self._run, name=DECODE_THREAD_NAME, daemon=True)
            self._thread.start()

    def submit(self, request: GenerateRequest) -> None:
        """Prepare ``request`` on this thread (its chat rendered, its prompt tokenized:
        ``request_intake.py``) and queue it; never waits for the decode thread, never raises for
        a bad request.

        An invalid request (or a duplicate of an in-flight request id) is answered with
        ``GenDone`` failed/invalid_configuration. After :meth:`stop` every request is answered
        with ``GenDone`` cancelled.
        """
        submitted = time.monotonic()
        error = validation_error(request) if isinstance(request, GenerateRequest) else "type"
        if error is not None and not isinstance(request, GenerateRequest):
            return  # nothing to answer: there is no request id
        state = RequestState(request, submitted, error)
        if not self._closed:  # read unlocked: a request of a closing engine is only cancelled
            try:
                # Rendered and tokenized here, not on the decode thread (request_intake.py).
                self._core.prepare(state)
            except Exception:  # noqa: BLE001 - refused below, on the decode thread
                state.refusal = (ReasonCode.INTERNAL_RUNTIME_FAILURE, None)
        with self._cond:
            if error is None and request.request_id in self._ids:
                error = "duplicate request_id"
                state = RequestState(request, submitted, error)
            if self._closed:
                closed = True
            else:
                closed = False
                if error is None:
                    self._ids.add(request.request_id)
                self._inbox.append(("submit", state, None))
                self._cond.notify()
        if closed:
            if error is not None:
                message = state.done_message(
                    GenerationOutcome.FAILED, StopReason.ERROR, ReasonCode.INVALID_CONFIGURATION
                )
            else:
                message = state.done_message(GenerationOutcome.CANCELLED, StopReason.CANCELLED)
            self._send_now(message)

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request; takes effect before the next decode step."""
        with self._cond:
            if request_id in self._ids:
                self._inbox.append(("cancel", request_id, None))
                self._cond.notify()

    def attach_stream(self, request_id: str, chunks: SocketChunks) -> None:
        """Write ``request_id``'s held text and the rest of it to its client through ``chunks``
        (``DecodeCore.attach_stream``); ``chunks`` is closed if it cannot be. Never blocks."""
        with self._cond:
            if self._closed or request_id not in self._ids:
                closed = True
            else:
                closed = False
                self._inbox.append(("attach", request_id, chunks))
                self._cond.notify()
        if closed:
            chunks.close()

    def release_text(self, request_id: str) -> None:
        """Send ``request_id``'s held text and the rest of it to the host. Never blocks."""
        with self._cond:
            if request_id in self._ids:
                self._inbox.append(("release", request_id, None))
                self._cond.notify()

    def drop_session(self, session: str, reason: str = _DEFAULT_DROP_REASON) -> None:
        """Forget ``session`` and free its lane's KV (``session`` evicted with ``reason``).

        ``reason`` is echoed in the message when it is a short snake_case word (the host normally
        passes "dropped"); anything else becomes "dropped". A request of that session that is
        running keeps running; its lane is cleared when it ends.
        """
        if not isinstance(reason, str) or not _SESSION_REASON.fullmatch(reason):
            reason = _DEFAULT_DROP_REASON
        with self._cond:
            self._inbox.append(("drop", session, reason))
            self._cond.notify()

    def restore_sessions(
        self, files: list[tuple[str, str]], max_bytes: int, fingerprint: bytes
    ) -> None:
        """Read session state files back into lanes (``engine/kv_state.py``) on the decode
        thread, ahead of every request submitted after this call."""
        with self._cond:
            self._inbox.append(("restore", (files, max_bytes, fingerprint), None))
            self._cond.notify()

    def save_sessions(
        self,
        files: dict[str, str],
        budget_bytes: int,
        fingerprint: bytes,
        timeout_s: float,
        report_missing: bool = False,
    ) -> bool:
        """Write the named idle sessions' state files on the decode thread; waits until they are
        written (False when that took longer than ``timeout_s`` — 0: do not wait — or the
        thread is not running). ``report_missing``: see ``SessionFiles.export``."""
        written = threading.Event()
        with self._cond:
            if self._thread is None or self._stopping:
                return False
            work = (files, budget_bytes, fingerprint, report_missing)
            self._inbox.append(("save", work, written))
            self._cond.notify()
        return written.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every pending request with ``cancelled`` and join the decode thread. Idempotent."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is None:
            self._shutdown()  # never started: answer the inbox from this thread
        elif thread is not threading.current_thread():
            thread.join(timeout_s)

    # ---------------------------------------------------------------- decode thread

    def _released(self, r: RequestState) -> None:
        """Called by the core as ``r`` ends: its id may be submitted again."""
        with self._cond:
            if r.error is None:
                self._ids.discard(r.id)

    def _send_now(self, message: EngineMessage) -> None:
        """Off the decode thread (after stop): straight to ``emit``, never raising."""
        try:
            self._emit(message)
        except Exception:  # noqa: BLE001 - counted like the core's own emit failures
            self._flush_failures += 1

    def _flush(self) -> None:
        """Send what the last iteration emitted, in order, in one write (``emit_many``): one
        wake-up of the host per step instead of one per message, and no write between the
        step's samples."""
        if not self._outbox or self._emit_many is None:
            return
        messages = self._outbox[:]
        self._outbox.clear()
        try:
            self._flush_failures += self._emit_many(messages)
        except Exception:  # noqa: BLE001 - a broken consumer must not kill the decode thread
            self._flush_failures += len(messages)

    def _run(self) -> None:
        core = self._core
        try:
            core.announce()
            busy = False
            while not self._stopping:
                try:
                    busy = self._iterate()
                except Exception:  # noqa: BLE001 - the decode thread must outlive any bug
                    core.fail_running()  # not attributable to one request; keep serving
                    continue
                finally:
                    self._probe_links(busy)
                    self._flush()
                if not busy:
                    with self._cond:
                        while not self._inbox and not self._stopping:
                            wait = self._links_wait_s()
                            gather = core.gather_until
                            if gather is not None:
                                left = gather - time.monotonic()
                                wait = left if wait is None else min(wait, left)
                            if wait is not None and wait <= 0:
                                break  # a link probe is due, or the gathering is over
                            self._cond.wait(wait)
        finally:
            self._shutdown()

    def _links_wait_s(self) -> float | None:
        return None if self._links is None else self._links.seconds_until_due()

    def _probe_links(self, busy: bool) -> None:
        """The link probes that are due (decode thread, between ``llama_decode`` calls; less
        often while ``busy``)."""
        if self._links is None:
            return
        try:
            messages: list[EngineMessage] = list(self._links.probe_due(busy))
        except Exception:  # noqa: BLE001 - a failed probe must not stop the decode thread
            self.link_probe_failures += 1
            return
        for message in messages:
            if self._emit_many is not None:
                self._outbox.append(message)
            else:
                self._send_now(message)

    def _iterate(self) -> bool:
        """Inbox, then the core's work (deadlines, admission, one step); False when idle."""
        if self._inbox:
            self._drain_inbox()
        if self._stopping:
            return True
        return self._core.work()

    def _drain_inbox(self) -> None:
        with self._cond:
            items = list(self._inbox)
            self._inbox.clear()
        core = self._core
        for kind, first, second in items:
            # One item at a time: whatever one raises, the others drained with it are handled.
            try:
                if kind == "submit":
                    core.accept(first)
                elif kind == "cancel":
                    core.cancel(first)
                elif kind == "attach":
                    core.attach_stream(first, second)
                elif kind == "release":
                    core.release_text(first)
                elif kind == "restore":
                    core.session_files.restore(*first)
                elif kind == "save":
                    try:
                        core.session_files.export(*first)
                    finally:
                        self._flush()  # the outcomes go out before the waiting caller ends
                        second.set()
                else:
                    core.drop(first, second)
            except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
                if kind == "submit" and first.phase is not Phase.DONE:
                    core.fail(first)

    def _shutdown(self) -> None:
        """Answer everything still pending with ``cancelled``; free the batch. Runs once."""
        with self._cond:
            if self._closed:
                return
            self._stopping = True
        core = self._core
        while True:
            with self._cond:
                items = list(self._inbox)
                self._inbox.clear()
                if not items:
                    # From here on submit() answers by itself: nothing can slip in between.
                    self._closed = True
                    break
            for kind, first, second in items:
                if kind == "submit":
                    r = first
                    if r.error is not None:
                        core.refuse(r, ReasonCode.INVALID_CONFIGURATION)
                    else:
                        core.track(r)
                elif kind == "attach":
                    second.close()
        core.cancel_all()
        self._flush()
