"""Pane 1, Models: one row per model the reducer knows.

Columns: model, state, detail, device, weights, device free memory, context, lanes in use/lanes,
queue depth, decode rate (a download's rate in MiB/s). The state reads `loading` for every
pre-available state (requested, loading, initializing) with the load phase and a progress bar
in the detail column: a loading model is never shown as down. A failed, cancelled or
unavailable model shows its reason code; an idle model with an idle TTL, when it unloads unless
a request comes; a pinned one (`load --pin`, a preset's `pinned`) says so; a serving model
with serving plugins shows each one's delivery counters (messages sent, late and otherwise
discarded proposals, failures) or that it is disabled or did not load. A download the
runtime is making (a pull, or an hf:// preset being fetched) is a row of its own with its bytes
and rate while it runs. Last, a row per model the runtime
may load on demand (`loadable`: where it comes from, pinned, its idle TTL once loaded), up to
`MAX_LOADABLE_ROWS`; one that the client's state already shows loading or serving is not
repeated (the list comes from the state document, read less often than events arrive).

In the fleet dashboard the first column is the node (red while the node is down: its rows are
then its last known state) and every node the filter selects has its rows, node by node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from skippy_tui import format as fmt
from skippy_tui.store import DashboardSnapshot, Download, model_phase
from skippy_tui.tables import Cells, KeyedRows, SizedTable
from skippy_tui.widgets.pane import NODE_COLUMN, NodePart, Pane, node_cell, row_key, same_inputs
from skippyctl.config.durations import format_duration_s
from skippyctl.events.envelope import LogicalId
from skippyctl.output.state_reader import LoadableEntry
from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    ModelState,
    ModelView,
    PluginState,
    PluginView,
    lanes_in_use,
    queue_depth,
)

COLUMNS: Final = (
    "Model",
    "State",
    "Detail",
    "Device",
    "Weights",
    "Dev free",
    "Context",
    "Lanes",
    "Queue",
    "Decode",
)
PHASE_WIDTH: Final = 15
MAX_LOADABLE_ROWS: Final = 64
"""Loadable models shown as rows (a models directory may hold thousands); the rest are one
`+N more` row."""
LOADABLE_KEY: Final = "loadable/"
"""A loadable row's key is this and its model id: no model id holds a `/`, so no model's own
row (keyed by its id) can take it."""


def detail(snapshot: DashboardSnapshot, model: ModelView) -> Text:
    """Phase and progress while loading; the reason when it failed; readiness otherwise; a
    restart of its crashed engine first while one is under way; its serving plugins last."""
    text = _detail(snapshot, model)
    if model.plugins and model.state in SERVING_MODEL_STATES:
        for plugin in model.plugins:
            text.append_text(plugin_text(plugin))
    if model.recovery_attempt is not None:
        return Text(f"restart {model.recovery_attempt} · ", style="yellow").append_text(text)
    return text


def plugin_text(plugin: PluginView) -> Text:
    """`` · NAME: N sent, N late, N discarded, N failed`` (the counts that are not 0 after
    ``sent``), or that it is disabled or did not load."""
    name = str(plugin.plugin_id)
    if plugin.state is PluginState.DISABLED:
        return Text(f" · {name} disabled", style="yellow")
    if plugin.state is PluginState.LOAD_FAILED:
        return Text(f" · {name} not loaded", style="yellow")
    discarded = (
        plugin.discarded_invalid_token_count
        + plugin.discarded_invalid_token_id
        + plugin.discarded_position_mismatch
        + plugin.discarded_execution_failed
    )
    parts = [f"{fmt.compact(plugin.delivered)} sent"]
    for n, word in ((plugin.late, "late"), (discarded, "discarded"), (plugin.failures, "failed")):
        if n:
            parts.append(f"{fmt.compact(n)} {word}")
    return Text(f" · {name}: " + ", ".join(parts), style="dim")


def _detail(snapshot: DashboardSnapshot, model: ModelView) -> Text:
    state = model.state
    if state in LOADING_MODEL_STATES:
        phase = model_phase(snapshot, model.model_id, state)
        text = Text(f"{phase:<{PHASE_WIDTH}.{PHASE_WIDTH}} ")
        if state is ModelState.INITIALIZING:
            text.append_text(fmt.bar(1, 1))
        elif model.progress is not None:
            text.append_text(fmt.bar(model.progress.current, model.progress.total))
        else:
            text.append_text(fmt.bar(0, None))
        return text
    if model.reason_code is not None and state is not ModelState.AVAILABLE:
        return Text(model.reason_code.value, style=fmt.MODEL_STYLES[state])
    topology = (
        snapshot.view.topologies.get(model.topology_id) if model.topology_id is not None else None
    )
    if state in (ModelState.DEGRADED, ModelState.UNAVAILABLE) and topology is not None:
        return Text(
            f"topology {topology.topology_id} {topology.state.value}",
            style=fmt.MODEL_STYLES[state],
        )
    if state is ModelState.AVAILABLE:
        text = Text(f"ready in {fmt.millis(model.load_duration_ms)}", style="green")
        if model.kv.pressure:
            text.append(" · KV pressure", style="yellow")
        if any(s.key == "pinned" and s.value is True for s in model.settings):
            text.append(" · pinned", style="dim")
        if model.idle_expires_wall_ns is not None:
            # A clock time, not a countdown: the pane redraws only when the state changes.
            at = time.strftime("%H:%M:%S", time.localtime(model.idle_expires_wall_ns / 1e9))
            text.append(f" · idle, unloads {at}", style="dim")
        return text
    return Text(state.value, style=fmt.MODEL_STYLES[state])


def _context(model: ModelView) -> str:
    """The whole context, or `lanes×per lane` when several lanes split it."""
    per_lane, lanes = model.context_tokens_per_lane, model.lanes
    if per_lane is not None and lanes is not None and lanes > 1:
        return f"{lanes}×{fmt.count(per_lane)}"
    return fmt.count(model.context_tokens)


def model_row(snapshot: DashboardSnapshot, model: ModelView) -> Cells:
    view = snapshot.view
    lanes = model.lanes
    in_use = lanes_in_use(view, model.model_id)
    return (
        Text(str(model.model_id), style="bold"),
        fmt.model_state(model.state),
        detail(snapshot, model),
        str(model.device_id) if model.device_id is not None else fmt.DASH,
        fmt.size(model.model_size_bytes),
        fmt.size(model.device_memory_free_bytes),
        _context(model),
        f"{in_use}/{lanes}" if lanes is not None else fmt.DASH,
        str(queue_depth(view, model.model_id)),
        fmt.rate(model.decode_tokens_per_s, "t/s"),
    )


def download_row(download: Download) -> Cells:
    """A download the runtime is making (a pull), until it ends."""
    detail = Text(f"{'downloading':<{PHASE_WIDTH}.{PHASE_WIDTH}} ")
    detail.append_text(fmt.bar(download.bytes_done, download.bytes_total))
    detail.append(f" {fmt.size(download.bytes_done)} of {fmt.size(download.bytes_total)}")
    return (
        Text(str(download.model_id or "model"), style="bold"),
        Text("pulling", style="cyan"),
        detail,
        fmt.DASH,
        fmt.size(download.bytes_total),
        fmt.DASH,
        fmt.DASH,
        fmt.DASH,
        fmt.DASH,
        fmt.rate(download.bytes_per_s / (1024 * 1024), "MiB/s")
        if download.bytes_per_s is not None
        else fmt.DASH,
    )


def loadable_row(entry: LoadableEntry) -> Cells:
    """A model the runtime may load on demand: where it comes from, pinned or its idle TTL."""
    detail = Text(entry.source)
    if entry.pinned:
        detail.append(" · pinned", style="dim")
    elif entry.idle_ttl_s is not None:
        detail.append(f" · idle {format_duration_s(entry.idle_ttl_s)}", style="dim")
    return (
        Text(entry.model_id),
        Text("loadable", style="blue"),
        detail,
        *(fmt.DASH,) * (len(COLUMNS) - 3),
    )


def _more_row(count: int) -> Cells:
    """The loadable models past `MAX_LOADABLE_ROWS`, counted."""
    return (
        Text(f"+{count} more", style="dim"),
        Text("loadable", style="blue"),
        *(fmt.DASH,) * (len(COLUMNS) - 2),
    )


def _unloaded(snapshot: DashboardSnapshot) -> list[LoadableEntry]:
    """The loadable models the client's own state does not show loading or serving."""
    models = snapshot.view.models
    present = {
        str(model_id)
        for model_id, model in models.items()
        if model.state in SERVING_MODEL_STATES or model.state in LOADING_MODEL_STATES
    }
    return [entry for entry in snapshot.loadable if entry.model_id not in present]


