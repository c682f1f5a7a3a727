"""Which catalog ids some code emits: a static scan of the package's producer side.

    .venv/bin/python scripts/event_producers.py [--json]

An id counts as produced when a module outside the catalog, the human summaries, the CLI and the
reducer names it (``EventId.X`` / ``_E.X``: every producer builds its events from those names),
or when the reducer derives it (the fourth element of a move row, a ``transition(...)`` or
``make_event(...)`` of it, or a ``state → id`` table entry). Tests and the native test emitters
are not scanned. The README lists the ids that are not produced and why; a test keeps the two in
step.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
PACKAGE: Final = REPO / "skippyctl"
_NOT_PRODUCERS: Final = ("events/catalog.py", "output/summary.py", "cli/", "reducer/")


def produced_ids(package: Path = PACKAGE) -> set[str]:
    """The ids of :class:`~skippyctl.events.catalog.EventId` that some producer emits."""
    sys.path.insert(0, str(package.parent))
    from skippyctl.events.catalog import EventId

    sources = [
        path.read_text()
        for path in package.rglob("*.py")
        if not str(path.relative_to(package)).startswith(_NOT_PRODUCERS)
    ]
    reducer = "".join(path.read_text() for path in (package / "reducer").rglob("*.py"))
    found: set[str] = set()
    for event_id in EventId:
        name = event_id.name
        named = re.compile(rf"\b(EventId|_E)\.{name}\b")
        derived = (
            re.search(rf"_E\.[A-Z_]+,\s*[^,()]+,\s*_E\.{name}\b", reducer)
            or re.search(rf"(make_event|transition)\(\s*(EventId|_E)\.{name}\b", reducer)
            or re.search(rf": EventId\.{name},", reducer)
        )
        if derived or any(named.search(text) for text in sources):
            found.add(event_id.value)
    return found


def main() -> int:
    sys.path.insert(0, str(REPO))
    from skippyctl.events.catalog import EventId

    every = [e.value for e in EventId]
    found = produced_ids()
    missing = [e for e in every if e not in found]
    if "--json" in sys.argv[1:]:
        import json

        summary = {"ids": len(every), "produced": len(found), "not_produced": missing}
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(f"{len(found)} of {len(every)} ids have a producer; not produced:\n")
        sys.stdout.writelines(f"  {event_id}\n" for event_id in missing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
