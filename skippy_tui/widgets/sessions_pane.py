"""Pane 3, Sessions: sessions (state, lane, the tokens each holds in KV and its last request
reused, trims, speculative acceptance) and in-flight requests.

A request shows its lane (its session's lane), state (queued, admitted, prefill, decode), prompt and
generated token counts, time to first token and queue wait. At most `MAX_ROWS` of each are drawn
(oldest requests first, sessions by id); the subtitle gives the full counts, so the cost of a redraw
is bounded whatever the reducer holds. "Wait" is the request's queue wait.
"""

from __future__ import annotations

from typing import Any, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from skippy_tui import format as fmt
from skippy_tui.store import DashboardSnapshot
from skippy_tui.tables import Cells, KeyedRows, SizedTable
from skippy_tui.widgets.pane import Pane
from skippyctl.reducer.state import RequestView, RuntimeView, SessionView

MAX_ROWS: Final = 200
SESSION_COLUMNS: Final = (
    "Session",
    "Model",
    "State",
    "Lane",
    "KV tokens",
    "Reused",
    "Trims",
    "Spec acc",
)
REQUEST_COLUMNS: Final = (
    "Request",
    "Model",
    "Session",
    "Lane",
    "State",
    "Prompt",
    "Gen",
    "TTFT",
    "Wait",
)


def _lane(value: int | None) -> str:
    return fmt.DASH if value is None else str(value)


def _acceptance(session: SessionView) -> str:
    """Speculative decoding's acceptance over the session's ended requests: the share of
    proposed tokens that were committed (blank without proposals)."""
    if not session.spec_proposed_tokens:
        return ""
    share = 100.0 * session.spec_accepted_tokens / session.spec_proposed_tokens
    return f"{share:.0f}% of {fmt.count(session.spec_proposed_tokens)}"


def session_row(session: SessionView) -> Cells:
    return (
        Text(str(session.session_id), style="bold"),
        str(session.model_id) if session.model_id is not None else fmt.DASH,
        fmt.session_state(session.state),
        _lane(session.lane),
        fmt.count(session.context_tokens),
        fmt.count(session.reused_tokens),
        str(session.trimmed) if session.trimmed else "",
        _acceptance(session),
    )


def request_row(view: RuntimeView, request: RequestView) -> Cells:
    session = view.sessions.get(request.session_id) if request.session_id is not None else None
    return (
        Text(str(request.request_id), style="bold"),
        str(request.model_id) if request.model_id is not None else fmt.DASH,
        str(request.session_id) if request.session_id is not None else fmt.DASH,
        _lane(session.lane if session is not None else None),
        fmt.request_state(request.state),
        fmt.count(request.prompt_tokens),
        fmt.count(request.generated_tokens),
        fmt.millis(request.time_to_first_token_ms),
        fmt.millis(request.queue_wait_ms),
    )


class SessionsPane(Pane):
    """Sessions and in-flight requests."""

    NUMBER = 3
    TITLE = "Sessions"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._sessions: DataTable[Any] = SizedTable(id="sessions-table", cursor_type="row")
        self._requests: DataTable[Any] = SizedTable(id="requests-table", cursor_type="row")
        self._session_rows = KeyedRows(self._sessions)
        self._request_rows = KeyedRows(self._requests)
        self._inputs: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield self._sessions
        yield Static("In-flight requests", classes="subheading")
        yield self._requests

    def on_mount(self) -> None:
        for label in SESSION_COLUMNS:
            self._sessions.add_column(label, key=label)
        for label in REQUEST_COLUMNS:
            self._requests.add_column(label, key=label)

    def show(self, snapshot: DashboardSnapshot) -> None:
        view = snapshot.view
        inputs = (view.sessions, view.requests)
        if self._inputs and all(a is b for a, b in zip(inputs, self._inputs, strict=True)):
            return
        self._inputs = inputs
        sessions = sorted(view.sessions.values(), key=lambda s: s.session_id)[:MAX_ROWS]
        self._session_rows.show([(str(s.session_id), session_row(s)) for s in sessions])
        requests = sorted(view.requests.values(), key=lambda r: (r.received_mono_ns, r.request_id))[
            :MAX_ROWS
        ]
        self._request_rows.show([(str(r.request_id), request_row(view, r)) for r in requests])
        capped = (
            " (first 200 shown)" if max(len(view.sessions), len(view.requests)) > MAX_ROWS else ""
        )
        self.border_subtitle = (
            f"{fmt.plural(len(view.sessions), 'session')} · {len(view.requests)} in flight{capped}"
        )
