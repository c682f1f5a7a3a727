"""Pure formatting helpers shared by the panes: sizes, durations, bars, state labels and styles.

Every function is a pure function of its arguments (no clock, no locale), so snapshot tests are
deterministic. Styles are Rich style strings; the colour names follow the app's theme variables
where Textual exposes them to Rich (`$success` etc. are not Rich styles, so plain names are used).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from rich.text import Text

from skippyctl.events.reasons import Severity
from skippyctl.output.summary import format_bytes
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    ModelState,
    NodeState,
    RequestState,
    SessionState,
    StageState,
    TopologyState,
)

DASH: Final = "–"
BAR_WIDTH: Final = 10


def size(value: int | float | None) -> str:
    """Bytes for people: `401.2 KiB`, `23.5 GiB`; a dash when unknown."""
    return DASH if value is None else format_bytes(value)


def millis(value: float | None) -> str:
    """A duration in ms: `532 ms`, `1.4 s`; a dash when unknown."""
    if value is None:
        return DASH
    if value < 1000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


def count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def compact(value: int) -> str:
    """A count in at most 6 characters: `12,345`, `123k`, `4.5M`."""
    if value < 100_000:
        return f"{value:,}"
    if value < 10_000_000:
        return f"{value / 1000:.0f}k" if value < 1_000_000 else f"{value / 1e6:.1f}M"
    return f"{value / 1e6:.0f}M"


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def rate(value: float | None, unit: str = "tok/s") -> str:
    return DASH if value is None else f"{value:,.1f} {unit}"


def clock(wall_ns: int) -> str:
    """UTC wall time to the millisecond (`09:58:10.327`); UTC so every machine renders the same."""
    stamp = datetime.fromtimestamp(wall_ns / 1e9, tz=UTC)
    return stamp.strftime("%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}"


def bar(current: int, total: int | None, width: int = BAR_WIDTH) -> Text:
    """A text progress bar with a percentage; an open bar when the total is unknown."""
    if not total:
        return Text("░" * width + "   …", style="cyan")
    fraction = min(max(current / total, 0.0), 1.0)
    filled = round(fraction * width)
    text = Text("█" * filled, style="cyan")
    text.append("░" * (width - filled), style="grey37")
    text.append(f" {fraction * 100:3.0f}%")
    return text


MODEL_STYLES: Final[dict[ModelState, str]] = {
    ModelState.REQUESTED: "cyan",
    ModelState.LOADING: "cyan",
    ModelState.INITIALIZING: "cyan",
    ModelState.AVAILABLE: "green",
    ModelState.DEGRADED: "yellow",
    ModelState.UNAVAILABLE: "red",
    ModelState.FAILED: "bold red",
    ModelState.CANCELLED: "grey50",
    ModelState.UNLOADING: "magenta",
    ModelState.UNLOADED: "grey50",
}


def model_state(state: ModelState) -> Text:
    """The state column: every pre-available state reads `loading` (a loading model is never
    shown as down)."""
    label = "loading" if state in LOADING_MODEL_STATES else state.value
    return Text(label, style=MODEL_STYLES[state])


NODE_STYLES: Final[dict[NodeState, str]] = {
    NodeState.STARTING: "bold cyan",
    NodeState.ACCEPTING: "bold green",
    NodeState.DEGRADED: "bold yellow",
    NodeState.UNAVAILABLE: "bold red",
    NodeState.DRAINING: "bold magenta",
    NodeState.STOPPED: "grey50",
}

STAGE_STYLES: Final[dict[StageState, str]] = {
    StageState.STARTING: "cyan",
    StageState.LOADING: "cyan",
    StageState.READY: "green",
    StageState.DEGRADED: "yellow",
    StageState.UNAVAILABLE: "red",
    StageState.STOPPING: "magenta",
    StageState.STOPPED: "grey50",
    StageState.FAILED: "bold red",
}
TOPOLOGY_STYLES: Final[dict[TopologyState, str]] = {
    TopologyState.ASSEMBLING: "cyan",
    TopologyState.READY: "green",
    TopologyState.DEGRADED: "yellow",
    TopologyState.UNAVAILABLE: "red",
}


def stage_state(state: StageState | TopologyState) -> Text:
    """A stage's or a topology's state, styled."""
    if isinstance(state, StageState):
        return Text(state.value, style=STAGE_STYLES[state])
    return Text(state.value, style=TOPOLOGY_STYLES[state])


def link(connected: bool | None) -> Text:
    """A stage link flag: ✓ up, ✗ lost, · not reported."""
    if connected is None:
        return Text("·", style="grey50")
    return Text("✓", style="green") if connected else Text("✗", style="bold red")


REQUEST_LABELS: Final[dict[RequestState, str]] = {
    RequestState.RECEIVED: "queued",
    RequestState.QUEUED: "queued",
    RequestState.ADMITTED: "admitted",
    RequestState.PREFILL: "prefill",
    RequestState.DECODE: "decode",
}
REQUEST_STYLES: Final[dict[RequestState, str]] = {
    RequestState.RECEIVED: "yellow",
    RequestState.QUEUED: "yellow",
    RequestState.ADMITTED: "cyan",
    RequestState.PREFILL: "blue",
    RequestState.DECODE: "green",
}


def request_state(state: RequestState) -> Text:
    return Text(REQUEST_LABELS[state], style=REQUEST_STYLES[state])


SESSION_STYLES: Final[dict[SessionState, str]] = {
    SessionState.REQUESTED: "cyan",
    SessionState.ACTIVE: "green",
    SessionState.IDLE: "grey62",
    SessionState.DRAINING: "magenta",
}


def session_state(state: SessionState) -> Text:
    return Text(state.value, style=SESSION_STYLES[state])


SEVERITY_STYLES: Final[dict[Severity, str]] = {
    Severity.TRACE: "grey42",
    Severity.DEBUG: "grey62",
    Severity.INFO: "",
    Severity.WARNING: "yellow",
    Severity.ERROR: "bold red",
    Severity.FATAL: "bold white on red",
}

SEVERITY_LABELS: Final[dict[Severity, str]] = {
    Severity.TRACE: "TRC",
    Severity.DEBUG: "DBG",
    Severity.INFO: "INF",
    Severity.WARNING: "WRN",
    Severity.ERROR: "ERR",
    Severity.FATAL: "FTL",
}
