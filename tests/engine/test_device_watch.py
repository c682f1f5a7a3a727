"""The device watch's marks: degraded below the low mark, recovered only above 1.5x it, one
message per crossing. Readings are made up here (a device's free memory cannot be moved on
demand); the real reading is driven in tests/runtime/test_native_failures.py."""

from __future__ import annotations

from dataclasses import dataclass

from skippyctl.engine.device_watch import DeviceWatch
from skippyctl.engine.protocol_messages import DeviceMemory, EngineMessage


@dataclass(frozen=True)
class Reading:
    name: str
    memory_free_bytes: int
    memory_total_bytes: int


def test_a_device_is_degraded_below_its_mark_and_recovers_only_well_above_it() -> None:
    free = {"CPU": 50, "GPU0": 50}
    sent: list[EngineMessage] = []

    def devices() -> list[Reading]:
        return [Reading(name, value, 100) for name, value in free.items()]

    watch = DeviceWatch(devices, {"CPU"}, sent.append, low_free_pct=10.0)  # type: ignore[arg-type]
    for value in (50, 9, 8, 12, 14, 16, 9):
        free["CPU"] = value
        free["GPU0"] = 1  # not the model's device: never reported
        watch.sample()
    assert sent == [
        DeviceMemory("CPU", 9, 100, low=True),
        DeviceMemory("CPU", 16, 100, low=False),  # above 15 (1.5 x 10): not at 12 or 14
        DeviceMemory("CPU", 9, 100, low=True),
    ]
