"""The README's table of ids without a producer is exactly what the scan finds unproduced."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from skippyctl.events.catalog import EventId

REPO = Path(__file__).resolve().parents[2]


def _scan() -> set[str]:
    spec = importlib.util.spec_from_file_location(
        "event_producers", REPO / "scripts" / "event_producers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: set[str] = module.produced_ids()
    return found


def _readme_table() -> set[str]:
    """The ids in the first column of the README's table; `a_b_started` / `_completed` in one
    cell names `a_b_started` and `a_b_completed`."""
    text = (REPO / "README.md").read_text()
    section = text.split("**Ids without a producer here.**", 1)[1].split("\n\n###", 1)[0]
    listed: set[str] = set()
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        previous = ""
        for name in re.findall(r"`([a-z_]+)`", row.split("|")[1]):
            if name.startswith("_"):
                name = previous.rsplit("_", 1)[0] + name
            listed.add(name)
            previous = name
    return listed


def test_every_unproduced_id_is_explained_in_the_readme_and_only_those() -> None:
    every = {e.value for e in EventId}
    unproduced = every - _scan()
    assert _readme_table() == unproduced
    count = re.search(
        r"Of the catalog's (\d+) ids, (\d+) are emitted", (REPO / "README.md").read_text()
    )
    assert count is not None
    assert (int(count[1]), int(count[2])) == (len(every), len(every) - len(unproduced))


def test_the_scan_counts_emitting_call_sites_not_mentions(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "event_producers", REPO / "scripts" / "event_producers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "producer.py").write_text(
        "TABLE = {1: EventId.KV_TABLED}\n"
        "class Status:\n"
        "    library: object\n"
        "    failure: EventId | None\n"
        "def which(flag):\n"
        "    return EventId.RETURNED if flag else EventId.ALSO_RETURNED\n"
        "def helper(model, event_id):\n"
        "    submit(make_event(event_id, scope=model))\n"
        "def run(change, flag, status):\n"
        "    make_event(EventId.DIRECT)\n"
        "    chosen = EventId.BOUND_A if flag else EventId.BOUND_B\n"
        "    Emission(chosen)\n"
        "    fact(TABLE.get(change), scope)\n"
        "    helper(model, EventId.PASSED)\n"
        "    make_event(which(flag))\n"
        "    make_event(status.failure)\n"
        "    Status(None, EventId.RECORDED)\n"
        "    found = []\n"
        "    found.append((EventId.APPENDED, scope))\n"
        "    return [make_event(event_id, scope=s) for event_id, s in found]\n"
    )
    (package / "consumer.py").write_text(
        "NAMES = {EventId.MAPPED: 'mapped'}\n"
        "def read(event):\n"
        "    if event.id is EventId.COMPARED:\n"
        "        render(EventId.RENDERED)\n"
        "    make_event(pick(event.id is EventId.INSIDE_AN_ARGUMENT))\n"
        "def _synthetic_terminal(lost):\n"
        "    return make_event(EventId.STOOD_IN)\n"
    )
    found = set(module.python_sites(package))
    assert found == {
        "DIRECT",
        "BOUND_A",
        "BOUND_B",
        "KV_TABLED",
        "PASSED",
        "RETURNED",
        "ALSO_RETURNED",
        "RECORDED",
        "APPENDED",
    }
