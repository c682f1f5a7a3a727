"""The PAUSED banner: shown while the dashboard is paused, with how much arrived meanwhile.

Contract: `show(events_since_pause)` updates the text; the app toggles `display`. While paused the
store keeps reducing (bounded), so resuming shows the current state at once, not a backlog.
"""

from __future__ import annotations

from textual.widgets import Static


def banner_text(events_since_pause: int) -> str:
    return f" PAUSED — {events_since_pause:,} events arrived since pause · p resumes "


class PausedBanner(Static):
    """A one-line banner under the header."""

    def show(self, events_since_pause: int) -> None:
        self.update(banner_text(events_since_pause))
