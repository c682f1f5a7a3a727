"""Session state files, the decode thread's side: idle sessions' KV written out, read back.

:meth:`SessionFiles.export` writes idle sessions' KV sequences (``llama_state_seq_get_data``) and
:meth:`SessionFiles.restore` reads them back into free lanes (``llama_state_seq_set_data``;
llama.cpp refuses another lane count: one KV stream per lane) — the file format and its checks
are ``engine/kv_state.py``; the host only names the files (``runtime/session_state.py``). One
``StateExported`` / ``StateImported`` per named session, whatever happens to it.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from skippyctl.engine import kv_state
from skippyctl.engine.lane_kv import LaneKv
from skippyctl.engine.protocol_messages import (
    EngineMessage,
    SessionChange,
    StateExported,
    StateImported,
)
from skippyctl.events.reasons import ReasonCode


class SessionFiles:
    """Export and restore of one context's session KV state (see the module docstring)."""

    def __init__(
        self,
        llama: ModuleType,
        context: Any,
        kv: LaneKv,
        *,
        n_vocab: int,
        emit: Callable[[EngineMessage], None],
    ) -> None:
        self._llama = llama
        self._ctx = context
        self._kv = kv
        self._n_vocab = n_vocab
        self._emit = emit

    def _geometry(self) -> kv_state.Geometry:
        return kv_state.Geometry(len(self._kv.table), self._kv.tokens_per_lane)

    def export(
        self,
        files: Mapping[str, str],
        budget_bytes: int,
        fingerprint: bytes,
        report_missing: bool = False,
    ) -> None:
        """Write the KV state of each idle session named in ``files`` (session → path), most
        recently used first, while the files fit in ``budget_bytes``; one ``StateExported``
        each. A session over the budget is not written (``reservation_exhausted``). With
        ``report_missing`` a named session without an idle lane holding KV gets a failed one
        (``invalid_configuration``); else it is left out (an unload names every session)."""
        llama = self._llama
        lanes = self._kv.table
        left = budget_bytes
        if report_missing:
            idle = {lane.session for lane in lanes.idle_sessions_mru()}
            for named in files:
                if named not in idle:
                    self._exported(
                        named, time.perf_counter(), 0, 0, ReasonCode.INVALID_CONFIGURATION
                    )
        for lane in lanes.idle_sessions_mru():
            session = lane.session
            if session is None or session not in files or lane.copy_pending:
                continue
            started = time.perf_counter()
            tokens = len(lane.tokens)
            size = int(llama.llama_state_seq_get_size(self._ctx, lane.seq))
            estimate = kv_state.file_bytes(tokens, size)
            if size <= 0:
                self._exported(session, started, tokens, 0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                continue
            if estimate > left:
                self._exported(session, started, tokens, estimate, ReasonCode.RESERVATION_EXHAUSTED)
                continue
            buffer = (ctypes.c_uint8 * size)()
            got = int(llama.llama_state_seq_get_data(self._ctx, buffer, size, lane.seq))
            if got <= 0 or got > size:
                self._exported(session, started, tokens, 0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                continue
            try:
                written = kv_state.write_state(
                    files[session],
                    fingerprint,
                    self._geometry(),
                    lane.tokens,
                    memoryview(buffer)[:got],
                )
            except OSError:
                self._exported(session, started, tokens, 0, ReasonCode.ARTIFACT_IO_FAILURE)
                continue
            left -= written
            self._exported(session, started, tokens, written, None)

    def _exported(
        self, session: str, started: float, tokens: int, size: int, reason: ReasonCode | None
    ) -> None:
        ms = round((time.perf_counter() - started) * 1000.0, 3)
        self._emit(StateExported(session, reason is None, tokens, size, ms, reason))

    def restore(self, files: Sequence[tuple[str, str]], max_bytes: int, fingerprint: bytes) -> None:
        """Read each ``(session, path)`` back into a free lane (before any request): the
        session's next request reuses its tokens like any warm session's. One
        ``StateImported`` each, and ``session`` restored for each that worked; a refused file
        leaves its lane empty (that session just prefills again)."""
        llama = self._llama
        kv = self._kv
        lanes = kv.table
        geometry = self._geometry()
        for session, path in files:
            started = time.perf_counter()
            if lanes.has_session(session):
                continue  # named twice: the first one won
            lane = lanes.restore_lane()
            if lane is None:
                self._imported(session, started, 0, 0, ReasonCode.RESERVATION_EXHAUSTED)
                continue
            try:
                saved = kv_state.read_state(path, fingerprint, kv.tokens_per_lane, max_bytes)
            except kv_state.StateRefused as refused:
                self._imported(session, started, 0, 0, refused.reason)
                continue
            size = kv_state.file_bytes(len(saved.tokens), len(saved.state))
            if saved.geometry.lanes != geometry.lanes or any(
                t < 0 or t >= self._n_vocab for t in saved.tokens
            ):
                # Another lane layout (llama.cpp keeps one KV stream per lane) or another
                # vocabulary: not this context's state.
                self._imported(
                    session, started, 0, size, ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                )
                continue
            state = (ctypes.c_uint8 * len(saved.state)).from_buffer_copy(saved.state)
            read = int(llama.llama_state_seq_set_data(self._ctx, state, len(saved.state), lane.seq))
            if read != len(saved.state):
                kv.erase(lane)
                self._imported(
                    session, started, 0, size, ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
                )
                continue
            lanes.bind_restored(lane, session, saved.tokens, time.monotonic())
            self._imported(session, started, len(saved.tokens), size, None)
            kv.emit_session(lane, session, SessionChange.RESTORED)
        kv.check_pressure()

    def _imported(
        self, session: str, started: float, tokens: int, size: int, reason: ReasonCode | None
    ) -> None:
        ms = round((time.perf_counter() - started) * 1000.0, 3)
        self._emit(StateImported(session, reason is None, tokens, size, ms, reason))
