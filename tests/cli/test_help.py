"""Every command documents itself: `--help` exits 0, shows an Example, and shows a flag as a
flag (no value column: typer 0.29's Rich help printed `<bool>` for every flag)."""

from __future__ import annotations

import inspect
import re
from importlib import import_module

import pytest
import typer
from typer.main import solve_typer_info_help
from typer.models import TyperInfo

from skippyctl.cli.app import COMMANDS as TOP_LEVEL
from tests.cli.helpers import run_cli

WIDE = {"COLUMNS": "200"}  # no help line wraps
COMMANDS = [
    ("pull",),
    ("load",),
    ("unload",),
    ("ps",),
    ("status",),
    ("events",),
    ("events", "catalog"),
    ("wait",),
    ("tune",),
    ("models", "list"),
    ("models", "rm"),
    ("models", "prune"),
    ("generate",),
    ("doctor",),
    ("tui",),
    ("top",),
    ("fixtures", "make"),
    ("runtime", "serve"),
    ("runtime", "start"),
    ("runtime", "stop"),
    ("runtime", "status"),
    ("stage", "serve"),
    ("stage", "relay"),
    ("diagnostics", "record"),
    ("fleet", "add"),
    ("fleet", "rm"),
    ("fleet", "list"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0_with_an_example_and_flags_without_a_value(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help", env=WIDE)
    assert result.code == 0, result.stderr
    assert "Example" in result.stdout
    assert "<bool>" not in result.stdout
    assert re.search(r"--help\s+Show this message and exit\.", result.stdout), result.stdout


def test_every_command_is_covered_here() -> None:
    assert {command[0] for command in COMMANDS} == set(TOP_LEVEL)


def test_the_top_level_help_lists_every_command_with_its_summary() -> None:
    result = run_cli("--help", env=WIDE)
    assert result.code == 0, result.stderr
    options = result.stdout.split("Commands", 1)[0]
    assert re.search(r"--version\s+Print the version and exit\.", options), options
    assert "<bool>" not in options
    listed = re.findall(r"^│ (\S+)\s+(.+?)\s*│$", result.stdout.split("Commands", 1)[1], re.M)
    assert [name for name, _ in listed] == list(TOP_LEVEL)
    for name, summary in listed:
        ref = TOP_LEVEL[name]
        target = getattr(import_module(ref.module), ref.attribute)
        if isinstance(target, typer.Typer):
            doc = solve_typer_info_help(TyperInfo(target))
        else:
            doc = inspect.getdoc(target) or ""
        assert summary == doc.split("\n\n")[0].replace("\n", " "), name


def test_version() -> None:
    result = run_cli("--version")
    assert (result.code, result.stdout, result.stderr) == (0, "skippyctl 0.1.0\n", "")
