"""The figures table (skippyctl/events/figures.py): one row per figure, no key used twice, and
the layouts it makes — the generation terminal's summaries, speculation_summarized's, the
receipt's. Where each layout arrives (engine wire, receipt JSON, event records, plugins) is
tests/runtime/test_figure_routes.py and tests/plugins/test_receipt_figures.py."""

from __future__ import annotations

import dataclasses

import pytest

from skippyctl.events import figures as figures_module
from skippyctl.events.envelope import SummaryKey
from skippyctl.events.figures import (
    FIGURES,
    NO_FIGURES,
    GenerationFigures,
    receipt_figures,
    speculation_summaries,
    terminal_summaries,
)
from tests.events.figure_values import every_figure_set


def test_the_table_has_one_row_per_figure_in_field_order() -> None:
    assert [f.name for f in FIGURES] == [f.name for f in dataclasses.fields(GenerationFigures)]
    hints = {f.name: f.type for f in dataclasses.fields(GenerationFigures)}
    assert all(hints[f.name] == ("int" if f.count else "float | None") for f in FIGURES)


@pytest.mark.parametrize(
    "rows",
    [
        figures_module._ROWS[:-1],  # a figure without a row
        (*figures_module._ROWS[1:], figures_module._ROWS[0]),  # rows out of field order
        tuple(  # one summary key for two figures
            dataclasses.replace(row, summary=SummaryKey.PROMPT_TOKENS)
            if row.name == "reused_tokens"
            else row
            for row in figures_module._ROWS
        ),
        tuple(  # one plugin ABI field for two figures
            dataclasses.replace(row, plugin_abi="queue_ms") if row.name == "prefill_ms" else row
            for row in figures_module._ROWS
        ),
    ],
    ids=["missing", "order", "summary-twice", "abi-twice"],
)
def test_a_table_that_does_not_fit_the_type_is_refused_at_import(
    rows: tuple[figures_module.Figure, ...],
) -> None:
    with pytest.raises(TypeError):
        figures_module._typed(rows)


def test_the_generation_terminal_carries_every_measured_figure_at_its_summary_key() -> None:
    figures = every_figure_set()
    values = {s.key: s.value for s in terminal_summaries(figures)}
    assert values == {f.summary: getattr(figures, f.name) for f in FIGURES}
    speculative = {s.key: s.value for s in speculation_summaries(figures)}
    assert speculative == {f.summary: getattr(figures, f.name) for f in FIGURES if f.speculative}


def test_without_speculation_or_measures_the_summaries_leave_them_out() -> None:
    keys = {s.key for s in terminal_summaries(NO_FIGURES)}
    # Counts are there (0); measures that were not taken and speculative figures are absent.
    assert keys == {f.summary for f in FIGURES if f.count and not f.speculative}
    late_only = GenerationFigures(spec_late=1)  # asked for proposals, none came in time
    assert late_only.speculated
    assert SummaryKey.SPEC_LATE_QUERIES in {s.key for s in terminal_summaries(late_only)}


def test_the_receipt_layout_puts_each_figure_at_its_key() -> None:
    figures = every_figure_set()
    document = receipt_figures(figures, "ngram")
    assert document["speculative"]["mode"] == "ngram"
    for f in FIGURES:
        where = document["speculative"] if f.speculative else document
        assert where[f.receipt] == getattr(figures, f.name), f.name
    assert len(document) == 1 + sum(not f.speculative for f in FIGURES)
    assert len(document["speculative"]) == 1 + sum(f.speculative for f in FIGURES)
