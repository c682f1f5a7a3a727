"""The lanes' KV in llama.cpp's memory: where ``engine/lanes.py``'s decisions are applied.

:class:`LaneKv` owns the context's memory handle and the :class:`~skippyctl.engine.lanes.LaneTable`
and keeps every ``lane.tokens`` an exact mirror of its KV sequence: a new request's prefix reuse
(a session's own tokens, or a whole-lane copy from a donor lane), clearing and trimming, the
session messages of those changes, and KV pressure (hysteresis, and eviction of idle sessions
with a unified KV). Decode thread only, like the core that holds it.

The memory API is ``llama_get_memory`` + ``llama_memory_seq_rm``/``_cp``/``_clear`` (the older
``llama_kv_self_*`` functions no longer exist in the bundled llama.cpp).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

from skippyctl.engine.lanes import (
    KvGeometry,
    Lane,
    LaneTable,
    PressureGauge,
    common_prefix,
)
from skippyctl.engine.protocol_messages import (
    EngineMessage,
    Kv,
    KvChange,
    SessionChange,
    SessionChanged,
)

COPY_MIN_GAIN_TOKENS: Final = 16
"""Copy another lane's KV into a new request's lane only when it saves at least this many
prefill tokens (more for long lanes, see ``LaneKv.__init__``)."""


class LaneKv:
    """Lanes and their KV sequences in one llama.cpp context (see the module docstring).

    Starts from an empty KV so ``lane.tokens`` mirrors it exactly.
    """

    def __init__(
        self,
        llama: ModuleType,
        context: Any,
        geometry: KvGeometry,
        *,
        lanes: int,
        pressure_high: float,
        pressure_low: float,
        emit: Callable[[EngineMessage], None],
    ) -> None:
        self._llama = llama
        self._memory = llama.llama_get_memory(context)
        if not self._memory:
            raise ValueError("the context has no memory (KV cache): cannot generate with it")
        self._emit = emit
        self.table = LaneTable(lanes)
        self.unified = geometry.unified
        self.tokens_per_lane = geometry.tokens_per_lane
        self.cells_total = geometry.cells_total
        # A copy moves a whole lane's KV stream (split KV) — about the cost of prefilling
        # 1/64 of the lane's cells on a CPU here —, so it must save more than that; with a
        # unified KV it only shares cells, which costs nothing.
        self._copied: list[Lane] = []
        """Lanes whose KV copy waits for the next llama_decode (``Lane.copy_pending``)."""
        self._copy_min_gain = (
            1 if geometry.unified else max(COPY_MIN_GAIN_TOKENS, geometry.tokens_per_lane // 64)
        )
        self._pressure = PressureGauge(self.cells_total, pressure_high, pressure_low)
        llama.llama_memory_clear(self._memory, False)

    def emit_session(
        self, lane: Lane, session: str, event: SessionChange, reason: str | None = None
    ) -> None:
        idle_ms = None
        if event is SessionChange.EVICTED and lane.last_used:
            idle_ms = round(max(0.0, time.monotonic() - lane.last_used) * 1000.0, 3)
        self._emit(SessionChanged(session, event, lane.seq, len(lane.tokens), reason, idle_ms))

    def reuse(self, lane: Lane, prompt: Sequence[int], keep: int) -> int:
        """Fit ``lane``'s KV to a new request's ``prompt``: keep the claimed ``keep`` tokens (or
        take a donor lane's longer prefix), drop the rest; how many prompt tokens it keeps."""
        donor = self.table.donor(lane, prompt, keep, self._copy_min_gain)
        if donor is not None:
            # Whole-lane copy (llama.cpp copies a split KV's stream only whole: p0/p1 = -1,
            # anything else aborts), done at the next llama_decode; the tail is trimmed below.
            self._llama.llama_memory_seq_cp(self._memory, donor.seq, lane.seq, -1, -1)
            lane.tokens = donor.tokens[:]
            lane.copy_pending = True
            self._copied.append(lane)
            keep = min(common_prefix(lane.tokens, prompt), len(prompt) - 1)
        if keep == 0:
            self.clear(lane)
        elif keep < len(lane.tokens):
            if not self._llama.llama_memory_seq_rm(self._memory, lane.seq, keep, -1):
                # Partial removal unsupported (e.g. recurrent memory): start over.
                self.clear(lane)
                keep = 0
            del lane.tokens[keep:]
        return keep

    def copies_done(self) -> None:
        """llama_decode ran: it performed the pending KV copies first."""
        if self._copied:
            for copied in self._copied:
                copied.copy_pending = False
            self._copied.clear()

    def trim(self, lane: Lane) -> None:
        """Drop the KV past ``lane.tokens`` (proposals decoded but not committed)."""
        self._llama.llama_memory_seq_rm(self._memory, lane.seq, len(lane.tokens), -1)

    def clear(self, lane: Lane) -> None:
        if lane.tokens:
            lane.tokens.clear()
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)

    def erase(self, lane: Lane) -> None:
        """Best effort: remove ``lane``'s whole KV sequence whatever ``lane.tokens`` says, so
        the other lanes keep being served whatever happens here."""
        with contextlib.suppress(Exception):
            self._llama.llama_memory_seq_rm(self._memory, lane.seq, -1, -1)

    def distrust(self, lane: Lane) -> None:
        """After an error ``lane``'s KV may hold part of a batch: empty it; a session keeps its
        lane with no tokens (``session`` trimmed, tokens 0)."""
        lane.tokens.clear()
        self.erase(lane)
        self._emit(Kv(KvChange.RESET, self.table.cells_used(), self.cells_total))
        if lane.session is not None:
            self.emit_session(lane, lane.session, SessionChange.TRIMMED)

    def release(self, lane: Lane) -> None:
        """A request left ``lane``: clear its KV unless a session keeps it warm (with a unified
        KV only a session's tokens are kept). Never raises."""
        # The KV the request filled is seen before it goes: a verified window can take a lane
        # from below the pressure mark to the request's last token within one step.
        with contextlib.suppress(Exception):  # the caller's terminal must still be sent
            self.check_pressure()
        if self.table.release(lane, time.monotonic()) or (self.unified and lane.session is None):
            try:
                self.clear(lane)
            except Exception:  # noqa: BLE001 - the caller's terminal must still be sent
                lane.tokens.clear()

    def drop(self, session: str, reason: str) -> None:
        lane = self.table.drop(session)
        if lane is None:
            return
        self.emit_session(lane, session, SessionChange.EVICTED, reason)
        if lane.request_id is None:
            self.clear(lane)
        # else: the running request finishes normally; its lane is cleared then (no session).
        self.check_pressure()

    def check_pressure(self) -> None:
        """Report a pressure crossing (hysteresis in :class:`PressureGauge`); with a unified KV a
        crossing first evicts idle sessions, which may clear it at once."""
        used = self.table.cells_used()
        change = self._pressure.observe(used)
        if change is None:
            return
        total = self.cells_total
        self._emit(Kv(change, used, total))
        if change is KvChange.PRESSURE_CROSSED and self.unified:
            used = self._relieve_pressure(used)
            cleared = self._pressure.observe(used)
            if cleared is not None:
                self._emit(Kv(cleared, used, total))

    def _relieve_pressure(self, used: int) -> int:
        """Unified KV only: idle warm sessions share the pool (and widen every attention window),
        so evict them least recently used first until usage is back at the low mark.

        With a split KV each lane has its own reserved cells and evicting frees nothing others
        can use, so warm sessions are kept.
        """
        for lane in self.table.idle_sessions_lru():
            if self._pressure.relieved(used):
                break
            used -= len(lane.tokens)
            session = self.table.evict(lane)
            self.emit_session(lane, session, SessionChange.EVICTED, "pressure")
            self.clear(lane)
        return used
