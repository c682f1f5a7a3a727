"""The state document for people: the tables and lines `skippyctl ps` prints.

Kept apart from the command so that `ps --json` (a script's call) imports neither Rich nor the
state reader: it prints the document as it came.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from skippyctl.config.durations import format_duration_s
from skippyctl.events.reasons import ReasonCode
from skippyctl.output.state_reader import (
    EnumValue,
    LoadableEntry,
    ModelEntry,
    StageEntry,
    StateDocumentView,
    TopologyEntry,
)
from skippyctl.output.summary import format_bytes
from skippyctl.reducer.state import LOADING_MODEL_STATES, ModelState, StageState, TopologyState

_STATE_STYLES: Final[dict[ModelState, str]] = {
    ModelState.AVAILABLE: "green",
    ModelState.DEGRADED: "yellow",
    ModelState.REQUESTED: "cyan",
    ModelState.LOADING: "cyan",
    ModelState.INITIALIZING: "cyan",
    ModelState.UNLOADING: "magenta",
    ModelState.FAILED: "red",
    ModelState.UNAVAILABLE: "red",
    ModelState.CANCELLED: "dim",
    ModelState.UNLOADED: "dim",
}


_STAGE_STYLES: Final[dict[StageState | TopologyState, str]] = {
    StageState.STARTING: "cyan",
    StageState.LOADING: "cyan",
    StageState.READY: "green",
    StageState.DEGRADED: "yellow",
    StageState.UNAVAILABLE: "bold red",
    StageState.STOPPING: "magenta",
    StageState.STOPPED: "dim",
    StageState.FAILED: "bold red",
    TopologyState.ASSEMBLING: "cyan",
    TopologyState.READY: "green",
    TopologyState.DEGRADED: "yellow",
    TopologyState.UNAVAILABLE: "bold red",
}


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _state_cell(model: ModelEntry) -> str:
    state = model.state
    style = "default" if state.member is None else _STATE_STYLES[state.member]
    text = f"[{style}]{state.text}[/]"
    progress = model.progress
    if state.member in LOADING_MODEL_STATES and progress is not None and progress.total:
        text += f" {100.0 * progress.current / progress.total:.0f}%"
    if model.reason_code is not None and model.reason_code.text:
        text += f" [dim]({model.reason_code.text})[/]"
    if model.recovery_attempt is not None:
        text += f" [yellow]restart {model.recovery_attempt}[/]"
    return text


def idle_line(model_id: str, expires_at: datetime) -> str:
    """When an idle model unloads unless a request comes (a line of its own, as its options)."""
    left = max(0.0, (expires_at - datetime.now(UTC)).total_seconds())
    return f"  [dim]{escape(model_id)} idle:[/] unloads in {format_duration_s(left)}"


def _memory_cell(model: ModelEntry) -> str:
    """The model's size (the device's free/total memory is in `--json`)."""
    return _bytes(model.model_size_bytes)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _context_cell(model: ModelEntry) -> str:
    """The whole context, or `lanes×per lane` when several lanes split it."""
    per_lane, lanes = model.context_tokens_per_lane, model.lanes
    if per_lane is not None and lanes is not None and lanes > 1:
        return f"{lanes}×{per_lane}"
    return _or_dash(model.context_tokens)


def options_line(model: ModelEntry) -> str:
    """What the model's load asked for beyond the defaults, as `name=value` pairs (a line of
    its own under the table: a column would not fit 80 characters)."""
    pairs = " ".join(f"{key}={_setting(value)}" for key, value in model.settings)
    if model.batch_invariant:
        pairs += " · batch-invariant"
    elif model.batch_invariant is False and ("flash_attn", "on") not in model.settings:
        # A load without flash attention (the default on a CPU) whose probe failed.
        pairs += " · not batch-invariant"
    return f"  [dim]{escape(model.model_id)} options:[/] {escape(pairs)}"


def _setting(value: int | float | bool | str) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def models_table(state: StateDocumentView) -> Table:
    # Every session the document lists is open (a closed one leaves the state).
    sessions: dict[str, int] = {}
    for session in state.sessions:
        if session.model_id is not None:
            sessions[session.model_id] = sessions.get(session.model_id, 0) + 1
    table = Table(
        "model",
        "state",
        "device",
        "memory",
        "ctx",
        "lanes",
        "queue",
        "sessions",
        "decode tok/s",
        box=None,
        header_style="bold",
    )
    for model in state.models:
        rate = model.decode_tokens_per_s
        table.add_row(
            escape(model.model_id),
            _state_cell(model),
            escape(_or_dash(model.device_id)),
            _memory_cell(model),
            _context_cell(model),
            f"{model.lanes_in_use}/{_or_dash(model.lanes)}",
            str(model.queue_depth),
            str(sessions.get(model.model_id, 0)),
            "-" if rate is None else f"{rate:.1f}",
        )
    return table


def speculation_line(model: ModelEntry) -> str:
    """How speculation went for the model's ended requests (printed once any verified)."""
    share = acceptance_cell(model.spec_accepted_tokens, model.spec_proposed_tokens)
    return (
        f"  {escape(model.model_id)} speculation: {share} of "
        f"{model.spec_proposed_tokens:,} proposed tokens accepted"
    )


def acceptance_cell(accepted: int, proposed: int) -> str:
    """Speculation's share of the proposed tokens it verified that were accepted; "-" before
    any was verified."""
    if not proposed:
        return "-"
    return f"{100.0 * accepted / proposed:.0f}%"


def sessions_table(state: StateDocumentView) -> Table:
    """The open sessions: model, state and their requests' speculation acceptance."""
    table = Table("session", "model", "state", "accept", box=None, header_style="bold")
    for session in state.sessions:
        table.add_row(
            escape(session.session_id),
            escape(_or_dash(session.model_id)),
            escape(session.state.text),
            acceptance_cell(session.spec_accepted_tokens, session.spec_proposed_tokens),
        )
    return table


