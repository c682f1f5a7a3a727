"""Consumer projections: JSON records, human summaries, terminal presenters."""
