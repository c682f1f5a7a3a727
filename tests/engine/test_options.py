"""Engine options as spawn arguments (engine/options.py): what the host renders, the worker
parses back; the one environment convention the composition root reads."""

from __future__ import annotations

import argparse

import pytest

from skippyctl.engine import options as engine_options
from skippyctl.engine.options import EngineOptions, serving_events_from


def parse(argv: list[str]) -> EngineOptions:
    parser = argparse.ArgumentParser()
    engine_options.add_arguments(parser)
    return engine_options.from_arguments(parser.parse_args(argv))


@pytest.mark.parametrize(
    "options",
    [
        EngineOptions(),
        EngineOptions(serving_events=False),
        EngineOptions(debug_token_events=True),
        EngineOptions(serving_events=False, debug_token_events=True),
    ],
)
def test_options_survive_the_command_line(options: EngineOptions) -> None:
    assert parse(options.argv()) == options


def test_a_worker_started_without_the_flags_gets_the_defaults() -> None:
    assert parse([]) == EngineOptions()
    assert EngineOptions() == EngineOptions(serving_events=True, debug_token_events=False)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, True), ("", True), ("on", True), ("off", False), (" OFF ", False), ("no", True)],
)
def test_only_off_turns_serving_events_off(value: str | None, enabled: bool) -> None:
    assert serving_events_from(value) is enabled
