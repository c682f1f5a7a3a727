"""Pane 3, Sessions: sessions (state, lane, the tokens each holds in KV and its last request
reused, trims, speculative acceptance) and in-flight requests.

A request shows its lane (its session's lane), state (queued, admitted, prefill, decode), prompt and
generated token counts, time to first token and queue wait. At most `MAX_ROWS` of each are drawn
(oldest requests first, sessions by id); the subtitle gives the full counts, so the cost of a redraw
is bounded whatever the reducer holds. "Wait" is the request's queue wait. In the fleet dashboard
both tables begin with the node, and the nodes the filter selects follow each other (the
`MAX_ROWS` bound is over all of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from skippy_tui import format as fmt
from skippy_tui.tables import Cells, KeyedRows, SizedTable
from skippy_tui.widgets.pane import NODE_COLUMN, NodePart, Pane, node_cell, row_key, same_inputs
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

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, fleet=fleet)
        self._sessions: DataTable[Any] = SizedTable(id="sessions-table", cursor_type="row")
        self._requests: DataTable[Any] = SizedTable(id="requests-table", cursor_type="row")
        self._session_rows = KeyedRows(self._sessions)
        self._request_rows = KeyedRows(self._requests)
        self._inputs: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield self._sessions
        yield Static("In-flight requests", classes="subheading")
        yield self._requests

    def on_mount(self) -> None:
        node = (NODE_COLUMN,) if self.fleet else ()
        for label in (*node, *SESSION_COLUMNS):
            self._sessions.add_column(label, key=label)
        for label in (*node, *REQUEST_COLUMNS):
            self._requests.add_column(label, key=label)

    def show_parts(self, parts: Sequence[NodePart]) -> None:
        inputs = tuple(
            value
            for name, snapshot in parts
            for value in (
                name,
                snapshot.view.sessions,
                snapshot.view.requests,
                snapshot.connection if name is not None else None,
            )
        )
        if same_inputs(inputs, self._inputs):
            return
        self._inputs = inputs
        session_rows: list[tuple[str, Cells]] = []
        request_rows: list[tuple[str, Cells]] = []
        session_count = request_count = 0
        for name, snapshot in parts:
            view = snapshot.view
            session_count += len(view.sessions)
            request_count += len(view.requests)
            node = () if name is None else (node_cell(name, snapshot),)
            room = MAX_ROWS - len(session_rows)
            sessions = sorted(view.sessions.values(), key=lambda s: s.session_id)[:room]
            session_rows += [
                (row_key(name, str(s.session_id)), (*node, *session_row(s))) for s in sessions
            ]
            room = MAX_ROWS - len(request_rows)
            requests = sorted(
                view.requests.values(), key=lambda r: (r.received_mono_ns, r.request_id)
            )[:room]
            request_rows += [
                (row_key(name, str(r.request_id)), (*node, *request_row(view, r))) for r in requests
            ]
        self._session_rows.show(session_rows)
        self._request_rows.show(request_rows)
        capped = " (first 200 shown)" if max(session_count, request_count) > MAX_ROWS else ""
        self.border_subtitle = (
            f"{fmt.plural(session_count, 'session')} · {request_count} in flight{capped}"
        )
