"""The models a runtime may load on demand: presets first, then the models directory's GGUFs by
their names without .gguf (a split set by its first part), read when asked."""

from __future__ import annotations

from pathlib import Path

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.model_presets import Preset
from skippyctl.events.envelope import LogicalId
from skippyctl.runtime.model_catalog import LoadableSource, ModelCatalog


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"GGUF")


def test_the_models_directory_names_files_as_llama_servers_router(tmp_path: Path) -> None:
    _touch(
        tmp_path,
        "alpha.gguf",
        "big-00001-of-00003.gguf",
        "big-00002-of-00003.gguf",
        "big-00003-of-00003.gguf",
        "mmproj-alpha.gguf",
        ".hidden.gguf",
        "readme.txt",
    )
    (tmp_path / "folder.gguf").mkdir()
    catalog = ModelCatalog(models_dir=tmp_path)
    assert sorted(str(e.model_id) for e in catalog.loadable()) == ["alpha", "big"]
    big = catalog.find("big")
    assert big is not None and big.source is LoadableSource.MODELS_DIR
    assert big.options.model == str(tmp_path / "big-00001-of-00003.gguf")
    assert big.options.alias == "big"
    for unknown in ("mmproj-alpha", "readme", "folder", "big-00002-of-00003", "../alpha", ""):
        assert catalog.find(unknown) is None, unknown


def test_a_file_copied_in_is_loadable_at_once(tmp_path: Path) -> None:
    catalog = ModelCatalog(models_dir=tmp_path)
    assert catalog.find("late") is None
    _touch(tmp_path, "late.gguf")
    assert catalog.find("late") is not None


def test_presets_come_first_and_each_id_is_listed_once(tmp_path: Path) -> None:
    _touch(tmp_path, "alpha.gguf", "beta.gguf")
    preset = Preset(
        LogicalId("alpha"), LoadOptions("/elsewhere/alpha.gguf", alias="alpha", pinned=True)
    )
    catalog = ModelCatalog({LogicalId("alpha"): preset}, tmp_path)
    listed = catalog.loadable()
    assert [str(e.model_id) for e in listed] == ["alpha", "beta"]
    alpha = catalog.find("alpha")
    assert alpha is not None and alpha.source is LoadableSource.PRESET and alpha.pinned
    assert alpha.options.model == "/elsewhere/alpha.gguf"


def test_an_empty_or_missing_directory_knows_nothing(tmp_path: Path) -> None:
    assert ModelCatalog().empty and ModelCatalog().find("x") is None
    gone = ModelCatalog(models_dir=tmp_path / "absent")
    assert gone.loadable() == [] and gone.find("x") is None
