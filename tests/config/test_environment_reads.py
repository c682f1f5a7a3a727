"""Only the settings module reads the environment (config/runtime_settings.py's contract).

An AST scan of every module of ``skippyctl`` and ``skippy_tui``: reading ``os.environ`` (or
``os.getenv``, ``os.putenv``, ``from os import environ`` …) anywhere else, or handing a variable
to click/Typer to read (``envvar=``), fails, unless the place is on the allow-list below with
its reason (empty today: variables of third-party code reach it through the settings, e.g.
``otel_environment``, or are read by the library itself). An allow-list entry that no longer
reads anything fails too, so the list only shrinks."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("skippyctl", "skippy_tui")
ENVIRONMENT_NAMES: Final = frozenset(
    {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
)
SETTINGS_MODULE: Final = "skippyctl/config/runtime_settings.py"
ALLOWED: Final[dict[tuple[str, str], str]] = {
    ("skippyctl/engine/engine_worker.py", "main"): (
        "libgomp takes its spin count only from GOMP_SPINCOUNT, read once when llama.cpp is "
        "mapped: the engine turns its --omp-spin-count option into it (an operator's own "
        "GOMP_SPINCOUNT or OMP_WAIT_POLICY wins)"
    ),
}
"""(module, enclosing function or ``<module>``) → why it may read the environment. The
settings module reads it by definition and is not listed."""


@dataclass(frozen=True, slots=True)
class Read:
    path: str
    scope: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.scope}): {self.what}"


class _Finder(ast.NodeVisitor):
    """Every place a module reads (or writes) the process environment."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.os_names: set[str] = set()
        self.scopes: list[str] = []
        self.reads: list[Read] = []

    def _add(self, node: ast.AST, what: str) -> None:
        scope = self.scopes[-1] if self.scopes else "<module>"
        self.reads.append(Read(self.path, scope, getattr(node, "lineno", 0), what))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.scopes.append(node.name)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "os":
                self.os_names.add(alias.asname or "os")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "os":
            for alias in node.names:
                if alias.name in ENVIRONMENT_NAMES:
                    self._add(node, f"from os import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if (
            isinstance(value, ast.Name)
            and value.id in self.os_names
            and node.attr in ENVIRONMENT_NAMES
        ):
            self._add(node, f"os.{node.attr}")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg == "envvar":
            self._add(node.value, "envvar= (click/Typer reads the variable)")
        self.generic_visit(node)


def environment_reads(source: str, path: str) -> list[Read]:
    finder = _Finder(path)
    finder.visit(ast.parse(source))
    return finder.reads


def _every_read() -> list[Read]:
    reads = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            reads += environment_reads(file.read_text(encoding="utf-8"), path)
    return reads


def test_only_the_settings_module_reads_the_environment() -> None:
    reads = _every_read()
    unexpected = [
        str(read)
        for read in reads
        if read.path != SETTINGS_MODULE and (read.path, read.scope) not in ALLOWED
    ]
    assert unexpected == [], (
        "read the setting once in skippyctl/config/runtime_settings.py and pass it down: "
        + "; ".join(unexpected)
    )
    places = {(read.path, read.scope) for read in reads}
    stale = [f"{path} ({scope})" for path, scope in ALLOWED if (path, scope) not in places]
    assert stale == [], f"remove from ALLOWED: {stale}"


def test_the_settings_module_is_where_the_environment_is_read() -> None:
    reads = [read for read in _every_read() if read.path == SETTINGS_MODULE]
    assert {read.scope for read in reads} == {
        "read_runtime_settings",
        "inherited_environment",
        "variable_a_file_names",  # a fleet entry's key_env (config/fleet.py)
    }


def test_the_scan_finds_every_spelling_of_a_read() -> None:
    source = """
import os
import os as system
from os import environ as env, getenv
import typer

x = os.environ.get("A")
def f():
    return system.getenv("B")
class C:
    def m(self):
        os.putenv("C", "1")
        return os.environ["D"]
option = typer.Option("--x", envvar="SKIPPY_X")
"""
    found = [(read.scope, read.what) for read in environment_reads(source, "m.py")]
    assert found == [
        ("<module>", "from os import environ"),
        ("<module>", "from os import getenv"),
        ("<module>", "os.environ"),
        ("f", "os.getenv"),
        ("m", "os.putenv"),
        ("m", "os.environ"),
        ("<module>", "envvar= (click/Typer reads the variable)"),
    ]
    assert environment_reads("import os\nos.getpid()\nenviron = {}\n", "m.py") == []
