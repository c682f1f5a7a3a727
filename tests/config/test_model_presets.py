"""Presets files: every load option by its JSON name, paths relative to the file, and every
problem named by model and key (never a value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skippyctl.config.load_options import SpecMode
from skippyctl.config.model_presets import PresetsError, parse_presets, read_presets


def test_a_preset_is_a_load_under_its_tables_name(tmp_path: Path) -> None:
    presets = tmp_path / "presets.toml"
    presets.write_text(
        """
[models.chat]
model = "sub/chat.gguf"
lanes = 2
ctx = 4096
ttl = 300
spec = "draft"
draft = "/abs/draft.gguf"

[models.hub]
model = "hf://org/repo/file.gguf"
pinned = true
ttl = -1
"""
    )
    found = read_presets(presets)
    chat = found["chat"].options  # type: ignore[index]
    assert chat.alias == "chat" and chat.model == str(tmp_path / "sub" / "chat.gguf")
    assert (chat.lanes, chat.ctx, chat.ttl, chat.spec) == (2, 4096, 300.0, SpecMode.DRAFT)
    assert chat.draft == "/abs/draft.gguf"
    hub = found["hub"]  # type: ignore[index]
    assert hub.from_hub and hub.options.model == "hf://org/repo/file.gguf"
    assert hub.options.pinned and hub.options.ttl == -1.0


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"model": {}}, "unknown top-level key 'model'"),
        ({"models": []}, "[models] must be a table"),
        ({"models": {"bad name!": {"model": "a.gguf"}}}, "a preset's name is its model id"),
        ({"models": {"a": "a.gguf"}}, "preset 'a' must be a table"),
        ({"models": {"a": {"lanes": 2}}}, "preset 'a': 'model'"),
        ({"models": {"a": {"model": "a.gguf", "colour": 1}}}, "unknown key 'colour'"),
        ({"models": {"a": {"model": "a.gguf", "alias": "b"}}}, "drop 'alias'"),
        ({"models": {"a": {"model": "a.gguf", "lanes": "2"}}}, "'lanes' must be a whole number"),
        ({"models": {"a": {"model": "a.gguf", "lanes": True}}}, "'lanes' must be a whole number"),
        ({"models": {"a": {"model": "a.gguf", "ttl": "5m"}}}, "'ttl' must be a number"),
        ({"models": {"a": {"model": "a.gguf", "ttl": -0.5}}}, "--ttl"),
        ({"models": {"a": {"model": "a.gguf", "pinned": 1}}}, "'pinned' must be true or false"),
        ({"models": {"a": {"model": "a.gguf", "spec": "fast"}}}, "'spec' must be one of"),
        ({"models": {"a": {"model": "a.gguf", "stages": "h:1"}}}, "a list of strings"),
        ({"models": {"a": {"model": "a.gguf", "lanes": 0}}}, "--lanes"),
    ],
)
def test_each_problem_names_the_model_and_key(document: dict[str, object], named: str) -> None:
    with pytest.raises(PresetsError) as raised:
        parse_presets(document, Path("/base"))
    assert named in str(raised.value)


def test_a_file_that_is_not_toml_or_not_there_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[models.a\nmodel = ")
    with pytest.raises(PresetsError, match="not TOML"):
        read_presets(broken)
    with pytest.raises(PresetsError, match="cannot read"):
        read_presets(tmp_path / "absent.toml")
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(PresetsError, match="larger than"):
        read_presets(huge)
