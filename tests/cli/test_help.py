"""Every command documents itself: `--help` exits 0 and shows an Example."""

from __future__ import annotations

import pytest

from tests.cli.helpers import run_cli

COMMANDS = [
    ("pull",),
    ("load",),
    ("unload",),
    ("ps",),
    ("status",),
    ("events",),
    ("events", "catalog"),
    ("wait",),
    ("generate",),
    ("doctor",),
    ("tui",),
    ("top",),
    ("stage", "serve"),
    ("stage", "relay"),
    ("diagnostics", "record"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0_with_an_example(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help")
    assert result.code == 0, result.stderr
    assert "Example" in result.stdout
