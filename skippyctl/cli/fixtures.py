"""`skippyctl fixtures make DIR`: generate the deterministic fixture models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console

fixtures_app = typer.Typer(help="Generate deterministic GGUF fixture models.", no_args_is_help=True)


@fixtures_app.command("make")
def make_command(
    directory: Annotated[Path, typer.Argument(help="Directory to write the fixtures into.")],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON record listing the files.")
    ] = False,
) -> None:
    """Write the tiny model, its 3-part split, the malformed variants and the tiny successor
    model (known greedy output) into DIRECTORY.

    Example:

        skippyctl fixtures make fixtures && skippyctl load fixtures/tiny.gguf
    """
    from skippyctl.fixtures import make_fixtures

    fixture_set = make_fixtures(directory)
    files = {name: str(getattr(fixture_set, name)) for name in fixture_set.__dataclass_fields__}
    if json_output:
        typer.echo(orjson.dumps({"schema_version": 1, "record": "fixtures", "files": files}))
    else:
        console = Console(stderr=True)
        for name, path in files.items():
            console.print(f"{name:>20}  {path}", highlight=False)
