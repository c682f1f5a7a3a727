"""`skippyctl events …`: discover event ids (and, later, follow the stream)."""

from __future__ import annotations

from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from skippyctl.events.catalog import CATALOG
from skippyctl.events.reasons import Category

events_app = typer.Typer(help="Event ids and event streams.", no_args_is_help=True)


@events_app.command("catalog")
def catalog_command(
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per event id on stdout.")
    ] = False,
    category: Annotated[
        list[Category] | None, typer.Option("--category", help="Only these categories.")
    ] = None,
) -> None:
    """List every event id with its category, delivery class, severity and meaning.

    Example:

        skippyctl events catalog --json | jq -r 'select(.category=="model_loading") | .id'
    """
    specs = [s for s in CATALOG.values() if not category or s.category in category]
    if json_output:
        for spec in specs:
            typer.echo(
                orjson.dumps(
                    {
                        "schema_version": 1,
                        "id": spec.id.value,
                        "category": spec.category.value,
                        "class": spec.delivery.value,
                        "severity": spec.severity.value,
                        "description": spec.description,
                    }
                )
            )
        return
    table = Table("id", "category", "class", "severity", "description", box=None)
    for spec in specs:
        table.add_row(
            spec.id.value,
            spec.category.value,
            spec.delivery.value,
            spec.severity.value,
            spec.description,
        )
    Console().print(table)
