"""`skippyctl generate`: text on stdout, lifecycle on stderr; --json separates both."""

from __future__ import annotations

from pathlib import Path

from skippyctl.fixtures import TINY_SUCCESSOR, make_model, successor_cycles
from tests.cli.helpers import run_cli


def test_generate_streams_text_and_lifecycle(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    result = run_cli("generate", "tiny", "Once upon a time", "--max-tokens", "8", "--json")
    assert result.code == 0, result.stderr
    records = result.records()
    outputs = [r for r in records if r.get("record") == "output"]
    events = [r for r in records if "event" in r]
    receipt = records[-1]
    assert receipt["record"] == "receipt"
    assert outputs and len(outputs) + len(events) + 1 == len(records)
    assert all(set(r) == {"schema_version", "record", "text"} for r in outputs)
    assert all("text" not in r for r in events)
    names = [r["event"] for r in events]
    assert "request_received" in names and "generation_completed" in names
    assert len({r["request_id"] for r in events}) == 1
    completed = next(r for r in events if r["event"] == "generation_completed")
    assert completed["stop_reason"] == "length"
    assert completed["summaries"]["generated_tokens"] >= 1
    assert receipt["request_id"] == events[0]["request_id"]
    assert receipt["generated_tokens"] == completed["summaries"]["generated_tokens"]
    assert receipt["outcome"] == "completed" and receipt["stop_reason"] == "length"
    assert "Once" not in str(receipt)  # counts and timings only

    plain = run_cli("generate", "tiny", "Hello", "--max-tokens", "4", "--seed", "1")
    assert plain.code == 0, plain.stderr
    assert plain.stdout.strip()
    assert "ttft" in plain.stderr and "decode" in plain.stderr and "queued" in plain.stderr


def test_generate_for_a_model_not_loaded_fails_with_its_code() -> None:
    result = run_cli("generate", "absent", "hi", "--json")
    assert result.code == 12, result.stderr
    (record,) = result.records()
    assert record["record"] == "error" and record["exit_code"] == 12


def test_generate_on_the_successor_model_streams_the_known_cycle(tmp_path: Path) -> None:
    path = make_model(tmp_path / "tiny-successor.gguf", TINY_SUCCESSOR)
    assert run_cli("load", str(path)).code == 0
    n = 60
    result = run_cli(
        "generate", "tiny-successor", "the quick brown fox", "--max-tokens", str(n),
        "--temperature", "0",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    table = successor_cycles(TINY_SUCCESSOR)
    expected = table.text(table.continuation(table.word_id("fox"), n))
    assert result.stdout == expected + "\n"  # the CLI ends the text with a newline
    assert "stop: length" in result.stderr  # never an end-of-generation token
