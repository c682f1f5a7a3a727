"""The dashboard's seam for acting on the runtime: `RuntimeControl` (and `FleetControl`, the
fleet dashboard's, which names the node).

Contract: the dashboard calls these from a worker thread, never the UI thread, so they may block on
I/O (an HTTP call to the management API). They return once the runtime has accepted the request —
the outcome arrives later as events through the `EventSource` — and raise an exception with a short
human message when it was refused or the runtime cannot be reached; the dashboard shows that
message as a notification. A dashboard built without a control (None) answers "not connected".
"""

from __future__ import annotations

from typing import Protocol


class RuntimeControl(Protocol):
    """Load and unload models on the runtime the dashboard watches."""

    def load(self, path: str) -> None:
        """Ask the runtime to load the GGUF model at `path` (on the runtime's machine)."""
        ...

    def unload(self, model_id: str, force: bool) -> None:
        """Ask the runtime to unload `model_id`; `force` cancels its in-flight requests."""
        ...


class FleetControl(Protocol):
    """Load and unload models on one member of the fleet the dashboard watches (same contract
    as `RuntimeControl`, with the node's name first)."""

    def load(self, node: str, path: str) -> None:
        """Ask `node`'s runtime to load the GGUF model at `path` (on that node's machine)."""
        ...

    def unload(self, node: str, model_id: str, force: bool) -> None:
        """Ask `node`'s runtime to unload `model_id`; `force` cancels its in-flight requests."""
        ...
