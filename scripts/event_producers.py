"""Which catalog ids the runtime emits in normal operation: a scan of emitting call sites.

    .venv/bin/python scripts/event_producers.py [--json] [--sites]

An id counts as produced only where code emits it, not where code names it:

- the id (``EventId.X`` / ``_E.X``) is the event id of an emitting call — ``make_event(id, …)``,
  ``Emission(id, …)``, ``.fact(id, …)``, the reducer's ``transition(id, …)`` — directly, in a
  conditional expression, through a local name assigned in the same function, or through a
  module-level table the call looks up (``KV_EVENTS[message.event]``: every id in that table);
- the reducer announces it (the ``emits`` of a move row);
- the native layer pushes its kind from a real llama.cpp hook or engine call (a ``.kind =``
  of ``native/src/*.c``, the test emitters excluded), mapped by ``events/native_kinds.py``.

Consumers are never producers: the OTLP mapping, the CLI's and the dashboard's readers, the
human summaries, the catalog, the warning sources, tests, the native test emitters and the
dashboard's demo data are either not scanned or name ids outside any emitting call. The README
lists the ids that are not produced and why; ``tests/events/test_producers.py`` keeps the two in
step, and each id it counts is driven by a test through a real path (see the README).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
PACKAGE: Final = REPO / "skippyctl"
NATIVE_SOURCES: Final = REPO / "native" / "src"
_CONSUMERS: Final = ("events/catalog.py", "events/native_kinds.py")
"""The catalog itself and the native kind table (its rows count through ``native_kinds``)."""
_NATIVE_TEST_SOURCES: Final = frozenset({"test_emitters.c"})
_EMITTING_CALLS: Final = frozenset({"make_event", "Emission", "fact", "transition"})
_ID_HOLDERS: Final = frozenset({"EventId", "_E"})
_STAND_INS: Final = frozenset({"_synthetic_terminal"})
"""Functions that emit an id in place of another event (the terminal that replaces one the
ingress lost): what they emit says what was lost, so it is not a producer of that id."""


def _ids_in(node: ast.AST) -> set[str]:
    """The ``EventId.X`` / ``_E.X`` names anywhere in ``node``."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Name)
        and sub.value.id in _ID_HOLDERS
        and sub.attr.isupper()
    }


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


_Slot = tuple[int, str]
"""Where a call takes the id it emits: its position among the call's arguments, its keyword."""
_PRIMITIVE_SLOT: Final[_Slot] = (0, "event_id")


def _event_argument(call: ast.Call, slot: _Slot) -> ast.AST | None:
    position, keyword_name = slot
    if len(call.args) > position:
        return call.args[position]
    for keyword in call.keywords:
        if keyword.arg == keyword_name:
            return keyword.value
    return None


def _names_in(node: ast.AST) -> set[str]:
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}


