"""Keyed, diffing updates of a Textual `DataTable` from a list of rows.

Contract: `KeyedRows.show(rows)` makes the table show exactly `rows` (key, cells), in order. When
the keys are the same as last time only changed cells are updated, so the cursor and scroll
position stay put; when keys change the table is rebuilt and the cursor returns to the row it was
on (by key). Work is proportional to the rows shown, which callers bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

Cells = tuple[RenderableType, ...]
Rows = Sequence[tuple[str, Cells]]


def _cell(value: RenderableType) -> RenderableType:
    """Plain strings become literal text (a DataTable would parse them as markup); text that
    does not fit its column ends in an ellipsis instead of wrapping."""
    if isinstance(value, str):
        return Text(value, no_wrap=True, overflow="ellipsis")
    if isinstance(value, Text) and value.overflow is None:
        value.no_wrap = True
        value.overflow = "ellipsis"
    return value


class SizedTable(DataTable[Any]):
    """A DataTable whose header follows its columns' widths.

    DataTable measures new or changed cells on idle, after it may already have drawn them; its
    render caches are keyed without the column width, so a header drawn before the measuring
    kept its old widths above rows drawn at the new ones (seen on a loaded machine, until the
    next update). Dropping the caches once the widths are known redraws everything at them."""

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        widths = [column.content_width for column in self.ordered_columns]
        super()._update_dimensions(new_rows)
        if widths != [column.content_width for column in self.ordered_columns]:
            self._clear_caches()


class KeyedRows:
    """Remembers what a table shows so the next `show` can update only what changed."""

    def __init__(self, table: DataTable[Any]) -> None:
        self.table = table
        self._keys: list[str] = []
        self._cells: dict[str, Cells] = {}

    def show(self, rows: Rows, *, stick_to_top: bool = False) -> None:
        """Show `rows`. With `stick_to_top`, a cursor on the first row stays on the first row
        (a newest-first log keeps following the newest event)."""
        table = self.table
        keys = [key for key, _ in rows]
        if keys == self._keys:
            columns = [column.key for column in table.ordered_columns]
            for key, cells in rows:
                old = self._cells.get(key)
                for index, value in enumerate(cells):
                    if old is None or old[index] != value:
                        table.update_cell(key, columns[index], _cell(value), update_width=True)
        else:
            cursor_key = None if stick_to_top and table.cursor_row <= 0 else self._cursor_key()
            table.clear()
            for key, cells in rows:
                table.add_row(*(_cell(value) for value in cells), key=key)
            if cursor_key is not None and cursor_key in self._cells_for(rows):
                table.move_cursor(row=keys.index(cursor_key), animate=False)
        self._keys = keys
        self._cells = dict(rows)

    def _cursor_key(self) -> str | None:
        if not self._keys:
            return None
        row = self.table.cursor_row
        return self._keys[row] if 0 <= row < len(self._keys) else None

    @staticmethod
    def _cells_for(rows: Rows) -> frozenset[str]:
        return frozenset(key for key, _ in rows)
