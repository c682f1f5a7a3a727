"""Engine options as spawn arguments (engine/options.py): what the host renders, the worker
parses back, and what a host with given settings tells its engines."""

from __future__ import annotations

import argparse

import pytest

from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.engine import options as engine_options
from skippyctl.engine.options import EngineOptions


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
        EngineOptions(link_probe_interval_ms=50.0, capture_debug_log=True),
        EngineOptions(compute_turns="/run/skippy/compute-turns.lock", omp_spin_count=10_000),
        EngineOptions(
            test_progress_delay_us=150_000,
            test_decode_delay_ms=2.5,
            test_address_space_limit_mib=64,
        ),
    ],
)
def test_options_survive_the_command_line(options: EngineOptions) -> None:
    assert parse(options.argv()) == options


def test_a_worker_started_without_the_flags_gets_the_defaults() -> None:
    assert parse([]) == EngineOptions()
    assert EngineOptions() == EngineOptions(serving_events=True, debug_token_events=False)


def test_the_test_fault_injections_are_on_the_command_line_only_when_set() -> None:
    assert not [arg for arg in EngineOptions().argv() if arg.startswith("--test-")]
    assert "--capture-debug-log" not in EngineOptions().argv()
    slow = EngineOptions(test_decode_delay_ms=20).argv()
    assert slow[slow.index("--test-decode-delay-ms") + 1] == "20.0"


def test_a_host_tells_its_engines_what_its_settings_say() -> None:
    settings = RuntimeSettings.from_environment(
        {
            "SKIPPY_SERVING_EVENTS": "off",
            "SKIPPY_STAGE_LINK_PROBE_MS": "25",
            "SKIPPY_CAPTURE_NATIVE_LOG": "1",
            "SKIPPY_TEST_PROGRESS_DELAY_US": "200000",
            "SKIPPY_TEST_DECODE_DELAY_MS": "5",
            "SKIPPY_TEST_ENGINE_AS_LIMIT_MB": "300",
            "SKIPPY_DEBUG_TOKEN_EVENTS": "1",  # the flag decides: the CLI resolved it
        }
    )
    assert EngineOptions.from_settings(settings, debug_token_events=False) == EngineOptions(
        serving_events=False,
        debug_token_events=False,
        link_probe_interval_ms=25.0,
        capture_debug_log=True,
        test_progress_delay_us=200_000,
        test_decode_delay_ms=5.0,
        test_address_space_limit_mib=300,
    )
    assert EngineOptions.from_settings(RuntimeSettings(), debug_token_events=False) == (
        EngineOptions()
    )