def _module_tables(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level names bound to an expression holding ids (tables, sets, constants)."""
    tables: dict[str, set[str]] = {}
    for statement in tree.body:
        targets: list[ast.expr] = []
        value: ast.AST | None = None
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                found = _ids_in(value)
                if found:
                    tables[target.id] = found
    return tables


class _Module:
    """One parsed module: its functions, and what its names and calls can hold."""

    def __init__(self, relative: str, tree: ast.Module) -> None:
        self.relative = relative
        self.tree = tree
        self.functions = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            and getattr(node, "name", None) not in _STAND_INS
        ]


def _local_bindings(function: ast.AST) -> dict[str, ast.expr]:
    """What a function binds its names to (every binding of each: enough to follow
    ``event_id = A if x else B``, ``event_id = TABLE.get(change)``, a list built with
    ``append`` and iterated), loops and comprehensions included."""
    bound: dict[str, list[ast.expr]] = defaultdict(list)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in _names_in(target):
                    bound[name].append(node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            for name in _names_in(node.target):
                bound[name].append(node.value)
        elif isinstance(node, ast.For | ast.comprehension):
            for name in _names_in(node.target):
                bound[name].append(node.iter)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            bound[node.target.id].append(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "add", "insert")
            and isinstance(node.func.value, ast.Name)
        ):
            bound[node.func.value.id].extend(node.args)  # a list built up, then iterated
    return {name: ast.Tuple(elts=values, ctx=ast.Load()) for name, values in bound.items()}


def _passed_names(node: ast.AST) -> set[str]:
    """Names an expression passes on as they are (itself, a conditional's branches)."""
    match node:
        case ast.Name(id=name):
            return {name}
        case ast.IfExp(body=body, orelse=orelse):
            return _passed_names(body) | _passed_names(orelse)
    return set()


def _parameters(function: ast.AST) -> dict[str, _Slot]:
    """Each parameter and where a caller passes it (``self``/``cls`` not counted)."""
    arguments = getattr(function, "args", None)
    if arguments is None:
        return {}
    positional = [argument.arg for argument in (*arguments.posonlyargs, *arguments.args)]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    slots = {name: (index, name) for index, name in enumerate(positional)}
    slots.update({argument.arg: (1 << 16, argument.arg) for argument in arguments.kwonlyargs})
    return slots


class _Scan:
    """Ids reaching emitting calls, followed through names, tables, helpers and functions that
    return an id, across the scanned modules (to a fixed point)."""

    def __init__(self, modules: list[_Module]) -> None:
        self.modules = modules
        self.tables: dict[str, set[str]] = {}
        for module in modules:
            self.tables.update(_module_tables(module.tree))
        self.emitters: dict[str, set[_Slot]] = {name: {_PRIMITIVE_SLOT} for name in _EMITTING_CALLS}
        """Calls whose argument in a slot is emitted: the primitives and the helpers passing
        one of their parameters on to an emitting call."""
        self.returns: dict[str, set[str]] = defaultdict(set)
        """Functions (by name) that return an id, and which."""
        self.fields: dict[str, set[str]] = defaultdict(set)
        """Record fields (by name) constructed with an id: ``Status(None, EventId.X)`` and
        later ``make_event(status.failure)``."""
        self.records: dict[str, list[str]] = {}
        for module in modules:
            for node in ast.walk(module.tree):
                if isinstance(node, ast.ClassDef):
                    self.records[node.name] = [
                        item.target.id
                        for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    ]

    def resolve(self, node: ast.AST, local: Mapping[str, ast.AST], depth: int = 0) -> set[str]:
        """The ids an expression can evaluate to, followed through its structure only: an id,
        a name (its bindings, a table), a conditional, a table lookup, a call of a function
        that returns ids. Ids merely mentioned inside (a comparison, an argument) are not."""
        if depth > 6:
            return set()
        match node:
            case ast.Attribute(value=ast.Name(id=holder), attr=attr) if holder in _ID_HOLDERS:
                return {attr} if attr.isupper() else set()
            case ast.Attribute(attr=attr):
                return set(self.fields.get(attr, set()))
            case ast.Name(id=name):
                found = set(self.tables.get(name, set()))
                if name in local:
                    found |= self.resolve(local[name], local, depth + 1)
                return found
            case ast.IfExp(body=body, orelse=orelse):
                return self.resolve(body, local, depth + 1) | self.resolve(orelse, local, depth + 1)
            case ast.BoolOp(values=values) | ast.Tuple(elts=values) | ast.List(elts=values):
                return set().union(*(self.resolve(v, local, depth + 1) for v in values))
            case ast.Set(elts=values):
                return set().union(*(self.resolve(v, local, depth + 1) for v in values))
            case ast.Dict(values=values):
                return set().union(
                    *(self.resolve(v, local, depth + 1) for v in values if v is not None)
                )
            case ast.Subscript(value=table):
                return self.resolve(table, local, depth + 1)
            case ast.Call(func=ast.Attribute(value=table, attr="get")):
                return self.resolve(table, local, depth + 1)
            case ast.Call():
                called = _called_name(node)
                return set(self.returns.get(called, set())) if called is not None else set()
        return set()

    def run(self) -> dict[str, set[str]]:
        sites: dict[str, set[str]] = defaultdict(set)
        for _ in range(6):  # helpers of helpers: a few rounds reach the fixed point
            changed = False
            for module in self.modules:
                for function in module.functions:
                    changed |= self._function(module, function, sites)
            if not changed:
                break
        return sites

    def _function(self, module: _Module, function: ast.AST, sites: dict[str, set[str]]) -> bool:
        local = _local_bindings(function)
        parameters = _parameters(function)
        changed = False
        name = getattr(function, "name", None)
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and _called_name(node) in self.records:
                fields = self.records[_called_name(node) or ""]
                given = list(zip(fields, node.args, strict=False))
                given += [(k.arg, k.value) for k in node.keywords if k.arg is not None]
                for field, value in given:
                    held = self.resolve(value, local)
                    if not held <= self.fields[field]:
                        self.fields[field] |= held
                        changed = True
            if isinstance(node, ast.Return) and node.value is not None and name is not None:
                returned = self.resolve(node.value, local)
                if not returned <= self.returns[name]:
                    self.returns[name] |= returned
                    changed = True
            called = _called_name(node) if isinstance(node, ast.Call) else None
            if called is None or called not in self.emitters:
                continue
            assert isinstance(node, ast.Call)
            for slot in list(self.emitters[called]):
                argument = _event_argument(node, slot)
                if argument is None:
                    continue
                for passed in _passed_names(argument) & parameters.keys():
                    if name is not None and parameters[passed] not in self.emitters.get(
                        name, set()
                    ):
                        # A helper: what its callers pass in that slot is emitted.
                        self.emitters.setdefault(name, set()).add(parameters[passed])
                        changed = True
                for event_id in self.resolve(argument, local):
                    if module.relative not in sites[event_id]:
                        sites[event_id].add(module.relative)
                        changed = True
        return changed


def python_sites(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each produced id and the modules whose emitting calls produce it."""
    modules = [
        _Module(str(path.relative_to(package)), ast.parse(path.read_text(), str(path)))
        for path in sorted(package.rglob("*.py"))
        if not str(path.relative_to(package)).startswith(_CONSUMERS)
    ]
    sites = _Scan(modules).run()
    for module in modules:
        if module.relative.startswith("reducer/"):
            for event_id in _announced(module.tree):
                sites[event_id].add(module.relative)
    return sites


def _announced(tree: ast.Module) -> set[str]:
    """The ``emits`` (fourth argument or keyword) of the reducer's ``Move`` rows."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in ("Move", "moves"):
            emits = node.args[3] if len(node.args) > 3 else None
            for keyword in node.keywords:
                if keyword.arg == "emits":
                    emits = keyword.value
            if emits is not None:
                found |= _ids_in(emits)
    return found


def native_kinds(sources: Path = NATIVE_SOURCES) -> set[str]:
    """``SKIPPY_KIND_*`` names the real native code pushes (``.kind = …`` outside the test
    emitters), as ``NativeKind`` member names."""
    found: set[str] = set()
    for path in sorted(sources.glob("*.c")):
        if path.name in _NATIVE_TEST_SOURCES:
            continue
        for match in re.finditer(r"\.kind\s*=\s*([^,;}]+)", path.read_text()):
            found |= set(re.findall(r"SKIPPY_KIND_([A-Z_]+)", match[1]))
    return found


def produced_sites(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each produced id (its value) and where: Python modules, or ``native/src``."""
    sys.path.insert(0, str(package.parent))
    from skippyctl.events.catalog import EventId
    from skippyctl.events.native_kinds import NATIVE_KINDS

    by_name = {event_id.name: event_id.value for event_id in EventId}
    sites: dict[str, set[str]] = defaultdict(set)
    for name, modules in python_sites(package).items():
        if name in by_name:
            sites[by_name[name]] |= modules
    pushed = native_kinds()
    for spec in NATIVE_KINDS:
        if spec.kind.name in pushed:
            sites[spec.event.value].add("native/src")
    return sites


def produced_ids(package: Path = PACKAGE) -> set[str]:
    """The ids of :class:`~skippyctl.events.catalog.EventId` emitted in normal operation."""
    return set(produced_sites(package))


def main() -> int:
    sys.path.insert(0, str(REPO))
    from skippyctl.events.catalog import EventId

    every = [e.value for e in EventId]
    sites = produced_sites()
    missing = [e for e in every if e not in sites]
    if "--json" in sys.argv[1:]:
        import json

        summary = {
            "ids": len(every),
            "produced": len(sites),
            "not_produced": missing,
            "sites": {e: sorted(sites[e]) for e in every if e in sites},
        }
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
    sys.stdout.write(f"{len(sites)} of {len(every)} ids are emitted; not produced:\n")
    sys.stdout.writelines(f"  {event_id}\n" for event_id in missing)
    if "--sites" in sys.argv[1:]:
        sys.stdout.write("emitted by:\n")
        sys.stdout.writelines(
            f"  {e}: {', '.join(sorted(sites[e]))}\n" for e in every if e in sites
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
