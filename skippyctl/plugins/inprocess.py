"""A trusted plugin in the engine process: the engine's serving-plugin calls made directly, on
the calling thread, on one :class:`~skippyctl.plugins.api.Plugin` object.

:class:`InProcessPlugin` gives the decode thread the same seven calls as
:class:`~skippyctl.plugins.link.PluginLink` — ``begin``, ``commit``, ``propose``, ``late``,
``outcome``, ``finish``, ``abort`` (the engine's ``ServingPlugins`` protocol) — without a
sidecar, a queue or a deadline: it is for built-in code (``--spec ngram`` runs
:class:`~skippyctl.plugins.builtin.ngram.NgramPlugin` through it), whose crash would be the
engine's own bug anyway, and a direct call costs microseconds where a sidecar round trip costs
tens of them.

It keeps the plugin contract (``skippyctl.plugins.api``) all the same:

- each commit is delivered as it is called, so the committed stream is contiguous and complete:
  every run starts where the last one ended, a query's ``pending`` run is always empty and a
  finish's suffix too;
- requests and sessions reach the plugin as opaque integers (a counter each), never the
  engine's ids; the session map is bounded (:data:`MAX_SESSIONS`, least recently used evicted
  and counted in :attr:`InProcessPlugin.sessions_evicted`: an evicted session that comes back
  gets a new id);
- :meth:`InProcessPlugin.activate` hands the plugin its :class:`ActivationContext` once, first
  (a plugin without ``activate`` is not asked);
- an answer is validated like a sidecar's: a list of at most the capacity, every id in
  ``0 <= id < n_vocab``; anything else is discarded and counted by reason
  (:attr:`InProcessPlugin.discards`), never a failure;
- outcomes carry their kind (``full_accept``, ``first_mismatch``, ``stopped``, ``discarded``)
  to ``proposal_outcome`` when the plugin has it, else verified windows to ``outcome``;
- a call that raises is counted in :attr:`InProcessPlugin.failures` and never raises out of
  here; the request it concerned is over for the plugin (it gets an abort, ``error``), so the
  plugin never sees a stream with a hole;
- finish or abort is the last call for a request.

Decode thread only: no locks.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import GenerationFigures
from skippyctl.plugins.api import (
    ABORT_REASON_CODES,
    AbortReasonCode,
    ActivationContext,
    DiscardReason,
    OutcomeKind,
    Plugin,
    PluginReceipt,
    ProposalOutcome,
    ProposalQuery,
    RequestIds,
    plugin_stop_reason,
)

__all__ = ["MAX_SESSIONS", "NO_DEADLINE_NS", "InProcessPlugin"]

MAX_SESSIONS: Final = 4096
"""Sessions whose opaque id the adapter remembers (least recently used beyond it forgotten)."""

NO_DEADLINE_NS: Final = (1 << 63) - 1
"""A query's ``deadline_mono_ns`` in the engine process: the call is synchronous, so nothing
is ever late."""
_NOBODY_LATE: Final[frozenset[str]] = frozenset()


@dataclass(slots=True)
class _Stream:
    ids: RequestIds
    handed: int = 0
    """Committed tokens given to the plugin: the next run starts here."""


class InProcessPlugin:
    """One plugin behind the engine's serving-plugin calls, in this process (module docstring)."""

    def __init__(self, plugin: Plugin, n_vocab: int, max_sessions: int = MAX_SESSIONS) -> None:
        if n_vocab < 1 or max_sessions < 1:
            raise ValueError("n_vocab and max_sessions must be >= 1")
        self._plugin = plugin
        self._n_vocab = n_vocab
        self._streams: dict[str, _Stream] = {}
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._max_sessions = max_sessions
        self._next_session = 1
        self._next_request = 1
        self.failures = 0
        """Calls into the plugin that raised (the contract's failures)."""
        self.discards: dict[DiscardReason, int] = dict.fromkeys(DiscardReason, 0)
        """Answers discarded unverified, by reason (never failures)."""
        self.sessions_evicted = 0
        """Sessions forgotten to keep the map at ``max_sessions``."""

    def activate(self, context: ActivationContext) -> bool:
        """The plugin's activation (once, before any request); False when it raised (counted
        a failure: the caller serves without the plugin)."""
        activate = getattr(self._plugin, "activate", None)
        if activate is None:
            return True
        try:
            activate(context)
        except Exception:  # noqa: BLE001 - counted; the caller leaves the plugin out
            self.failures += 1
            return False
        return True

    def _session_id(self, session: str) -> int:
        sessions = self._sessions
        sid = sessions.get(session)
        if sid is not None:
            sessions.move_to_end(session)
            return sid
        sid = sessions[session] = self._next_session
        self._next_session += 1
        if len(sessions) > self._max_sessions:
            sessions.popitem(last=False)
            self.sessions_evicted += 1
        return sid

    def sessions(self) -> int:
        """Sessions whose id is remembered (at most ``max_sessions``)."""
        return len(self._sessions)

    def _failed(self, request: str) -> None:
        """A call about ``request`` raised: count it and end the request for the plugin."""
        self.failures += 1
        stream = self._streams.pop(request, None)
        if stream is not None:
            # Counted once, with the call that failed.
            with contextlib.suppress(Exception):
                self._plugin.abort(stream.ids, AbortReasonCode.ERROR)

    def begin(self, request: str, session: str | None, prompt: Sequence[int], reused: int) -> None:
        if request in self._streams:
            return
        ids = RequestIds(self._next_request, None if session is None else self._session_id(session))
        self._next_request += 1
        try:
            self._plugin.begin(ids, tuple(prompt), max(0, reused))
        except Exception:  # noqa: BLE001 - the plugin never hears of this request again
            self.failures += 1
            return
        self._streams[request] = _Stream(ids)

    def ids(self, request: str) -> RequestIds | None:
        """The ids the plugin knows ``request`` by; None before its begin or after its end."""
        stream = self._streams.get(request)
        return None if stream is None else stream.ids

    def commit(self, request: str, tokens: Sequence[int]) -> None:
        stream = self._streams.get(request)
        if stream is None or not tokens:
            return
        start = stream.handed
        stream.handed += len(tokens)
        try:
            self._plugin.commit(stream.ids, start, tuple(tokens))
        except Exception:  # noqa: BLE001 - counted; the request is over for the plugin
            self._failed(request)

    def propose(self, wants: Mapping[str, int]) -> dict[str, list[int]]:
        """Request id → capacity; returns request id → the plugin's valid proposals (requests
        it had nothing for are absent)."""
        proposals: dict[str, list[int]] = {}
        plugin = self._plugin
        for request, capacity in wants.items():
            stream = self._streams.get(request)
            if stream is None or capacity <= 0:
                continue
            query = ProposalQuery(stream.ids, capacity, NO_DEADLINE_NS, stream.handed, ())
            try:
                answer = plugin.propose(query)
            except Exception:  # noqa: BLE001 - counted; the other requests still get theirs
                self._failed(request)
                continue
            if not answer:
                continue
            invalid = self._invalid(answer, capacity)
            if invalid is not None:  # not tokens of this model: never verified
                self._discard(request, invalid, len(answer) if isinstance(answer, list) else 0)
                continue
            proposals[request] = answer
        return proposals

    def _invalid(self, answer: object, capacity: int) -> DiscardReason | None:
        """Why ``answer`` is not at most ``capacity`` ids of this model's vocabulary (one
        outside it would make llama.cpp abort the engine), or None. Checked with ``min``/``max``
        in C, not per token in Python: this runs every step, and the plugin is trusted code, so
        a wrong type is its bug."""
        if not isinstance(answer, list) or len(answer) > capacity:
            return DiscardReason.INVALID_TOKEN_COUNT
        try:
            valid = bool(min(answer) >= 0 and max(answer) < self._n_vocab)
        except TypeError:  # ids that do not compare with ints
            valid = False
        return None if valid else DiscardReason.INVALID_TOKEN_ID

    def _discard(self, request: str, reason: DiscardReason, proposed: int) -> None:
        """Count a discard and tell the plugin (an outcome of kind ``discarded``)."""
        self.discards[reason] += 1
        self._tell(request, ProposalOutcome(OutcomeKind.DISCARDED, proposed, 0, reason))

    def late(self) -> frozenset[str]:
        """Nobody: the plugin answers before :meth:`propose` returns."""
        return _NOBODY_LATE

    def outcome(
        self,
        request: str,
        proposed: int,
        accepted: int,
        kind: OutcomeKind,
        reason: DiscardReason | None = None,
    ) -> None:
        proposed, accepted = max(0, proposed), max(0, accepted)
        if kind is OutcomeKind.DISCARDED:
            reason = reason or DiscardReason.EXECUTION_FAILED
            self._discard(request, reason, proposed)
            return
        self._tell(request, ProposalOutcome(kind, proposed, accepted))

    def _tell(self, request: str, outcome: ProposalOutcome) -> None:
        stream = self._streams.get(request)
        if stream is None:
            return
        plugin = self._plugin
        full = getattr(plugin, "proposal_outcome", None)
        try:
            if full is not None:
                full(stream.ids, outcome)
            elif outcome.kind is not OutcomeKind.DISCARDED:
                plugin.outcome(stream.ids, outcome.proposed, outcome.accepted, outcome.rejected)
        except Exception:  # noqa: BLE001 - counted; the request is over for the plugin
            self._failed(request)

    def finish(self, request: str, stop_reason: StopReason, figures: GenerationFigures) -> None:
        """The request completed: an empty suffix (every commit was delivered) and its
        receipt, made of its stop reason and figures."""
        stream = self._streams.pop(request, None)
        if stream is None:
            return
        receipt = PluginReceipt.of(plugin_stop_reason(stop_reason), figures)
        try:
            self._plugin.finish(stream.ids, stream.handed, (), receipt)
        except Exception:  # noqa: BLE001 - counted; finish was the last call anyway
            self.failures += 1

    def abort(self, request: str, reason: str) -> None:
        stream = self._streams.pop(request, None)
        if stream is None:
            return
        try:
            self._plugin.abort(stream.ids, ABORT_REASON_CODES.get(reason, AbortReasonCode.UNKNOWN))
        except Exception:  # noqa: BLE001 - counted; abort was the last call anyway
            self.failures += 1

    def requests(self) -> int:
        """Requests begun and not yet finished or aborted."""
        return len(self._streams)

    def close(self) -> None:
        """Abort what is still in flight (``shutdown``), then close the plugin. Idempotent."""
        for request in list(self._streams):
            self.abort(request, "shutdown")
        try:
            self._plugin.close()
        except Exception:  # noqa: BLE001 - closing cannot fail anything that is still running
            self.failures += 1
