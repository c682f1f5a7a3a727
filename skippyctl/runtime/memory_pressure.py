"""Host memory pressure with hysteresis, from the scheduler's periodic host memory observations.

:class:`MemoryPressure` is pure: fed one (available, total) reading at a time, it says when the
host crossed into pressure (available below :data:`PRESSURE_ENTER_SHARE` of the total) and when
it left it (available back at :data:`PRESSURE_EXIT_SHARE` or more). Between the two thresholds
the state holds, so a reading that wobbles around one threshold reports nothing. The first
reading reports a crossing only if it is under pressure (no `cleared` without a `crossed`).

:func:`host_memory` reads "available" the way the kernel estimates it (MemAvailable: free
memory plus reclaimable cache), not ``SC_AVPHYS_PAGES`` (free pages only), which a busy page
cache keeps low on a healthy machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

PRESSURE_ENTER_SHARE: Final = 0.10
PRESSURE_EXIT_SHARE: Final = 0.15


class PressureChange(StrEnum):
    CROSSED = "crossed"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class HostMemory:
    available_bytes: int
    total_bytes: int


class MemoryPressure:
    def __init__(
        self, enter_share: float = PRESSURE_ENTER_SHARE, exit_share: float = PRESSURE_EXIT_SHARE
    ) -> None:
        if not 0.0 < enter_share <= exit_share < 1.0:
            raise ValueError("need 0 < enter_share <= exit_share < 1")
        self.enter_share = enter_share
        self.exit_share = exit_share
        self.under_pressure = False

    def observe(self, available_bytes: int, total_bytes: int) -> PressureChange | None:
        """The change this reading makes, if any (a reading without a total changes nothing)."""
        if total_bytes <= 0:
            return None
        share = available_bytes / total_bytes
        if not self.under_pressure and share < self.enter_share:
            self.under_pressure = True
            return PressureChange.CROSSED
        if self.under_pressure and share >= self.exit_share:
            self.under_pressure = False
            return PressureChange.CLEARED
        return None


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> HostMemory | None:
    """MemAvailable and MemTotal; sysconf's free and physical pages where /proc is missing."""
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemAvailable", "MemTotal"):
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        fields = {}
    if "MemAvailable" in fields and "MemTotal" in fields:
        return HostMemory(fields["MemAvailable"], fields["MemTotal"])
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return HostMemory(os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page)
    except (OSError, ValueError):
        return None
