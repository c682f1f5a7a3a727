"""Link health of a split model: round-trip times of the engine's own connection to each stage.

A stage serves one client connection at a time and the engine holds it, so nobody else can
measure the link: the engine does, with a round trip that costs the stage nothing. Each probe
times ``ggml_backend_dev_memory`` on the stage's RPC device — in the llama.cpp that
llama-cpp-python 0.3.36 vendors (``ggml-rpc.cpp``), ``ggml_backend_rpc_device_get_memory`` →
``ggml_backend_rpc_get_device_memory`` → ``rpc_dispatcher::send(RPC_CMD_GET_DEVICE_MEMORY, …)``
with a response: the request is queued behind anything queued on that stage's dispatcher (the
one connection ggml keeps per endpoint, held alive by the model's buffers) and the call returns
once the answer came back over the wire; nothing is cached. It is a blocking call like the ones
llama_decode makes, so it is safe on the decode thread between ``llama_decode`` calls (and on the
main thread before the decode thread starts); like every ggml RPC client call it aborts the
process when the stage is gone, which the host attributes to the stage (``runtime/topology.py``).

Contract of :class:`LinkProber` (decode thread only, not thread-safe):

- ``probe_all`` takes one sample of every stage now; ``probe_due`` of every stage whose last
  sample is at least ``interval_s`` old (``BUSY_INTERVAL_FACTOR`` × that while requests run: a
  probe delays the decode by a round trip); ``seconds_until_due`` says how long an idle loop
  may sleep.
- Each sample yields one :class:`~skippyctl.engine.protocol_messages.Link` with the figures over
  the last ``window`` samples of that stage (:func:`link_figures`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from skippyctl.engine.protocol_messages import Link

DEFAULT_WINDOW: Final = 16
DEFAULT_INTERVAL_S: Final = 1.0
BUSY_INTERVAL_FACTOR: Final = 5
"""While requests run, a stage is probed this many times less often: a probe is a round trip
on the decode thread, and over a slow link (3 ms + exp(5 ms) each way) one a second per stage
cost 3-12 % of the decode rate of 2-3 stages (benchmarks/stages.py --wire)."""


@dataclass(frozen=True, slots=True)
class LinkFigures:
    rtt_ms: float
    """Median round trip over the window."""
    p95_ms: float
    """95th percentile (nearest rank) over the window."""
    jitter_ms: float
    """Mean absolute difference of consecutive round trips (RFC 3550's idea, unsmoothed)."""


def link_figures(samples_ms: Sequence[float]) -> LinkFigures:
    """The figures of a non-empty window of round trips (ms)."""
    if not samples_ms:
        raise ValueError("no samples")
    ordered = sorted(samples_ms)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2.0
    p95 = ordered[max(0, math.ceil(0.95 * n) - 1)]
    diffs = [abs(b - a) for a, b in zip(samples_ms, samples_ms[1:], strict=False)]
    jitter = sum(diffs) / len(diffs) if diffs else 0.0
    return LinkFigures(round(median, 3), round(p95, 3), round(jitter, 3))


class LinkProber:
    """Times one round trip per stage per interval (module docstring). ``measure[i]`` makes
    one round trip to stage ``i``."""

    def __init__(
        self,
        measure: Sequence[Callable[[], object]],
        interval_s: float = DEFAULT_INTERVAL_S,
        window: int = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._measure = tuple(measure)
        self._interval_s = max(0.0, interval_s)
        self._clock = clock
        self._windows = [collections.deque[float](maxlen=max(1, window)) for _ in self._measure]
        self._last = [-math.inf] * len(self._measure)

    @property
    def stages(self) -> int:
        return len(self._measure)

    def _sample(self, index: int) -> Link:
        started = time.perf_counter()
        self._measure[index]()
        rtt_ms = (time.perf_counter() - started) * 1000.0
        self._last[index] = self._clock()
        window = self._windows[index]
        window.append(rtt_ms)
        figures = link_figures(list(window))
        return Link(
            stage=index,
            rtt_ms=figures.rtt_ms,
            p95_ms=figures.p95_ms,
            jitter_ms=figures.jitter_ms,
            samples=len(window),
            last_ms=round(rtt_ms, 3),
        )

    def probe_all(self) -> list[Link]:
        return [self._sample(index) for index in range(len(self._measure))]

    def probe_due(self, busy: bool = False) -> list[Link]:
        """The stages whose last sample is an interval old (``BUSY_INTERVAL_FACTOR`` intervals
        while ``busy``: requests are running)."""
        now = self._clock()
        interval = self._interval_s * (BUSY_INTERVAL_FACTOR if busy else 1)
        return [
            self._sample(index)
            for index in range(len(self._measure))
            if now - self._last[index] >= interval
        ]

    def seconds_until_due(self) -> float:
        if not self._measure:
            return math.inf
        return max(0.0, min(self._last) + self._interval_s - self._clock())