class ModelsPane(Pane):
    """Models, their availability, load progress and serving capacity."""

    NUMBER = 1
    TITLE = "Models"
    DETAIL = False

    def __init__(self, *, id: str | None = None, fleet: bool = False) -> None:
        super().__init__(id=id, fleet=fleet)
        self._table: DataTable[Any] = SizedTable(
            id="models-table", cursor_type="row", zebra_stripes=True
        )
        self._rows = KeyedRows(self._table)
        self._inputs: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield self._table

    def on_mount(self) -> None:
        for label in (NODE_COLUMN, *COLUMNS) if self.fleet else COLUMNS:
            self._table.add_column(label, key=label)

    def show_parts(self, parts: Sequence[NodePart]) -> None:
        inputs = tuple(
            value
            for name, snapshot in parts
            for value in (
                name,
                snapshot.view.models,
                snapshot.view.requests,
                snapshot.phases,
                snapshot.downloads,
                snapshot.loadable,
                snapshot.connection if name is not None else None,
            )
        )
        if same_inputs(inputs, self._inputs):
            return
        self._inputs = inputs
        rows: list[tuple[str, Cells]] = []
        serving = total = loadable_count = 0
        for name, snapshot in parts:
            node_rows, loadable = _node_rows(snapshot)
            if name is not None:
                node = node_cell(name, snapshot)
                node_rows = [(row_key(name, key), (node, *cells)) for key, cells in node_rows]
            rows += node_rows
            models = snapshot.view.models.values()
            serving += sum(1 for m in models if m.state in SERVING_MODEL_STATES)
            total += len(snapshot.view.models)
            loadable_count += len(loadable)
        self._rows.show(rows)
        subtitle = [f"{serving}/{total} serving"] if total else []
        if loadable_count:
            subtitle.append(f"{loadable_count} loadable")
        self.border_subtitle = " · ".join(subtitle) or "no models"


def _node_rows(snapshot: DashboardSnapshot) -> tuple[list[tuple[str, Cells]], list[LoadableEntry]]:
    """One runtime's rows (models, downloads, loadable models) and the loadable models."""
    models: Mapping[LogicalId, ModelView] = snapshot.view.models
    rows = [(str(model_id), model_row(snapshot, models[model_id])) for model_id in sorted(models)]
    rows += [
        (f"download:{key}", download_row(download))
        for key, download in sorted(snapshot.downloads.items())
    ]
    loadable = _unloaded(snapshot)
    rows += [
        (f"{LOADABLE_KEY}{entry.model_id}", loadable_row(entry))
        for entry in loadable[:MAX_LOADABLE_ROWS]
    ]
    if len(loadable) > MAX_LOADABLE_ROWS:
        rows.append((f"{LOADABLE_KEY}+more", _more_row(len(loadable) - MAX_LOADABLE_ROWS)))
    return rows, loadable
