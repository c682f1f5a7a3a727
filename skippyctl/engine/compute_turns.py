"""The engines of one runtime compute one at a time.

Each engine's llama.cpp runs its graph on a team of threads, one per core by default, that meet
at a barrier between operations (OpenMP in this build, spinning before they sleep). Two engines
computing at once on the same cores preempt each other's teams inside those barriers: measured
on this 2-core machine, two models decoding together made 64 tokens take 93 s where one alone
took 0.5 s (benchmarks/two_models.py). Taking turns, each ``llama_decode`` runs with every core
and two models together go at the speed of one.

The turn is an ``flock`` on one file of the runtime's directory, which every engine opens
itself (a lock belongs to an open file description: engines sharing one would not exclude each
other). An engine alone takes it uncontended: two system calls per decode. An engine's team, once
its turn is over, spins a while before it sleeps (libgomp's spin count) — through the next
engine's turn, on the same cores; so engines that take turns also spin briefly
(:data:`TURN_SPIN_COUNT`, ``EngineOptions.omp_spin_count``).
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, Final

TURN_SPIN_COUNT: Final = 100_000
"""libgomp's spin count for engines that take turns (its default is 300,000). Measured on the
real model, 2 threads (benchmarks/two_models.py and benchmarks/turn_spin.py, docs/BENCHMARKS.md
7.5): at 10,000 one engine alone decoded at 66.5 tok/s (0.75x llama-server on a 140-token
prompt) and two models together at 63 tok/s in all; at 100,000 alone 82.4 (0.98x-1.0x) and
together 74.8. The default spin lets two engines' threads spin through each other's turns
(issue 27: 1.7 s against 1.0 s for 64 tokens each)."""


class ComputeTurns:
    """A turn at computing, shared by the engines that open the same file."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def take(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def give(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class TakingTurns:
    """The llama.cpp binding with every ``llama_decode`` inside a turn; the rest passes
    through."""

    def __init__(self, llama: Any, turns: ComputeTurns) -> None:
        self._llama = llama
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        # Kept on the instance: the decode loop's next lookups of it are plain attribute reads.
        value = getattr(self._llama, name)
        setattr(self, name, value)
        return value

    def llama_decode(self, *args: Any) -> Any:
        self._turns.take()
        try:
            return self._llama.llama_decode(*args)
        finally:
            self._turns.give()
