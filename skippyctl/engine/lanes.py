"""Lanes and KV reuse: which sequence of the context a request runs in, and what it keeps.

Pure Python, no llama.cpp: this module decides, the batch engine (``engine/lane_kv.py``)
applies the decisions to the KV (``llama_memory_seq_rm``) and reports them. Decode thread only.

Invariants the engine keeps with these decisions:

- ``lane.tokens`` is exactly the token sequence stored in that lane's KV (positions
  ``0..len-1``). A lane keeps its KV when its request ends, with or without a session (as
  llama-server's slots keep their prompt cache): the next request in it, of any session or none,
  reuses the longest common token prefix of that KV and its prompt, and prefills only the rest
  (at least the last prompt token, to get its logits). A shared system prompt or a session's own
  history is then prefilled once. Only a dropped session's KV is cleared (``drop``: expired,
  evicted by the host), also when its lane was busy at the time (cleared at release); with a
  unified KV, where every cell kept widens every lane's attention, a lane without a session is
  cleared at release too.
- A lane runs at most one request. A session lives in at most one lane.
- A request of a session waits for its own lane while that lane is busy; a request that needs a
  lane takes the idle lane without a session whose KV shares the longest prefix with its prompt
  (the least recently used among equals), else displaces the least recently used idle session
  (``lane_needed``), whose KV it may reuse as far as it matches. When another lane's KV shares a
  clearly longer prefix with the prompt (``donor``), that KV is copied into the lane first.
- KV pressure has hysteresis: crossed at ``used >= high * total``, cleared at
  ``used <= low * total``, never flapping in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skippyctl.engine.protocol_messages import KvChange, SessionChange
from skippyctl.events.reasons import CacheResult


@dataclass(frozen=True, slots=True)
class KvGeometry:
    """How many KV cells a context's lanes can use.

    llama.cpp as bundled with llama-cpp-python 0.3.36: ``llama_context_params.kv_unified``
    defaults to false. Then every sequence gets its own KV stream of ``n_ctx_seq`` cells, where
    ``n_ctx_seq = pad256(pad256(n_ctx) / n_seq_max)`` and ``n_ctx`` becomes
    ``n_ctx_seq * n_seq_max`` (``llama_n_ctx_seq`` reports it); sequences beyond ``lanes`` are
    unusable, so they do not count. With ``kv_unified`` all sequences share one buffer of
    ``n_ctx`` cells and ``llama_n_ctx_seq == llama_n_ctx``; each lane is then held to an equal
    share so one long generation cannot make another's decode fail for want of cells.
    """

    unified: bool
    tokens_per_lane: int
    """Most tokens (prompt + completion) one lane's sequence may hold."""
    cells_total: int
    """The cells the lanes can use (what KV pressure is measured against)."""

    @classmethod
    def of(cls, *, n_ctx: int, n_ctx_seq: int, n_seq_max: int, lanes: int) -> KvGeometry:
        if n_seq_max > 1 and n_ctx_seq >= n_ctx:
            return cls(True, n_ctx // lanes, n_ctx)
        return cls(False, n_ctx_seq, n_ctx_seq * lanes)


class Lane:
    """One sequence of the context (seq id = index)."""

    __slots__ = (
        "clear_on_release",
        "copy_pending",
        "last_used",
        "request_id",
        "seq",
        "session",
        "tokens",
    )

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.session: str | None = None
        self.request_id: str | None = None
        """The request running in this lane, if any."""
        self.last_used = 0.0
        self.clear_on_release = False
        """The lane's session was dropped while a request ran in it: clear its KV at release."""
        self.copy_pending = False
        """Another lane's KV is being copied into this one (done at the next llama_decode): it
        must not be copied from before then."""


@dataclass(frozen=True, slots=True)
class Pick:
    lane: Lane
    displaced: str | None = None
    """A warm idle session this pick took the lane from (unbound already): the caller reports
    it evicted (``lane_needed``) with the lane's tokens; its KV stays for the claim to reuse
    what matches."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request bound to a lane keeps of the lane's KV."""

    keep: int
    """Tokens of the lane's KV to keep (the common prefix with the prompt, whoever left them);
    the caller trims the KV beyond them."""
    change: SessionChange | None
    """``created`` (the session is new to this lane), ``reused`` or ``trimmed`` (its cached
    tokens go beyond the common prefix); None for a request without a session."""


def common_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens ``cached`` and ``prompt`` share."""
    limit = min(len(cached), len(prompt))
    common = 0
    while common < limit and cached[common] == prompt[common]:
        common += 1
    return common


def cache_result(has_session: bool, kept: int, prompt_tokens: int) -> CacheResult:
    """``hit``: all but the last prompt token were in the lane's KV; ``partial``: some;
    ``miss``: none, for a request of a session; ``none``: none, for a request without one."""
    if kept == 0:
        return CacheResult.MISS if has_session else CacheResult.NONE
    if kept == prompt_tokens - 1:
        return CacheResult.HIT
    return CacheResult.PARTIAL


class LaneTable:
    """The lanes of one context and the session → lane map."""

    def __init__(self, lanes: int) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        self.lanes = [Lane(seq) for seq in range(lanes)]
        self._sessions: dict[str, Lane] = {}

    def __len__(self) -> int:
        return len(self.lanes)

    def all_busy(self) -> bool:
        return all(lane.request_id is not None for lane in self.lanes)

    def has_session(self, session: str) -> bool:
        return session in self._sessions

    def cells_used(self) -> int:
        """Cells held by running requests and sessions. An idle lane's KV without a session is
        a reusable cache that any request may overwrite at once, so it is not counted (as free
        memory does not count the page cache)."""
        used = 0
        for lane in self.lanes:
            if lane.request_id is not None or lane.session is not None:
                used += len(lane.tokens)
        return used

    def pick(self, session: str | None, prompt: Sequence[int] = ()) -> Pick | None:
        """A lane for a request of ``session``, or None when it must wait: its session's own
        lane (None while busy), else the idle lane without a session whose KV shares the longest
        prefix with ``prompt`` (least recently used among equals), else the least recently used
        idle lane, whose session is displaced."""
        if session is not None:
            own = self._sessions.get(session)
            if own is not None:
                return Pick(own) if own.request_id is None else None
        idle = [lane for lane in self.lanes if lane.request_id is None]
        if not idle:
            return None
        free = [lane for lane in idle if lane.session is None]
        if free:
            return Pick(
                max(
                    free,
                    key=lambda lane: (common_prefix(lane.tokens, prompt), -lane.last_used),
                )
            )
        # Every idle lane keeps a warm session: displace the least recently used one.
        lane = min(idle, key=lambda candidate: candidate.last_used)
        return Pick(lane, self.evict(lane))

    def claim(
        self, lane: Lane, request_id: str, session: str | None, prompt: Sequence[int]
    ) -> Claim:
        """Run ``request_id`` in ``lane`` and decide what of the lane's KV it keeps: the
        common prefix with ``prompt``, whichever request or session left it.

        Decode at least the last prompt token again: its logits are needed."""
        lane.request_id = request_id
        common = common_prefix(lane.tokens, prompt)
        keep = min(common, len(prompt) - 1)
        if session is None:
            return Claim(keep, None)
        if lane.session != session:
            lane.session = session
            self._sessions[session] = lane
            return Claim(keep, SessionChange.CREATED)
        diverged = len(lane.tokens) > common
        return Claim(keep, SessionChange.TRIMMED if diverged else SessionChange.REUSED)

    def donor(self, lane: Lane, prompt: Sequence[int], keep: int, min_gain: int) -> Lane | None:
        """Another lane whose KV shares a longer prefix with ``prompt`` than ``lane`` keeps
        (``keep``) by at least ``min_gain`` tokens: copying its KV into ``lane`` saves
        prefilling them (many new sessions with one system prompt, arriving together). Any
        state will do — the copy takes what the donor's KV holds now, and its own request or
        session keeps it — except a lane that is itself still waiting for a copy."""
        best: Lane | None = None
        best_common = keep + min_gain - 1
        limit = len(prompt) - 1
        for other in self.lanes:
            if other is lane or other.copy_pending or len(other.tokens) <= best_common:
                continue
            common = min(common_prefix(other.tokens, prompt), limit)
            if common > best_common:
                best, best_common = other, common
        return best

    def release(self, lane: Lane, now: float) -> bool:
        """The lane's request ended; it keeps its KV for the next request. True when that KV
        must be cleared instead (its session was dropped while the request ran)."""
        lane.request_id = None
        lane.last_used = now
        clear, lane.clear_on_release = lane.clear_on_release, False
        return clear

    def drop(self, session: str) -> Lane | None:
        """Forget ``session``; its lane (if it had one), unbound. The caller clears an idle
        lane's KV; a busy one is cleared when its request ends."""
        lane = self._sessions.pop(session, None)
        if lane is not None:
            lane.session = None
            lane.clear_on_release = lane.request_id is not None
        return lane

    def evict(self, lane: Lane) -> str:
        """Unbind the session of ``lane``; that session."""
        session = lane.session
        assert session is not None
        del self._sessions[session]
        lane.session = None
        return session

    def restore_lane(self) -> Lane | None:
        """An idle lane with no session and an empty KV, for a session read back from its
        state file (lowest sequence first); None when every lane is taken."""
        for lane in self.lanes:
            if lane.request_id is None and lane.session is None and not lane.tokens:
                return lane
        return None

    def bind_restored(self, lane: Lane, session: str, tokens: Sequence[int], now: float) -> None:
        """``lane``'s KV now holds ``tokens`` of ``session`` (restored): the session's next
        request finds its own lane and reuses them as any warm session's."""
        if session in self._sessions:
            raise ValueError("the session already has a lane")
        lane.tokens = list(tokens)
        lane.session = session
        lane.last_used = now
        self._sessions[session] = lane

    def idle_sessions_mru(self) -> list[Lane]:
        """Idle lanes holding a session and KV, most recently used first (the save order)."""
        return sorted(
            (
                lane
                for lane in self.lanes
                if lane.request_id is None and lane.session is not None and lane.tokens
            ),
            key=lambda lane: -lane.last_used,
        )

    def idle_sessions_lru(self) -> list[Lane]:
        """Idle lanes holding a session, least recently used first (pressure relief order)."""
        return sorted(
            (lane for lane in self.lanes if lane.request_id is None and lane.session is not None),
            key=lambda lane: lane.last_used,
        )


class PressureGauge:
    """KV pressure with hysteresis over ``cells_total`` cells."""

    __slots__ = ("_high_cells", "_low_cells", "pressured")

    def __init__(self, cells_total: int, high: float, low: float) -> None:
        if not 0.0 < low < high <= 1.0:
            raise ValueError("need 0 < kv_pressure_low < kv_pressure_high <= 1")
        self._high_cells = high * cells_total
        self._low_cells = low * cells_total
        self.pressured = False

    def observe(self, used: int) -> KvChange | None:
        """The crossing ``used`` cells make, if any."""
        if not self.pressured:
            if used >= self._high_cells:
                self.pressured = True
                return KvChange.PRESSURE_CROSSED
        elif used <= self._low_cells:
            self.pressured = False
            return KvChange.PRESSURE_CLEARED
        return None

    def relieved(self, used: int) -> bool:
        """Whether ``used`` is at or below the low mark."""
        return used <= self._low_cells
