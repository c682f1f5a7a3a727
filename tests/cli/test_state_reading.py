"""`ps` and `wait` decide on the typed reading of the state document, never on spelled states.

The documents are built by the runtime's own projection (`state_document`) from the reducer's
state after real event scenarios; a newer runtime's unknown values are written by hand.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from skippy_tui import demo
from skippyctl.cli.exit_codes import ExitCode, exit_code_for, exit_code_for_text
from skippyctl.cli.state_tables import (
    health_line,
    models_table,
    options_line,
    sessions_table,
    speculation_line,
)
from skippyctl.cli.wait import parse_condition
from skippyctl.events.envelope import Event
from skippyctl.output.state import state_document
from skippyctl.output.state_reader import read_state_document
from skippyctl.reducer.reduce import reduce
from skippyctl.reducer.state import RuntimeView


def _document(events: list[Event], **kw: Any) -> dict[str, Any]:
    view = RuntimeView()
    for event in events:
        view, _ = reduce(view, event)
    return state_document(view, **kw)


def _text(renderable: object) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(renderable)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_ps_table_shows_each_model_from_the_document() -> None:
    document = _document(demo.available() + demo.failed() + demo.sessions())
    lines = _text(models_table(read_state_document(document)))
    assert lines[0].split() == [
        "model",
        "state",
        "device",
        "memory",
        "ctx",
        "lanes",
        "queue",
        "sessions",
        "decode",
        "tok/s",
    ]
    assert lines[1].split() == [
        "tiny",
        "available",
        "CPU",
        "401.2",
        "KiB",
        "4096",
        "3/4",
        "2",
        "4",
        "41.7",
    ]
    assert lines[2].split() == [
        "broken",
        "failed",
        "(model_format_or_load_failure)",
        "-",
        "-",
        "-",
        "0/-",
        "0",
        "0",
        "-",
    ]


def test_ps_shows_a_loading_models_progress() -> None:
    lines = _text(models_table(read_state_document(_document(demo.loading()))))
    assert lines[1].split()[:3] == ["tiny", "loading", "64%"]


def test_ps_shows_a_newer_runtimes_state_by_its_name() -> None:
    document = {
        "models": [{"model_id": "tiny", "state": "teleporting", "reason_code": "solar_flare"}],
        "sessions": [{"session_id": "s-1", "state": "dreaming", "model_id": "tiny"}],
    }
    (_, row) = _text(models_table(read_state_document(document)))
    assert row.split()[:4] == ["tiny", "teleporting", "(solar_flare)", "-"]
    assert row.split()[-2:] == ["1", "-"]  # the session counts; no rate


def test_ps_health_line_counts_drops_and_prefers_the_live_lagging_counter() -> None:
    document = _document(demo.pressure(), health={"subscribers_lagging": 3})
    reading = read_state_document(document)
    system = reading.event_system
    dropped = sum(v for k, v in document["event_system"].items() if k.startswith("dropped_"))
    assert dropped > 0
    (line,) = _text(health_line(reading))
    assert line == (
        f"events: {dropped} dropped, {system.coalesced} coalesced, {system.sampled} sampled, "
        f"3 lagging subscriber(s), {system.replay_gaps} replay gap(s)"
    )
    without_health = read_state_document(_document(demo.pressure()))
    (line,) = _text(health_line(without_health))
    assert f"{system.lagging_subscribers} lagging subscriber(s)" in line


@pytest.mark.parametrize(
    ("events", "condition", "holds", "code"),
    [
        (demo.loading(), "model_loading=tiny", True, None),
        (demo.loading(), "model_available=tiny", False, None),
        (demo.available(), "model_available=tiny", True, None),
        (demo.available(), "node_accepting", True, None),
        (demo.available(), "node_degraded", False, None),
        (demo.available(), "model_unavailable=other", True, None),  # not loaded
        (demo.available() + demo.failed(), "model_load_failed=broken", True, 14),
        (demo.available() + demo.failed(), "model_unavailable=broken", True, 14),
        (demo.available(), "event=model_available@tiny", False, None),  # events only
    ],
)
def test_wait_conditions_hold_in_the_typed_state(
    events: list[Event], condition: str, holds: bool, code: int | None
) -> None:
    reading = read_state_document(_document(events))
    held, reason = parse_condition(condition, "--for").holds_in(reading)
    assert held is holds
    if code is not None:
        assert reason is not None
        assert exit_code_for(reason.member) == code
        assert reason.text == "model_format_or_load_failure"


def test_wait_on_a_newer_runtimes_reason_fails_with_its_name_and_exit_1() -> None:
    reading = read_state_document(
        {"models": [{"model_id": "tiny", "state": "failed", "reason_code": "solar_flare"}]}
    )
    held, reason = parse_condition("model_load_failed=tiny", "--fail-on").holds_in(reading)
    assert held and reason is not None
    assert reason.text == "solar_flare"
    assert exit_code_for(reason.member) is ExitCode.FAILURE
    unknown_state = read_state_document({"models": [{"model_id": "tiny", "state": "warp"}]})
    for kind in ("model_available", "model_loading", "model_unavailable", "model_load_failed"):
        assert parse_condition(f"{kind}=tiny", "--for").holds_in(unknown_state) == (False, None)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("missing_artifact", ExitCode.MISSING_ARTIFACT),
        ("timeout", ExitCode.TIMEOUT),
        ("solar_flare", ExitCode.FAILURE),
        ("", ExitCode.FAILURE),
        (None, ExitCode.FAILURE),
        (12, ExitCode.FAILURE),
    ],
)
def test_a_reason_as_a_runtime_spelled_it_maps_to_its_exit_code(text: object, code: int) -> None:
    assert exit_code_for_text(text) is code


def test_ps_shows_speculation_acceptance_per_model_and_per_session() -> None:
    document = {
        "models": [
            {
                "model_id": "tiny",
                "state": "available",
                "spec_proposed_tokens": 1200,
                "spec_accepted_tokens": 900,
            },
            {"model_id": "plain", "state": "available"},
        ],
        "sessions": [
            {
                "session_id": "s-1",
                "state": "idle",
                "model_id": "tiny",
                "spec_proposed_tokens": 40,
                "spec_accepted_tokens": 10,
            },
            {"session_id": "s-2", "state": "idle", "model_id": "plain"},
        ],
    }
    state = read_state_document(document)
    assert speculation_line(state.models[0]) == (
        "  tiny speculation: 75% of 1,200 proposed tokens accepted"
    )
    rows = [line.split() for line in _text(sessions_table(state))]
    assert rows == [
        ["session", "model", "state", "accept"],
        ["s-1", "tiny", "idle", "25%"],
        ["s-2", "plain", "idle", "-"],
    ]


def test_ps_says_whether_a_load_without_flash_attention_is_batch_invariant() -> None:
    """Where the load computes without flash attention (`off`, and the default on a CPU), the
    options line says what its probe found (engine/kernels.py); a load that asked for flash
    attention does not claim it either way."""
    document = {
        "models": [
            {
                "model_id": model_id,
                "state": "available",
                "settings": settings,
                **({} if invariant is None else {"batch_invariant": invariant}),
            }
            for model_id, settings, invariant in (
                ("inv", {"flash_attn": "off"}, True),
                ("dflt", {"lanes": 2}, True),
                ("q6k", {"lanes": 2}, False),
                ("fa", {"flash_attn": "on"}, False),
                ("old", {"lanes": 2}, None),
            )
        ]
    }
    lines = [options_line(m) for m in read_state_document(document).models]
    assert lines == [
        "  [dim]inv options:[/] flash_attn=off · batch-invariant",
        "  [dim]dflt options:[/] lanes=2 · batch-invariant",
        "  [dim]q6k options:[/] lanes=2 · not batch-invariant",
        "  [dim]fa options:[/] flash_attn=on",
        "  [dim]old options:[/] lanes=2",
    ]
