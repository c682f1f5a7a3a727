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
