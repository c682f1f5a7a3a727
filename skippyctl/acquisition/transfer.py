"""Byte accounting of a download: what ``huggingface_hub``'s progress bar reports becomes
coalesced ``model_download_*`` events, and a cancellation request stops the transfer at its next
chunk."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Progress, summaries
from skippyctl.events.reasons import ProgressUnit

if TYPE_CHECKING:
    from types import TracebackType

PROGRESS_MIN_INTERVAL_S: Final = 0.25
PROGRESS_MIN_STEP: Final = 0.01
"""A fraction of the total: progress moves at least 1 % between two events."""


class TransferCancelled(Exception):
    """Raised inside the hub's download loop (from the progress meter) to stop it."""


class TransferOwner(Protocol):
    """What a transfer needs of the acquisition it belongs to."""

    clock: Callable[[], float]
    cancel_requested: threading.Event

    def emit_event(
        self,
        event_id: EventId,
        operation_id: LogicalId,
        model_id: LogicalId | None,
        *,
        parent: LogicalId | None = None,
        **fields: Any,
    ) -> None: ...


@dataclass(slots=True)
class ProgressThrottle:
    """Decides which byte counts become `model_download_progress` events."""

    total: int | None
    clock: Callable[[], float] = time.monotonic
    min_interval_s: float = PROGRESS_MIN_INTERVAL_S
    min_step: float = PROGRESS_MIN_STEP
    last_value: int = -1
    last_at: float | None = None

    def offer(self, current: int) -> bool:
        """Whether `current` should be told now (it is recorded as told when so)."""
        now = self.clock()
        if current <= self.last_value:
            return False
        if self.last_at is not None:
            if now - self.last_at < self.min_interval_s:
                return False
            if self.total and current - self.last_value < self.min_step * self.total:
                return False
        self.last_value, self.last_at = current, now
        return True

    def final(self, current: int) -> bool:
        """The last value is always told (once)."""
        if current <= self.last_value:
            return False
        self.last_value, self.last_at = current, self.clock()
        return True


@dataclass(slots=True)
class Transfer:
    """Byte accounting of one download operation across its parts (called from the hub's loop)."""

    acquisition: TransferOwner
    operation_id: LogicalId
    parent: LogicalId
    model_id: LogicalId
    total: int | None
    base: int = 0
    """Bytes of the parts finished before the current one."""
    current_part: int = 0
    started_at: float | None = None
    throttle: ProgressThrottle = field(init=False)

    def __post_init__(self) -> None:
        self.throttle = ProgressThrottle(self.total, self.acquisition.clock)

    @property
    def current(self) -> int:
        return self.base + self.current_part

    def begin(self, resumed: int = 0) -> None:
        """The first part's start tells the operation's start, with the bytes a partial file
        already had (``resumed``); a later part's resumed bytes are progress."""
        if self.started_at is not None:
            if resumed:
                self.add(resumed)
            return
        self.started_at = self.acquisition.clock()
        self.current_part = resumed
        self.throttle.offer(self.current)
        self.acquisition.emit_event(
            EventId.MODEL_DOWNLOAD_STARTED,
            self.operation_id,
            self.model_id,
            parent=self.parent,
            progress=Progress(self.current, self.total, ProgressUnit.BYTES),
            summaries=summaries(model_size_bytes=self.total),
        )

    def add(self, delta: int) -> None:
        self.current_part = max(0, self.current_part + delta)
        if self.acquisition.cancel_requested.is_set():
            raise TransferCancelled
        if self.throttle.offer(self.current):
            self._progress()

    def finish_part(self, size: int) -> None:
        self.base += size
        self.current_part = 0

    def finish(self) -> None:
        if self.throttle.final(self.current):
            self._progress()

    def _progress(self) -> None:
        self.acquisition.emit_event(
            EventId.MODEL_DOWNLOAD_PROGRESS,
            self.operation_id,
            self.model_id,
            parent=self.parent,
            progress=Progress(self.current, self.total, ProgressUnit.BYTES),
        )


class Meter:
    """What ``huggingface_hub``'s ``http_get`` takes for a tqdm bar. It counts ``update(n)``:
    the bytes written to the file (per HTTP chunk), negative when a server ignored a Range and
    the body restarts; ``initial`` is what a partial file already had. ``update_transfer``
    and the display calls are accepted and ignored."""

    def __init__(self, transfer: Transfer, initial: int = 0) -> None:
        self._transfer = transfer
        transfer.begin(resumed=initial)

    def __enter__(self) -> Meter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self._transfer.add(int(n or 0))

    def update_transfer(self, n: float | None = 1) -> None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def refresh(self) -> None:
        return None

    def close(self) -> None:
        return None


class MeterFactory:
    """The ``tqdm_class`` given to the hub: called with a bar's keyword arguments."""

    def __init__(self, transfer: Transfer) -> None:
        self._transfer = transfer

    def __call__(self, **kwargs: Any) -> Meter:
        initial = kwargs.get("initial")
        return Meter(self._transfer, initial if isinstance(initial, int) else 0)
