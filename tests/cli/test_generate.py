"""`skippyctl generate`: text on stdout, lifecycle on stderr; --json separates both."""

from __future__ import annotations

from pathlib import Path

from skippyctl.fixtures import TINY_SUCCESSOR, make_model, successor_cycles
from tests.cli.helpers import run_cli


def test_generate_streams_text_and_lifecycle(fixture_dir: Path) -> None:
    assert run_cli("load", str(fixture_dir / "tiny.gguf")).code == 0
    # Sampled (the default temperature): tiny.gguf may sample its end-of-generation token
    # within 8 tokens (its logits are flat), so the stop is "length" or "eos", and the counts
    # must agree with which.
    result = run_cli(
        "generate", "tiny", "Once upon a time", "--max-tokens", "8", "--seed", "7", "--json"
    )
    assert result.code == 0, result.stderr
    records = result.records()
    outputs = [r for r in records if r.get("record") == "output"]
    events = [r for r in records if "event" in r]
    receipt = records[-1]
    assert receipt["record"] == "receipt"
    assert len(outputs) + len(events) + 1 == len(records)
    assert all(set(r) == {"schema_version", "record", "text"} for r in outputs)
    assert all("text" not in r for r in events)
    names = [r["event"] for r in events]
    assert "request_received" in names and "generation_completed" in names
    assert len({r["request_id"] for r in events}) == 1
    completed = next(r for r in events if r["event"] == "generation_completed")
    assert completed["stop_reason"] in ("length", "eos")
    generated = completed["summaries"]["generated_tokens"]
    assert generated == 8 if completed["stop_reason"] == "length" else 0 <= generated < 8
    assert receipt["request_id"] == events[0]["request_id"]
    assert receipt["generated_tokens"] == completed["summaries"]["generated_tokens"]
    assert receipt["outcome"] == "completed"
    assert receipt["stop_reason"] == completed["stop_reason"]
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
    (summary,) = result.stderr.splitlines(keepends=True)  # one line for people, ended
    assert summary.startswith("✓ tiny-successor: ttft ") and summary.endswith("\n")


def test_speculation_gives_the_same_cycle_and_its_receipt_counts_the_accepted_tokens(
    fixture_dir: Path,
) -> None:
    path = fixture_dir / "tiny-successor.gguf"
    loaded = run_cli("load", str(path), "--alias", "succ-ngram", "--spec", "ngram", "--json")
    assert loaded.code == 0, loaded.stderr
    n = 120
    result = run_cli(
        "generate", "succ-ngram", "the quick brown fox", "--max-tokens", str(n),
        "--temperature", "0", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    records = result.records()
    table = successor_cycles(TINY_SUCCESSOR)
    text = "".join(r["text"] for r in records if r.get("record") == "output")
    assert text == table.text(table.continuation(table.word_id("fox"), n))
    receipt = records[-1]
    assert receipt["record"] == "receipt"
    spec = receipt["speculative"]
    # Nothing to look up during the first cycle (48 words); after it, most tokens were proposed.
    assert spec["mode"] == "ngram" and spec["accepted"] > (n - 48) // 2
    assert spec["rejected"] == spec["proposed"] - spec["accepted"]
    completed = next(r for r in records if r.get("event") == "generation_completed")
    assert completed["summaries"]["spec_accepted_tokens"] == spec["accepted"]
    plain = run_cli("generate", "succ-ngram", "the quick brown fox", "--max-tokens", "8")
    assert "ngram:" in plain.stderr and "proposed tokens accepted" in plain.stderr


def test_an_unknown_speculation_mode_is_refused_before_any_runtime_is_reached(
    fixture_dir: Path,
) -> None:
    result = run_cli("load", str(fixture_dir / "tiny.gguf"), "--spec", "magic", "--json")
    assert result.code == 10, result.stderr
    assert "--spec must be one of: off, auto, ngram" in result.stderr
    too_many = run_cli("load", str(fixture_dir / "tiny.gguf"), "--spec-draft-tokens", "65")
    assert too_many.code == 10 and "1-64" in too_many.stderr
