"""The "Load model…" dialog: asks for a GGUF path and returns it (None when cancelled).

The path is the runtime's (in the fleet dashboard, the chosen node's, named in the title): the
dialog does not check it exists here, the runtime answers with events (`model_load_failed` with
`missing_artifact` when it does not).
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class LoadModelScreen(ModalScreen[str | None]):
    """Modal: one input for the model path; enter loads, escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, node: str | None = None) -> None:
        """`node`: the fleet member the load is for (named in the title)."""
        super().__init__()
        self.node = node

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog") as dialog:
            dialog.border_title = (
                "Load model" if self.node is None else f"Load model on {self.node}"
            )
            yield Label("Path to a GGUF file (first part of a split set):")
            yield Input(placeholder="models/tiny.gguf", id="load-path")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Load", variant="primary", id="load")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#load-path", Input).focus()

    def _submit(self) -> None:
        path = self.query_one("#load-path", Input).value.strip()
        if path:
            self.dismiss(path)

    @on(Input.Submitted, "#load-path")
    def _entered(self) -> None:
        self._submit()

    @on(Button.Pressed, "#load")
    def _load(self) -> None:
        self._submit()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