def _idle_ttl_cell(entry: LoadableEntry) -> str:
    return "never" if entry.idle_ttl_s is None else format_duration_s(entry.idle_ttl_s)


def loadable_table(state: StateDocumentView) -> Table:
    """The models the runtime may load on demand that are neither loaded nor loading: where
    each comes from, whether it is pinned, how long it stays idle once loaded."""
    table = Table("loadable", "source", "pinned", "idle ttl", box=None, header_style="bold")
    for entry in state.loadable:
        table.add_row(
            escape(entry.model_id),
            escape(entry.source),
            "yes" if entry.pinned else "-",
            _idle_ttl_cell(entry),
        )
    return table


def _stage_state_cell(
    state: EnumValue[StageState] | EnumValue[TopologyState],
    reason: EnumValue[ReasonCode] | None,
) -> str:
    style = "default" if state.member is None else _STAGE_STYLES[state.member]
    text = f"[{style}]{escape(state.text)}[/]"
    if reason is not None and reason.text:
        text += f" [dim]({escape(reason.text)})[/]"
    return text


def _layers_cell(stage: StageEntry) -> str:
    layers = stage.layers
    if layers is None:
        return "-"
    if len(layers) == 1:
        return str(layers.start)
    return f"{layers.start}-{layers.stop - 1}"


def _stage_memory_cell(stage: StageEntry) -> str:
    """The plan's share of the weights / what the stage offered."""
    if stage.planned_bytes is None and stage.offered_bytes is None:
        return "-"
    return f"{_bytes(stage.planned_bytes)} / {_bytes(stage.offered_bytes)}"


def _rtt_cell(stage: StageEntry) -> str:
    if stage.link_rtt_ms is None:
        return "-"
    if stage.link_jitter_ms is None:
        return f"{stage.link_rtt_ms:.2f} ms"
    return f"{stage.link_rtt_ms:.2f} ±{stage.link_jitter_ms:.2f} ms"


def topology_heading(model: ModelEntry, topology: TopologyEntry) -> str:
    parts = [f"{len(topology.stages)} stage(s)"]
    if topology.layers is not None:
        parts.append(f"{topology.layers} layers")
    return (
        f"[bold]{escape(model.model_id)}[/] ▸ {escape(topology.topology_id)} "
        f"{_stage_state_cell(topology.state, topology.reason_code)} · {' · '.join(parts)}"
    )


def stages_table(topology: TopologyEntry) -> Table:
    """One row per stage: id, layer range, memory, state (and reason), link RTT ±jitter."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("  stage", no_wrap=True)
    table.add_column("layers", no_wrap=True)
    table.add_column("plan / offered", no_wrap=True)
    table.add_column("state")
    table.add_column("rtt ±jitter")
    for stage in topology.stages:
        index = "?" if stage.stage_index is None else str(stage.stage_index)
        lost = stage.state.member in (StageState.UNAVAILABLE, StageState.FAILED)
        name = f"#{index} {escape(stage.stage_id)}"
        table.add_row(
            f"  [bold red]✗ {name}[/]" if lost else f"  {name}",
            _layers_cell(stage),
            _stage_memory_cell(stage),
            _stage_state_cell(stage.state, stage.reason_code),
            _rtt_cell(stage),
        )
    return table


def health_line(state: StateDocumentView) -> str:
    system = state.event_system
    dropped = (
        system.dropped_terminal
        + system.dropped_state
        + system.dropped_progress
        + system.dropped_diagnostic
        + system.dropped_native
    )
    lagging = (
        state.subscribers_lagging
        if state.subscribers_lagging is not None
        else system.lagging_subscribers
    )
    style = "green" if dropped == 0 and not lagging else "yellow"
    return (
        f"[{style}]events[/]: {dropped} dropped, {system.coalesced} coalesced, "
        f"{system.sampled} sampled, {lagging} lagging subscriber(s), "
        f"{system.replay_gaps} replay gap(s)"
    )


def warnings_line(state: StateDocumentView) -> str:
    """The active structured warnings and degraded modes, one line."""
    parts = []
    for warning in state.warnings:
        details = ", ".join(d for d in (warning.about, warning.reason_code) if d)
        parts.append(f"{warning.code} ({details})" if details else warning.code)
    parts += [f"degraded: {mode}" for mode in state.degraded_modes]
    return "[yellow]warnings[/]: " + escape(", ".join(parts))


def print_state(state: StateDocumentView, url: str, out: Console) -> None:
    """The whole `ps` view: the runtime line, the models (the options their loads asked for,
    any split model's topology), the models it may load on demand, the event system's health
    and the active warnings."""
    out.print(
        f"[bold]runtime[/] {state.runtime.text} · node [bold]{state.node.text}[/] · "
        f"native {state.native_mode.text} · {url}"
    )
    if state.models:
        out.print(models_table(state))
        for model in state.models:
            if model.settings:
                out.print(options_line(model))
            if model.spec_proposed_tokens:
                out.print(speculation_line(model))
            if model.idle_expires_at is not None:
                out.print(idle_line(model.model_id, model.idle_expires_at))
        for model in state.models:
            topology = state.topology_of(model)
            if topology is not None:
                out.print(topology_heading(model, topology))
                out.print(stages_table(topology))
    else:
        out.print("[dim]no models loaded (skippyctl load FILE.gguf)[/]")
    if state.sessions:
        out.print(sessions_table(state))
    if state.loadable:
        out.print(loadable_table(state))
    out.print(health_line(state))
    if state.warnings or state.degraded_modes:
        out.print(warnings_line(state))
