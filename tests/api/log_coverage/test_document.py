"""docs/LOG_COVERAGE.md's table is the rendering of this run's evidence (package docstring);
``SKIPPY_WRITE_LOG_COVERAGE=1`` rewrites it instead of comparing."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

import pytest

from tests.api.log_coverage.evidence import Evidence, has_extra_buffer_types
from tests.api.log_coverage.facts import FACTS

DOC: Final = Path(__file__).resolve().parents[3] / "docs" / "LOG_COVERAGE.md"
WRITE_ENV: Final = "SKIPPY_WRITE_LOG_COVERAGE"
BEGIN: Final = "<!-- log-coverage:begin -->\n"
END: Final = "<!-- log-coverage:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(results: dict[str, Evidence]) -> str:
    rows = [
        "| area | fact | log line pattern | lines seen | event id(s) | compared | covered |",
        "|---|---|---|---:|---|---|---|",
    ]
    for fact in FACTS:
        evidence = results[fact.key]
        if fact.absent:
            ids, covered = "none needed", "n/a (no line)"
        elif fact.gap is not None:
            ids, covered = f"none: {fact.gap}", "**no**"
        else:
            ids = ", ".join(f"`{i}`" for i in fact.event_ids)
            covered = "yes" if evidence.covered else "**no**"
        cells = (
            fact.area,
            fact.name,
            f"`{fact.pattern.pattern}`",
            str(evidence.lines_seen),
            ids,
            evidence.compared or "—",
            covered,
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    gaps = [f for f in FACTS if f.gap is not None]
    rows += ["", f"Not covered: {len(gaps)} of {len(FACTS)} facts.", ""]
    rows += [f"- {fact.area}, {fact.name}: {fact.gap}." for fact in gaps]
    return "\n".join(rows) + "\n"


def test_docs_log_coverage_is_the_table_of_this_run(results: dict[str, Evidence]) -> None:
    """Regenerate with ``SKIPPY_WRITE_LOG_COVERAGE=1 .venv/bin/pytest
    tests/api/log_coverage`` after a change to the facts or to llama.cpp."""
    if not has_extra_buffer_types():
        pytest.skip("the table is that of a CPU with an extra buffer type (docs/LOG_COVERAGE.md)")
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
    assert found is not None, "docs/LOG_COVERAGE.md lost its markers"
    table = markdown_table(results)
    if os.environ.get(WRITE_ENV) == "1":
        DOC.write_text(text[: found.start(1)] + table + text[found.end(1) :], encoding="utf-8")
        return
    assert found.group(1) == table, f"stale: regenerate with {WRITE_ENV}=1 (see its docstring)"
