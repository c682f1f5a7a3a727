"""Compute turns (engine/compute_turns.py): engines that open the same file exclude each other
around every llama_decode, and the binding's other calls pass through untouched."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from skippyctl.engine.compute_turns import ComputeTurns, TakingTurns


def test_two_openers_of_the_file_take_turns(tmp_path: Path) -> None:
    path = str(tmp_path / "turns.lock")
    first, second = ComputeTurns(path), ComputeTurns(path)  # two engines: two descriptions
    try:
        first.take()
        taken = threading.Event()

        def other() -> None:
            second.take()
            taken.set()
            second.give()

        thread = threading.Thread(target=other)
        thread.start()
        assert not taken.wait(0.3), "the second took a turn the first still held"
        first.give()
        assert taken.wait(5)
        thread.join(5)
    finally:
        first.close()
        second.close()


def _held(path: str) -> bool:
    """Whether some opener holds the turn (probed from a description of its own, without
    waiting)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the description releases a probe's own lock
    return False


class _Binding:
    """A stand-in for the llama_cpp module (the wrapper is what is tested; the real binding's
    decodes are covered by tests/api/test_compute_turns.py): records whether the turn was held
    during each decode."""

    def __init__(self, path: str) -> None:
        self._path = path
        self.held_during_decode: list[bool] = []

    def llama_decode(self, context: Any, batch: Any) -> int:
        self.held_during_decode.append(_held(self._path))
        return 7

    def llama_n_ctx(self, context: Any) -> int:
        return 42


def test_every_decode_runs_inside_a_turn_and_the_rest_passes_through(tmp_path: Path) -> None:
    path = str(tmp_path / "turns.lock")
    binding = _Binding(path)
    turns = ComputeTurns(path)
    llama = TakingTurns(binding, turns)
    assert llama.llama_decode(None, None) == 7
    assert llama.llama_n_ctx(None) == 42
    assert binding.held_during_decode == [True]
    assert not _held(path)  # given back after the decode
    turns.close()
