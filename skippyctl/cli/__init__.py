"""The Typer CLI (a consumer: imports the core, never the other way round)."""
