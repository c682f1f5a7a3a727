"""The memory of the devices a model serves on, watched while it serves.

ggml's device API says how much memory each device has free (``ggml_backend_dev_memory``: a
GPU's driver figure). For the CPU device it gives the host's total as its free memory too (it
does not know), so a CPU device's free memory is the kernel's MemAvailable instead
(:func:`with_host_memory`). A :class:`DeviceWatch` thread reads them for the model's devices
every :data:`SAMPLE_INTERVAL_S` (and once as it starts) and sends a ``DeviceMemory`` message
when a device's free share falls below its low mark (``SKIPPY_DEVICE_LOW_FREE_PCT``) or climbs
back above :data:`RECOVERY_RATIO` × that mark — the gap keeps a device that hovers at the mark
from flapping. The host turns them into
``device_degraded`` / ``device_recovered`` (runtime/resource_events.py).

Its own thread, not the decode thread: a sample is a few calls into ggml and never waits for a
decode step, and the decode path stays free of it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from skippyctl.engine.geometry import available_memory_bytes
from skippyctl.engine.protocol_messages import DeviceMemory, EngineMessage

if TYPE_CHECKING:  # the engine imports the native binding only where it uses it
    from skippyctl.native.backends import Device

SAMPLE_INTERVAL_S: Final = 5.0
RECOVERY_RATIO: Final = 1.5


class DeviceReading(Protocol):
    """What a sample needs of a device (``native.backends.Device``)."""

    @property
    def name(self) -> str: ...
    @property
    def memory_free_bytes(self) -> int: ...
    @property
    def memory_total_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class HostReading:
    """The CPU device, its free memory the kernel's MemAvailable."""

    name: str
    memory_free_bytes: int
    memory_total_bytes: int


def with_host_memory(devices: Callable[[], Sequence[Device]]) -> Callable[[], list[DeviceReading]]:
    """``devices`` with each CPU device's free memory read from the kernel (MemAvailable)."""

    def readings() -> list[DeviceReading]:
        found: list[DeviceReading] = []
        for device in devices():
            available = available_memory_bytes() if device.kind == "cpu" else None
            if available is None:
                found.append(device)
            else:
                found.append(HostReading(device.name, available, device.memory_total_bytes))
        return found

    return readings


class DeviceWatch:
    """Samples ``devices()`` for the devices named ``watched``; ``low_free_pct``: the mark."""

    def __init__(
        self,
        devices: Callable[[], list[DeviceReading]],
        watched: Collection[str],
        emit: Callable[[EngineMessage], None],
        low_free_pct: float,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self._devices = devices
        self._watched = frozenset(watched)
        self._emit = emit
        self._low = low_free_pct / 100.0
        self._interval_s = interval_s
        self._degraded: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skippy-devices", daemon=True)

    def start(self) -> DeviceWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _run(self) -> None:
        while True:
            # A reading that fails is skipped, never fatal to the engine.
            with contextlib.suppress(Exception):
                self.sample()
            if self._stop.wait(self._interval_s):
                return

    def sample(self) -> None:
        """One reading of every watched device; a message for each that crossed a mark."""
        for device in self._devices():
            total = device.memory_total_bytes
            if device.name not in self._watched or total <= 0:
                continue
            share = device.memory_free_bytes / total
            degraded = device.name in self._degraded
            if not degraded and share < self._low:
                self._degraded.add(device.name)
            elif degraded and share > self._low * RECOVERY_RATIO:
                self._degraded.discard(device.name)
            else:
                continue
            self._emit(
                DeviceMemory(
                    device.name, device.memory_free_bytes, total, device.name in self._degraded
                )
            )
