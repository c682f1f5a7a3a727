"""`RuntimeSettings` (config/runtime_settings.py): every variable, its default, its parsing and
its refusals; the variable names (contracts); the tables rendered from it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Final

import pytest

from skippyctl.config.runtime_settings import (
    EngineStderr,
    InvalidSettings,
    RuntimeSettings,
    inherited_environment,
    markdown_table,
    settings_table,
)
from skippyctl.native.library import ENV_DISABLE, ENV_LIBRARY

README: Final = Path(__file__).resolve().parents[2] / "README.md"
VARIABLES: Final = (
    "SKIPPY_RUNTIME_DIR",
    "XDG_RUNTIME_DIR",
    "SKIPPY_PORT",
    "SKIPPY_API_KEY",
    "SKIPPY_DEBUG_TOKEN_EVENTS",
    "SKIPPY_SESSION_STATE_MAX_MIB",
    "SKIPPY_ENGINE_UNRESPONSIVE_S",
    "SKIPPY_DEVICE_LOW_FREE_PCT",
    "SKIPPY_STAGE_LINK_PROBE_MS",
    "SKIPPY_SERVING_EVENTS",
    "SKIPPY_COMPUTE_TURNS",
    "SKIPPY_CAPTURE_NATIVE_LOG",
    "SKIPPY_ENGINE_STDERR",
    "SKIPPY_NATIVE_LIBRARY",
    "SKIPPY_NATIVE_DISABLE",
    "SKIPPY_TEST_PROGRESS_DELAY_US",
    "SKIPPY_TEST_DECODE_DELAY_MS",
    "SKIPPY_TEST_TEMPLATE_DATE",
    "SKIPPY_TEST_ENGINE_AS_LIMIT_MB",
    "SKIPPY_FLEET_FILE",
)
"""Every variable the settings read: names are contracts (add, never rename or drop)."""


def read(**environ: str) -> RuntimeSettings:
    return RuntimeSettings.from_environment(environ)


def test_the_variables_are_the_contracted_names() -> None:
    assert tuple(setting.variable for _, setting in settings_table()) == VARIABLES
    assert {ENV_LIBRARY, ENV_DISABLE} <= set(VARIABLES)  # the names native/ quotes in messages


def test_every_field_is_a_setting_or_a_documented_hand_over() -> None:
    fields = {f.name for f in dataclasses.fields(RuntimeSettings)}
    assert fields - {name for name, _ in settings_table()} == {
        "otel_environment",
        "hub_verbosity_set",
    }


def test_an_empty_environment_is_the_defaults() -> None:
    assert read() == RuntimeSettings()
    assert read(SKIPPY_PORT="  ", SKIPPY_RUNTIME_DIR="") == RuntimeSettings()  # blank: unset


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("SKIPPY_RUNTIME_DIR", "/tmp/r", "runtime_dir", Path("/tmp/r")),
        ("XDG_RUNTIME_DIR", "/run/user/7", "xdg_runtime_dir", Path("/run/user/7")),
        ("SKIPPY_PORT", " 0 ", "port", 0),
        ("SKIPPY_PORT", "65535", "port", 65535),
        ("SKIPPY_API_KEY", "tok-EN_1", "api_key", "tok-EN_1"),
        ("SKIPPY_DEBUG_TOKEN_EVENTS", "1", "debug_token_events", True),
        ("SKIPPY_DEBUG_TOKEN_EVENTS", "Yes", "debug_token_events", True),
        ("SKIPPY_SESSION_STATE_MAX_MIB", "0", "session_state_max_mib", 0),
        ("SKIPPY_ENGINE_UNRESPONSIVE_S", "0.5", "engine_unresponsive_s", 0.5),
        ("SKIPPY_STAGE_LINK_PROBE_MS", "10", "stage_link_probe_ms", 10.0),
        ("SKIPPY_SERVING_EVENTS", " OFF ", "serving_events", False),
        ("SKIPPY_SERVING_EVENTS", "on", "serving_events", True),
        ("SKIPPY_CAPTURE_NATIVE_LOG", "1", "capture_native_log", True),
        ("SKIPPY_ENGINE_STDERR", "inherit", "engine_stderr", EngineStderr.INHERIT),
        ("SKIPPY_NATIVE_LIBRARY", "/x/lib.so", "native_library", Path("/x/lib.so")),
        ("SKIPPY_NATIVE_DISABLE", "1", "native_disabled", True),
        ("SKIPPY_NATIVE_DISABLE", "0", "native_disabled", False),
        ("SKIPPY_TEST_PROGRESS_DELAY_US", "200000", "test_progress_delay_us", 200_000),
        ("SKIPPY_TEST_DECODE_DELAY_MS", "2.5", "test_decode_delay_ms", 2.5),
        ("SKIPPY_TEST_ENGINE_AS_LIMIT_MB", "64", "test_engine_as_limit_mib", 64),
    ],
)
def test_a_variable_sets_its_field(variable: str, value: str, field: str, expected: Any) -> None:
    settings = read(**{variable: value})
    assert getattr(settings, field) == expected
    assert dataclasses.replace(settings, **{field: getattr(RuntimeSettings(), field)}) == (
        RuntimeSettings()
    )  # and nothing else


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("SKIPPY_PORT", "abc", "is not a port number (0-65535; 0: any free port)"),
        ("SKIPPY_PORT", "70000", "is not a port number"),
        ("SKIPPY_PORT", "1e3", "is not a port number"),
        ("SKIPPY_DEBUG_TOKEN_EVENTS", "maybe", "is not a flag"),
        ("SKIPPY_SESSION_STATE_MAX_MIB", "-1", "is not a whole number of at least 0"),
        ("SKIPPY_ENGINE_UNRESPONSIVE_S", "0", "is not a number above 0"),
        ("SKIPPY_ENGINE_UNRESPONSIVE_S", "nan", "is not a number above 0"),
        ("SKIPPY_STAGE_LINK_PROBE_MS", "5", "is not a number of at least 10"),
        ("SKIPPY_SERVING_EVENTS", "sometimes", "is not a flag"),
        ("SKIPPY_ENGINE_STDERR", "file", "is not discard or inherit"),
        ("SKIPPY_NATIVE_DISABLE", "2", "is not a flag"),
        ("SKIPPY_TEST_DECODE_DELAY_MS", "-1", "is not a number of at least 0"),
        ("SKIPPY_TEST_ENGINE_AS_LIMIT_MB", "0", "is not a whole number of at least 1"),
    ],
)
def test_an_invalid_value_names_its_variable_and_why(variable: str, value: str, why: str) -> None:
    with pytest.raises(InvalidSettings) as info:
        read(**{variable: value})
    assert info.value.reason == "invalid_configuration"
    (problem,) = info.value.problems
    assert problem.startswith(f"{variable}={value!r} {why}"), problem


def test_every_invalid_value_is_reported_at_once() -> None:
    with pytest.raises(InvalidSettings) as info:
        read(SKIPPY_PORT="x", SKIPPY_SERVING_EVENTS="z", SKIPPY_ENGINE_UNRESPONSIVE_S="5")
    assert [p.split("=")[0] for p in info.value.problems] == [
        "SKIPPY_PORT",
        "SKIPPY_SERVING_EVENTS",
    ]
    assert str(info.value) == "; ".join(info.value.problems)


def test_a_credential_is_never_repeated() -> None:
    secret = "hunter2 secret"  # a space: not a usable bearer token
    with pytest.raises(InvalidSettings) as info:
        read(SKIPPY_API_KEY=secret)
    assert "SKIPPY_API_KEY is not a usable bearer token" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in repr(read(SKIPPY_API_KEY="hunter2"))


def test_the_opentelemetry_variables_are_handed_over_as_read() -> None:
    settings = read(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318", OTEL_SDK_DISABLED="true", X="1")
    assert dict(settings.otel_environment) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_SDK_DISABLED": "true",
    }
    assert "4318" not in repr(settings)  # OTLP headers may hold credentials
    assert read(HF_HUB_VERBOSITY="debug").hub_verbosity_set
    assert not read().hub_verbosity_set


def test_a_child_inherits_the_environment_with_drops_and_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEEP_ME", "yes")
    monkeypatch.setenv("DROP_ME", "secret")
    child = inherited_environment(drop={"DROP_ME"}, overrides={"ADDED": "1"})
    assert child["KEEP_ME"] == "yes" and child["ADDED"] == "1" and "DROP_ME" not in child


def test_the_readme_table_is_the_generated_one() -> None:
    """Regenerate with the command above the table in README.md."""
    text = README.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- runtime-settings:begin -->\n(.*?)<!-- runtime-settings:end -->", text, re.S
    )
    assert found is not None, "README.md lost its runtime-settings markers"
    assert found.group(1) == markdown_table()
