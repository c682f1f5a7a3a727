"""Durations as Ollama's keep_alive takes them."""

from __future__ import annotations

import pytest

from skippyctl.config.durations import DurationError, format_duration_s, parse_duration_s


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0),
        (1.5, 1.5),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("7d", 604_800.0),
        ("0", 0.0),
        ("0s", 0.0),
        (-1, -1.0),
        ("-5m", -1.0),
        (-0.001, -1.0),
    ],
)
def test_numbers_and_go_durations_are_seconds(value: float | str, seconds: float) -> None:
    assert parse_duration_s(value) == seconds


@pytest.mark.parametrize("value", ["", "soon", "5x", "m", "5m3", "nan", "inf", " ", "1" * 40])
def test_other_text_is_refused(value: str) -> None:
    with pytest.raises(DurationError):
        parse_duration_s(value)


def test_a_flag_is_not_a_duration() -> None:
    with pytest.raises(DurationError):
        parse_duration_s(True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (90, "1m30s"), (300, "5m"), (3900, "1h05m"), (59.6, "1m")],
)
def test_a_duration_reads_for_people_in_the_form_it_is_parsed_from(
    seconds: float, text: str
) -> None:
    assert format_duration_s(seconds) == text
    if "h" not in text:  # hours are shown to the minute
        assert parse_duration_s(text) == round(seconds)
