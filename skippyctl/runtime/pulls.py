"""Downloads inside the runtime: a pull runs in a runtime thread and tells its events to the
runtime's stream, so ``events --follow``, the dashboard and telemetry see it.

``POST /api/runtime/models/pull`` starts one (:meth:`Pulls.start`) and answers with its
operation id at once; ``POST /api/runtime/operations/{id}/cancel`` stops it at its next chunk
(:meth:`Pulls.cancel`); an on-demand load of an ``hf://`` preset prepares its file the same way
(:meth:`Pulls.prepare`). The acquisition is ``acquisition/acquire.py``'s, unchanged: the same
events, the same cache, one operation ``pull-N`` with its ``.resolve`` and ``.download``
children, exactly one terminal each. Ids come from one counter for the runtime's life.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from skippyctl.acquisition.acquire import Acquisition, Prepared
from skippyctl.acquisition.errors import PreparationError
from skippyctl.acquisition.hub import HubSettings, quiet_hub_library
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.identity import OperationIds

MAX_RUNNING_PULLS: Final = 4
"""Pulls that may run at once; the next is refused until one ends."""


class TooManyPulls(Exception):
    """:data:`MAX_RUNNING_PULLS` pulls are running already."""


class Pulls:
    """The runtime's pulls in progress, by operation id."""

    def __init__(self, emit: Callable[[Event], object], quiet_hub: bool = True) -> None:
        self._emit = emit
        self._quiet_hub = quiet_hub
        """Silence the hub library's own warnings (the runtime's setting: HF_HUB_VERBOSITY
        unset)."""
        self._ids = OperationIds()
        self._lock = threading.Lock()
        self._running: dict[LogicalId, Acquisition] = {}

    def start(self, ref: str, revision: str | None = None) -> LogicalId:
        """Start pulling ``ref`` in a thread; its id at once (TooManyPulls when the runtime
        runs as many as it takes)."""
        acquisition, pull = self._begin(revision)
        threading.Thread(
            target=self._run,
            args=(acquisition, pull, ref),
            name=f"skippy-{pull}",
            daemon=True,
        ).start()
        return pull

    def prepare(self, ref: str) -> Prepared:
        """Pull ``ref`` in this thread (an on-demand load's file); PreparationError as the
        acquisition raises it."""
        acquisition, pull = self._begin(None)
        try:
            return acquisition.prepare(ref, pull)
        finally:
            self._end(pull)

    def cancel(self, operation_id: str) -> bool:
        """Ask a running pull to stop (at its next chunk); False: no such pull runs."""
        with self._lock:
            acquisition = self._running.get(LogicalId(operation_id))
        if acquisition is None:
            return False
        acquisition.cancel()
        return True

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def _begin(self, revision: str | None) -> tuple[Acquisition, LogicalId]:
        if self._quiet_hub:
            quiet_hub_library()
        hub = HubSettings() if revision is None else HubSettings(revision=revision)
        acquisition = Acquisition(self._emit, hub, ids=self._ids)
        with self._lock:
            if len(self._running) >= MAX_RUNNING_PULLS:
                raise TooManyPulls(f"{MAX_RUNNING_PULLS} pulls are running; retry when one ends")
            pull, _ = self._ids.next("pull")
            self._running[pull] = acquisition
        return acquisition, pull

    def _run(self, acquisition: Acquisition, pull: LogicalId, ref: str) -> None:
        try:
            acquisition.prepare(ref, pull)
        except PreparationError:
            pass  # its terminal event said how it ended
        finally:
            self._end(pull)

    def _end(self, pull: LogicalId) -> None:
        with self._lock:
            self._running.pop(pull, None)
