"""The models a runtime may load on demand: its presets, then the GGUFs of its models directory.

A request that names a model that is not loaded is served by loading it when this catalog knows
the name (``Scheduler.demand``): a preset (``runtime serve --presets FILE``,
``config/model_presets.py``) by its table's name, else a file of ``--models-dir`` by its name
without ``.gguf`` (a split set by its first part's name without the ``-00001-of-0000N`` suffix),
as llama-server's router names them, else a single-file GGUF of the local hub cache (what
`pull` fetched) by its file's name. The directory is read when asked (it is small), so a file
copied in is loadable at once; a name that would be the same for two files goes to the one that
sorts first. Paths never leave the host: listings carry ids and where a model comes from.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.model_presets import Preset, PresetsError, read_presets
from skippyctl.events.envelope import LogicalId
from skippyctl.events.identity import is_logical_id, model_id_for

MAX_DIRECTORY_ENTRIES: Final = 4096
"""A models directory is read up to this many entries (a huge directory must not stall a
request)."""
_LATER_SPLIT_PART: Final = re.compile(r"-(?!0*1-of-)\d+-of-\d+\.gguf$", re.IGNORECASE)
_SPLIT_PART: Final = re.compile(r"-\d+-of-\d+\.gguf$", re.IGNORECASE)


class LoadableSource(StrEnum):
    """Where a loadable model comes from (``/v1/models``, ``ps``)."""

    PRESET = "preset"
    MODELS_DIR = "models_dir"
    HUB_CACHE = "hub_cache"


@dataclass(frozen=True, slots=True)
class Loadable:
    model_id: LogicalId
    options: LoadOptions
    """The load that serves it (``alias`` is ``model_id``)."""
    source: LoadableSource
    pinned: bool = False

    def idle_ttl_s(self, default_ttl_s: float) -> float | None:
        """Idle seconds before it unloads once loaded (its load's ``ttl``, else the runtime's
        ``default_ttl_s``, as ``Scheduler.load`` sets them); None: never (pinned, or -1)."""
        ttl = default_ttl_s if self.options.ttl is None else self.options.ttl
        return ttl if ttl >= 0 and not self.pinned else None


class ModelCatalog:
    """Presets and a models directory, both optional (an empty catalog knows no model)."""

    def __init__(
        self,
        presets: Mapping[LogicalId, Preset] | None = None,
        models_dir: Path | None = None,
        presets_file: Path | None = None,
        hub_cache: bool = False,
    ) -> None:
        self.presets = dict(presets or {})
        self.models_dir = models_dir
        self.hub_cache = hub_cache
        """Single-file GGUFs in the local hub cache (what `pull` fetched) are loadable by their
        file's name, after presets and the models directory."""
        self.presets_file = presets_file
        """Read again when it changes (``tune --apply`` writes it), so the next on-demand load
        uses what it says; a change that does not read keeps the presets it had."""
        self._presets_stamp = _stamp(presets_file)
        self._lock = threading.Lock()

    @property
    def empty(self) -> bool:
        return not self.presets and self.models_dir is None and self.presets_file is None

    def find(self, name: str) -> Loadable | None:
        """The load that serves ``name``, or None when the catalog does not know it."""
        presets = self._current_presets()
        preset = presets.get(LogicalId(name)) if is_logical_id(name) else None
        if preset is not None:
            return _from_preset(preset)
        return self._directory().get(name) or self._cached().get(name)

    def loadable(self) -> list[Loadable]:
        """Every model the catalog knows, presets first, each id once."""
        presets = self._current_presets()
        found = {model_id: _from_preset(preset) for model_id, preset in presets.items()}
        for model_id, entry in (*self._directory().items(), *self._cached().items()):
            found.setdefault(LogicalId(model_id), entry)
        return list(found.values())

    def _current_presets(self) -> dict[LogicalId, Preset]:
        path = self.presets_file
        if path is None:
            return self.presets
        stamp = _stamp(path)
        with self._lock:
            if stamp != self._presets_stamp:
                self._presets_stamp = stamp
                # A file being edited, or broken: the presets it last had serve.
                with contextlib.suppress(PresetsError):
                    self.presets = read_presets(path)
            return self.presets

    def _directory(self) -> dict[str, Loadable]:
        root = self.models_dir
        if root is None:
            return {}
        names: list[str] = []
        try:
            with os.scandir(root) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_DIRECTORY_ENTRIES:
                        break
                    if _model_file(entry):
                        names.append(entry.name)
        except OSError:
            return {}
        found: dict[str, Loadable] = {}
        for name in sorted(names):
            model_id = model_id_for(name)
            if str(model_id) in found:
                continue
            options = LoadOptions(model=str(root / name), alias=str(model_id))
            found[str(model_id)] = Loadable(model_id, options, LoadableSource.MODELS_DIR)
        return found

    def _cached(self) -> dict[str, Loadable]:
        """The hub cache's single-file GGUFs by their names (the newest revision first; a
        split set's parts are not loadable from the cache: its links resolve to blobs named by
        hash, where llama.cpp cannot find the other parts)."""
        if not self.hub_cache:
            return {}
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound

        try:
            info = scan_cache_dir()
        except (CacheNotFound, OSError, ValueError):
            return {}
        found: dict[str, Loadable] = {}
        for repo in sorted(info.repos, key=lambda repo: repo.repo_id):
            if repo.repo_type != "model":
                continue
            newest_first = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
            for revision in newest_first:
                for file in sorted(revision.files, key=lambda file: file.file_name):
                    name = file.file_name
                    if not name.lower().endswith(".gguf") or _SPLIT_PART.search(name):
                        continue
                    model_id = model_id_for(Path(name).name)
                    if str(model_id) in found:
                        continue
                    options = LoadOptions(model=str(file.file_path), alias=str(model_id))
                    found[str(model_id)] = Loadable(model_id, options, LoadableSource.HUB_CACHE)
        return found


def _stamp(path: Path | None) -> tuple[int, int] | None:
    """What says a file changed (its modification time and size); None: none, or unreadable."""
    if path is None:
        return None
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def _model_file(entry: os.DirEntry[str]) -> bool:
    name = entry.name
    if not name.lower().endswith(".gguf") or name.startswith(".") or name.startswith("mmproj"):
        return False
    if _LATER_SPLIT_PART.search(name):
        return False  # a split set is named by its first part
    try:
        return entry.is_file()
    except OSError:
        return False


def _from_preset(preset: Preset) -> Loadable:
    return Loadable(
        preset.model_id, preset.options, LoadableSource.PRESET, pinned=preset.options.pinned
    )
