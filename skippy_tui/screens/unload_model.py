"""The "Unload model…" dialog: pick a model, optionally force; returns (model_id, force) or None.

Force cancels the model's in-flight requests instead of draining its sessions first.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Label, OptionList


class UnloadModelScreen(ModalScreen[tuple[str, bool] | None]):
    """Modal: a list of models and a force checkbox; enter on a model unloads it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, model_ids: Sequence[str], node: str | None = None) -> None:
        """`node`: the fleet member the models are on (named in the title)."""
        super().__init__()
        self.model_ids = tuple(model_ids)
        self.node = node

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog") as dialog:
            dialog.border_title = (
                "Unload model" if self.node is None else f"Unload model on {self.node}"
            )
            yield Label("Model to unload:")
            yield OptionList(*self.model_ids, id="unload-models")
            yield Checkbox("Force (cancel in-flight requests, no draining)", id="unload-force")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Unload", variant="error", id="unload")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        options = self.query_one("#unload-models", OptionList)
        options.highlighted = 0
        options.focus()

    def _submit(self) -> None:
        options = self.query_one("#unload-models", OptionList)
        index = options.highlighted
        if index is None:
            return
        force = self.query_one("#unload-force", Checkbox).value
        self.dismiss((self.model_ids[index], force))

    @on(OptionList.OptionSelected, "#unload-models")
    def _selected(self) -> None:
        self._submit()

    @on(Button.Pressed, "#unload")
    def _unload(self) -> None:
        self._submit()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
