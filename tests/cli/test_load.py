"""`skippyctl load` end to end: real engine process, real llama.cpp, real native layer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.cli.helpers import CliResult, run_cli

SUCCESS_ORDER = [
    "model_load_requested",
    "model_load_started",
    "backend_device_selected",
    "model_load_progress",
    "native_model_load_completed",
    "native_model_loaded",
    "serving_backend_initialization_started",
    "serving_backend_initialization_completed",
    "model_available",
]


def _assert_subsequence(expected: list[str], actual: list[str]) -> None:
    position = 0
    for event in actual:
        if position < len(expected) and event == expected[position]:
            position += 1
    assert position == len(expected), f"{expected[position:]} missing in order from {actual}"


def _assert_json_contract(result: CliResult) -> None:
    for record in result.records():
        assert record["schema_version"] == 1
        for key in ("event", "category", "severity", "ts", "seq", "producer", "summary"):
            assert key in record, (key, record)
        assert record["ts"].endswith("Z")
        for value in record.values():
            assert value not in (None, ""), record
        assert "/" not in record.get("model_id", "")


def test_load_json_streams_the_load_events_in_order(fixture_dir: Path) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json")
    assert result.code == 0, result.stderr
    _assert_json_contract(result)
    events = result.events()
    _assert_subsequence(SUCCESS_ORDER, events)
    # a 2 ms load coalesces its 20 callbacks in the ring: at least the final value arrives
    assert events.count("model_load_progress") >= 1
    assert events.count("model_available") == 1
    records = result.records()
    progress = [r for r in records if r["event"] == "model_load_progress"]
    assert all(r["producer"] == "native" for r in progress)
    values = [r["progress"]["current"] for r in progress]
    assert values == sorted(set(values)) and values[-1] == 1000
    assert all(
        r["progress"] == {"current": v, "total": 1000, "unit": "steps"}
        for r, v in zip(progress, values, strict=True)
    )
    device = next(r for r in records if r["event"] == "backend_device_selected")
    assert device["producer"] == "native" and device["device_id"] == "CPU"
    assert device["summaries"]["memory_total_bytes"] > 0
    available = next(r for r in records if r["event"] == "model_available")
    assert available["model_id"] == "tiny"
    assert available["state"] == {"previous": "initializing", "current": "available"}
    assert "model_load_progress" in events  # native facts arrived through the ring
    assert str(fixture_dir) not in result.stdout


def test_a_load_without_flags_batches_four_lanes_and_says_so(fixture_dir: Path) -> None:
    """Issue 12's defaults: 4 lanes, each with the model's training context (2048 for the
    fixture), stated in the load events and the state document; --lanes 1 still works and an
    explicit --ctx keeps 1024 tokens a lane."""
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json")
    assert result.code == 0, result.stderr
    records = {r["event"]: r for r in result.records()}
    ready = records["serving_backend_initialization_completed"]["summaries"]
    assert (ready["lanes"], ready["context_tokens_per_lane"], ready["context_tokens"]) == (
        4,
        2048,
        8192,
    )
    available = records["model_available"]
    assert available["summaries"]["context_tokens_per_lane"] == 2048
    assert "4 lanes × 2048" in available["summary"]
    for alias, flags, geometry in [
        ("one", ("--lanes", "1"), (1, 2048, 2048)),
        ("two", ("--ctx", "2048"), (2, 1024, 2048)),
        ("small", ("--ctx", "512"), (1, 512, 512)),
    ]:
        loaded = run_cli("load", str(fixture_dir / "tiny.gguf"), "--alias", alias, *flags)
        assert loaded.code == 0, loaded.stderr
        assert _geometry(alias) == geometry
    table = run_cli("ps").stdout
    assert "4×2048" in table and "2×1024" in table


def _geometry(model_id: str) -> tuple[int, int, int]:
    (document,) = run_cli("ps", "--json").records()
    model = next(m for m in document["models"] if m["model_id"] == model_id)
    return model["lanes"], model["context_tokens_per_lane"], model["context_tokens"]


def test_embedded_load_streams_its_host_startup_too(fixture_dir: Path) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json", "--embedded")
    assert result.code == 0, result.stderr
    events = result.events()
    assert events.index("native_library_loaded") < events.index("model_load_requested")
    _assert_subsequence(SUCCESS_ORDER, events)


def test_loading_an_available_model_again_succeeds_at_once(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    again = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json")
    assert again.code == 0
    assert again.stdout == ""
    assert "already available" in again.stderr


def test_load_without_json_prints_only_to_stderr(fixture_dir: Path) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"))
    assert result.code == 0
    assert result.stdout == ""
    assert "tiny" in result.stderr and "available" in result.stderr


def test_multipart_split_loads_through_its_first_part(fixture_dir: Path) -> None:
    first = fixture_dir / "tiny-split-00001-of-00003.gguf"
    result = run_cli("load", str(first), "--json")
    assert result.code == 0, result.stderr
    available = [r for r in result.records() if r["event"] == "model_available"]
    assert [r["model_id"] for r in available] == ["tiny-split"]


def _bad_input_cases(fixture_dir: Path, tmp_path: Path) -> dict[str, tuple[list[str], str, int]]:
    return {
        "missing": ([str(tmp_path / "nope.gguf")], "missing_artifact", 12),
        "directory": ([str(tmp_path)], "artifact_io_failure", 13),
        "truncated": ([str(fixture_dir / "truncated.gguf")], "model_format_or_load_failure", 14),
        "bad_magic": ([str(fixture_dir / "bad-magic.gguf")], "model_format_or_load_failure", 14),
        "split_missing": (
            [str(fixture_dir / "missing-part-00001-of-00003.gguf")],
            "missing_artifact",
            12,
        ),
        "duplicate_token": ([str(fixture_dir / "duplicate-token.gguf")], "process_crash", 21),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "directory",
        "truncated",
        "bad_magic",
        "split_missing",
        "duplicate_token",
    ],
)
def test_bad_input_ends_in_one_reason_coded_failure(
    case: str, fixture_dir: Path, tmp_path: Path
) -> None:
    args, reason, code = _bad_input_cases(fixture_dir, tmp_path)[case]
    result = run_cli("load", *args, "--json")
    assert result.code == code, result.stderr
    _assert_json_contract(result)
    terminals = [
        r for r in result.records() if r["event"] in ("model_load_failed", "model_available")
    ]
    assert len(terminals) == 1
    assert terminals[0]["event"] == "model_load_failed"
    assert terminals[0]["reason_code"] == reason
    assert terminals[0]["outcome"] == "failure"
    assert "Traceback" not in result.stderr
    message_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(message_lines) == 1 and reason in message_lines[0]


def test_unreadable_file_is_an_io_failure(fixture_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "secret.gguf"
    shutil.copy(fixture_dir / "tiny.gguf", target)
    target.chmod(0)
    command = [sys.executable, "-m", "skippyctl", "load", str(target), "--json"]
    if os.geteuid() == 0:
        # root reads any file: drop the capabilities that bypass mode bits for this process only
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    assert result.code == 13, result.stderr
    failed = [r for r in result.records() if r["event"] == "model_load_failed"]
    assert [r["reason_code"] for r in failed] == ["artifact_io_failure"]
    assert "Permission denied" in result.stderr


def _start_slow_load(fixture_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SKIPPY_TEST_PROGRESS_DELAY_US="150000")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skippyctl",
            "load",
            str(fixture_dir / "tiny.gguf"),
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _read_until(proc: subprocess.Popen[bytes], event: str) -> list[dict[str, object]]:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        record = orjson.loads(line)
        seen.append(record)
        if record["event"] == event:
            return seen
    raise AssertionError(f"{event} never arrived: {[r['event'] for r in seen]}")


def test_ctrl_c_cancels_the_load_through_the_progress_callback(fixture_dir: Path) -> None:
    proc = _start_slow_load(fixture_dir)
    try:
        _read_until(proc, "model_load_progress")
        proc.send_signal(signal.SIGINT)
        rest = _read_until(proc, "model_load_cancelled")
        assert proc.wait(60) == 130
    finally:
        proc.kill()
        proc.wait()
    cancelled = rest[-1]
    assert cancelled["reason_code"] == "cancellation" and cancelled["outcome"] == "cancelled"
    assert "model_available" not in [r["event"] for r in rest]


def test_timeout_cancels_and_exits_124(fixture_dir: Path) -> None:
    proc = _start_slow_load(fixture_dir, "--timeout", "0.5")
    try:
        records = _read_until(proc, "model_load_failed")
        assert proc.wait(60) == 124
    finally:
        proc.kill()
        proc.wait()
    assert records[-1]["reason_code"] == "timeout"


def test_legacy_mode_loads_and_says_so_once(fixture_dir: Path) -> None:
    result = run_cli(
        "load",
        str(fixture_dir / "tiny.gguf"),
        "--json",
        "--embedded",  # a one-shot host: its startup events are part of this stream
        env={"SKIPPY_NATIVE_DISABLE": "1"},
    )
    assert result.code == 0, result.stderr
    events = result.events()
    assert events.count("native_library_unavailable") == 1
    assert "model_load_progress" not in events
    assert events.count("model_available") == 1
    started = next(r for r in result.records() if r["event"] == "model_load_started")
    assert started["producer"] == "reconciled"


def test_importing_the_cli_does_not_import_textual() -> None:
    code = "import skippyctl.cli.app, sys; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_core_packages_do_not_import_rich_or_typer() -> None:
    code = (
        "import sys, skippyctl.pipeline.pipeline, skippyctl.runtime.host, skippyctl.reducer.reduce;"
        "print(sorted(m for m in ('rich', 'typer', 'textual') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [
        ["--stage", "localhost:50052"],
        ["--stage", "127.0.0.1:5", "--stage", "127.0.0.1:5"],
        ["--local-stages", "17"],
        ["--mem", "64"],
        ["--replan"],
        ["--local-stages", "2", "--stage", "not-an-endpoint"],
        ["--spec-runahead-tokens", "999"],
        ["--spec", "ngram", "--draft", "draft.gguf"],
        ["--ctx", "0"],
        ["--timeout", "-1"],
        ["--threads", "0"],
        ["--lanes", "-3"],
        ["--spec", "magic"],
    ],
)
def test_bad_options_exit_10_before_any_runtime_with_one_error_record(
    fixture_dir: Path, args: list[str]
) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json", *args)
    assert result.code == 10, result.stderr
    (record,) = result.records()  # no runtime was asked: no event, one error record
    assert record["record"] == "error" and record["command"] == "load"
    assert record["exit_code"] == 10 and record["reason_code"] == "invalid_configuration"
    assert record["message"] and "/" not in record["message"]  # no path in a record
    assert "Traceback" not in result.stderr and record["message"] in result.stderr


def test_embedded_load_across_local_stages_is_available_and_reports_its_topology(
    fixture_dir: Path,
) -> None:
    result = run_cli(
        "load", str(fixture_dir / "tiny.gguf"), "--json", "--embedded", "--local-stages", "2"
    )
    assert result.code == 0, result.stderr
    events = [r["event"] for r in result.records()]
    _assert_subsequence(
        [
            "stage_starting",
            "stage_ready",
            "topology_assembling",
            "stage_loading",
            "model_available",
        ],
        events,
    )
    assert "topology_ready" in events
    for record in result.records():
        assert "127.0.0.1" not in str(record)


def test_a_host_says_how_it_resolved_its_runtime_before_it_is_initialized(
    fixture_dir: Path,
) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--json", "--embedded")
    assert result.code == 0, result.stderr
    events = result.events()
    started = events.index("runtime_resolution_started")
    assert started < events.index("runtime_resolution_completed")
    assert events.index("runtime_resolution_completed") < events.index("runtime_initialized")
    assert "runtime_resolution_failed" not in events


def test_a_foreign_native_library_is_rejected_and_the_host_serves_without_it(
    fixture_dir: Path,
) -> None:
    """A real shared library that is not skippy's (llama.cpp's own ggml) in place of the native
    event library: found, refused for its ABI, and the host loads in legacy mode."""
    import llama_cpp

    foreign = next(Path(llama_cpp.__file__).parent.glob("lib/libggml-base.so*"))
    result = run_cli(
        "load",
        str(fixture_dir / "tiny.gguf"),
        "--json",
        "--embedded",
        env={"SKIPPY_NATIVE_LIBRARY": str(foreign)},
    )
    assert result.code == 0, result.stderr
    records = result.records()
    rejected = [r for r in records if r["event"] == "native_library_rejected"]
    assert [r["reason_code"] for r in rejected] == ["incompatible_abi_or_feature_set"]
    events = result.events()
    assert events.index("native_library_rejected") < events.index(
        "abi_feature_compatibility_failed"
    )
    assert "native_library_loaded" not in events and events.count("model_available") == 1
    assert str(foreign) not in result.stdout  # no path in any record


def test_load_json_shows_the_serving_plugin_loaded_as_part_of_the_load(fixture_dir: Path) -> None:
    """Issue 29: a plugin's ``serving_plugin_loaded`` carries the load's operation id, so the
    load's own record stream has it (attached to the runtime the command started); its
    ``--plugin-config`` is stated as a length only."""
    result = run_cli(
        "load", str(fixture_dir / "tiny.gguf"), "--plugin", "ngram",
        "--plugin-config", "secret-ish=1", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    records = result.records()
    (loaded,) = [r for r in records if r["event"] == "serving_plugin_loaded"]
    (requested,) = [r for r in records if r["event"] == "model_load_requested"]
    assert loaded["operation_id"] == requested["operation_id"]
    assert loaded["plugin_id"] == "ngram" and loaded["model_id"] == "tiny"
    assert requested["settings"]["plugin_config"] == len("secret-ish=1")
    assert "secret-ish" not in result.stdout + result.stderr
