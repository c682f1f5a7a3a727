"""A quick CLI: a command imports what it uses when it runs (`skippyctl.cli.lazy_group`).

Checked by what a run imported, never by how long it took (the figures are
`benchmarks/cli_startup.py`'s, in docs/BENCHMARKS.md).
"""

from __future__ import annotations

import subprocess
import sys

import orjson

from skippyctl.cli.app import COMMANDS

COMMAND_MODULES = sorted({ref.module for ref in COMMANDS.values()})
HEAVY = ("httpx", "rich", "pydantic", "textual", "skippyctl.events.catalog")

_RUN = """
import sys
sys.argv = ["skippyctl", *{args!r}]
from skippyctl.cli.app import main
try:
    main()
finally:
    sys.stderr.write("\\nMODULES " + " ".join(sorted(sys.modules)) + "\\n")
"""


def _imported(*args: str) -> tuple[int, str, set[str]]:
    """Run `skippyctl ARGS` in a fresh interpreter: (exit code, stdout, modules it imported)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN.format(args=list(args))],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    marker = proc.stderr.rindex("\nMODULES ")
    return proc.returncode, proc.stdout, set(proc.stderr[marker + 9 :].split())


def test_importing_the_app_imports_no_command() -> None:
    code = "import json, sys, skippyctl.cli.app; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(orjson.loads(out.stdout))
    assert modules.isdisjoint(COMMAND_MODULES)
    assert modules.isdisjoint(HEAVY)


def test_version_imports_no_command_and_no_http_client() -> None:
    code, stdout, modules = _imported("--version")
    assert (code, stdout) == (0, "skippyctl 0.1.0\n")
    assert modules.isdisjoint(COMMAND_MODULES)
    assert modules.isdisjoint(HEAVY)


def test_ps_json_imports_ps_alone_and_no_http_library_tables_or_pydantic() -> None:
    code, stdout, modules = _imported("ps", "--json")  # starts this test's own runtime
    assert code == 0
    assert orjson.loads(stdout)["record"] == "state"
    assert [m for m in COMMAND_MODULES if m in modules] == ["skippyctl.cli.ps"]
    # httpx: only the live stream uses it; pydantic: Typer coerces an absent flag through it
    # unless the flag is settled as False
    assert modules.isdisjoint(HEAVY)
    assert modules.isdisjoint(("httpcore", "h11", "skippyctl.output.state_reader"))
    assert "skippyctl.cli.state_tables" not in modules


def test_each_command_is_loaded_only_when_asked_for() -> None:
    code, _, modules = _imported("events", "catalog", "--json")
    assert code == 0
    assert [m for m in COMMAND_MODULES if m in modules] == ["skippyctl.cli.events"]
