"""Figures for the tests that follow every figure through the house (events, runtime, plugins)."""

from __future__ import annotations

from skippyctl.events.figures import FIGURES, GenerationFigures


def every_figure_set() -> GenerationFigures:
    """Figures in which every figure is set, each to a value no other one has (counts from 1001,
    measures from 0.5, in table order): a test that finds a row's value at that row's place
    knows this figure got there, not another. Built from the table: a new figure is in it."""
    values = {f.name: 1001 + i if f.count else 0.5 + i for i, f in enumerate(FIGURES)}
    return GenerationFigures(**values)
