"""How a preparation ends without a usable artifact (its terminal event is emitted first)."""

from __future__ import annotations

from skippyctl.events.reasons import ReasonCode


class PreparationError(Exception):
    """The pull ended without a usable artifact; its terminal event was emitted already."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        """For people (stderr): names the problem, never a path, URL or token."""


class PreparationCancelled(PreparationError):
    """The pull was cancelled (Ctrl-C or `cancel`); its terminal event was emitted already."""

    def __init__(self, message: str = "cancelled") -> None:
        super().__init__(ReasonCode.CANCELLATION, message)
