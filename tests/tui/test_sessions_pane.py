"""The Sessions pane's rows (no app runs)."""

from __future__ import annotations

from skippy_tui.widgets.sessions_pane import SESSION_COLUMNS, session_row
from skippyctl.events.envelope import LogicalId
from skippyctl.reducer.state import SessionState, SessionView


def test_a_session_row_shows_its_speculative_acceptance_only_when_it_had_proposals() -> None:
    base = SessionView(LogicalId("s-1"), SessionState.IDLE, LogicalId("tiny"), lane=0)
    speculated = SessionView(
        LogicalId("s-2"),
        SessionState.IDLE,
        LogicalId("tiny"),
        lane=1,
        spec_proposed_tokens=1200,
        spec_accepted_tokens=900,
    )
    assert len(session_row(base)) == len(SESSION_COLUMNS)
    assert session_row(base)[-1] == ""
    assert session_row(speculated)[-1] == "75% of 1,200"
