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

TURN_SPIN_COUNT: Final = 10_000
"""libgomp's spin count for engines that take turns (its default is 300,000): measured with two
models decoding together, 64 tokens each took 1.7 s at the default and 1.0 s at this, where
one alone takes 0.45 s either way (benchmarks/two_models.py)."""


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
