"""Model references: the forms that parse, the malformed ones, and how a quant reference or a
missing file resolves against a repo of the loopback hub (tests/acquisition/fake_hub.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippyctl.acquisition.references import RefError, RefKind, parse_ref
from skippyctl.events.catalog import EventId as _E
from skippyctl.events.reasons import ReasonCode
from tests.acquisition.fake_hub import FakeHub
from tests.acquisition.helpers import FILE, REPO, assert_one_terminal_each, failed, leftovers, pull


@pytest.mark.parametrize(
    ("text", "kind", "repo", "filename", "quant"),
    [
        ("hf://acme/tiny-GGUF/tiny-Q4_K_M.gguf", RefKind.HF_FILE, REPO, FILE, None),
        ("hf://acme/r/sub/dir/x.GGUF", RefKind.HF_FILE, "acme/r", "sub/dir/x.GGUF", None),
        ("acme/tiny-GGUF:Q4_K_M", RefKind.HF_QUANT, REPO, None, "Q4_K_M"),
        ("fixtures-that-do-not-exist/x.gguf", RefKind.LOCAL, None, None, None),
        ("/abs/model.gguf", RefKind.LOCAL, None, None, None),
    ],
)
def test_reference_forms_parse(
    text: str, kind: RefKind, repo: str | None, filename: str | None, quant: str | None
) -> None:
    ref = parse_ref(text)
    assert (ref.kind, ref.repo_id, ref.filename, ref.quant) == (kind, repo, filename, quant)


@pytest.mark.parametrize(
    "text", ["hf://acme", "hf://acme/r/notes.txt", "hf://acme/r/../x.gguf", "a\x00b"]
)
def test_malformed_references_are_refused(text: str) -> None:
    with pytest.raises(RefError):
        parse_ref(text)


def test_an_existing_local_path_wins_over_the_quant_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "x:Q4").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert parse_ref("acme/x:Q4").kind is RefKind.LOCAL


@pytest.mark.parametrize(
    "ref", [f"hf://{REPO}/absent.gguf", "hf://acme/absent-repo/x.gguf", f"{REPO}:Q3_K_S"]
)
def test_a_missing_file_or_repo_fails_resolution_as_missing_artifact(
    hub: FakeHub, cache: Path, ref: str
) -> None:
    recorder, error = failed(hub, cache, ref)

    assert error.reason is ReasonCode.MISSING_ARTIFACT
    assert recorder.ids == [
        _E.MODEL_QUEUED,
        _E.MODEL_RESOLUTION_STARTED,
        _E.MODEL_RESOLUTION_FAILED,
        _E.MODEL_PREPARATION_FAILED,
    ]
    assert {e.reason_code for e in recorder.events[-2:]} == {ReasonCode.MISSING_ARTIFACT}
    assert_one_terminal_each(recorder)
    assert leftovers(cache) == []


def test_quant_reference_picks_the_one_matching_file(
    hub: FakeHub, cache: Path, files: dict[str, bytes]
) -> None:
    recorder, prepared = pull(hub, cache, f"{REPO}:q8_0")  # case-insensitive; not the mmproj
    assert prepared.path.name == "tiny-Q8_0.gguf"
    assert prepared.path.read_bytes() == files["tiny-Q8_0.gguf"]
    assert recorder.events[0].scope.model_id is None  # not known before the listing
    assert str(recorder.events[-1].scope.model_id) == "tiny-Q8_0"


def test_quant_reference_matching_several_files_lists_them(hub: FakeHub, cache: Path) -> None:
    recorder, error = failed(hub, cache, f"{REPO}:Q")
    assert error.reason is ReasonCode.INVALID_CONFIGURATION
    assert "tiny-Q4_K_M.gguf" in error.message
    assert "tiny-Q8_0.gguf" in error.message
    assert "split/tiny-split-Q2_K-00001-of-00003.gguf" in error.message
    assert "mmproj" not in error.message
    assert recorder.ids[-2:] == [_E.MODEL_RESOLUTION_FAILED, _E.MODEL_PREPARATION_FAILED]


def test_quant_reference_with_no_match_lists_the_repo_files(hub: FakeHub, cache: Path) -> None:
    _, error = failed(hub, cache, f"{REPO}:IQ1_S")
    assert error.reason is ReasonCode.MISSING_ARTIFACT
    assert "tiny-Q4_K_M.gguf" in error.message
