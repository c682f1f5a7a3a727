"""`skippyctl models list | rm | prune`: the local model cache (Hugging Face's, where `pull` puts
files), with what the running runtime has loaded and what a presets file names.

A cached GGUF is shown as its reference (``hf://ORG/REPO/FILE``), its model id (the file's name,
as `load` names it), its size and when it was last read. "Loaded" asks the running runtime
(`/v1/models`; none running: nothing is loaded) and matches a loaded model by the file's id or by
a preset of ``--presets`` that names the file (the runtime never says which file a model came
from: paths and references stay on its side); "presets" lists those presets. `rm` and `prune`
never remove a loaded file (``rm --force`` does), and `prune` keeps what a preset names. A file
is removed as the hub cache holds it: its snapshot links, then its blob when no other link
points at it. Paths are never printed.

A download that stopped keeps its bytes (``blobs/<etag>.incomplete``) until a pull of the same
file resumes it: `list` shows each such partial download by its repo, `prune` removes them
(``--older-than`` by when they were last written) and `rm ORG/REPO` removes the repo's, except
one a pull is writing now (it holds the blob's lock).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json, fail, stderr_console
from skippyctl.output.summary import format_bytes

models_app = typer.Typer(
    help="The local model cache: what `pull` fetched, its size, what is loaded; remove and prune.",
    no_args_is_help=True,
)

PresetsOption = Annotated[
    Path | None,
    typer.Option(
        "--presets",
        help="A presets file: the cached files its hf:// presets name are shown (and kept).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON record per file.")]


@dataclass(frozen=True, slots=True)
class CachedModel:
    ref: str
    model_id: str
    size_bytes: int
    last_used: float
    links: tuple[Path, ...]
    blob: Path
    presets: tuple[str, ...] = ()
    loaded: bool = False

    def record(self, kind: str) -> dict[str, Any]:
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "record": kind,
            "ref": self.ref,
            "model_id": self.model_id,
            "size_bytes": self.size_bytes,
            "last_used_at": _utc(self.last_used),
            "loaded": self.loaded,
            "presets": list(self.presets),
        }


@dataclass(frozen=True, slots=True)
class PartialDownload:
    repo_id: str
    size_bytes: int
    last_written: float
    path: Path
    lock: Path

    def record(self, kind: str) -> dict[str, Any]:
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "record": kind,
            "repo": self.repo_id,
            "size_bytes": self.size_bytes,
            "last_written_at": _utc(self.last_written),
        }

    def remove_unless_in_use(self) -> bool:
        """Removed, unless a pull holds the blob's lock (it is writing the file now)."""
        from filelock import FileLock, Timeout

        if not self.lock.parent.is_dir():
            self.path.unlink(missing_ok=True)
            return True
        lock = FileLock(str(self.lock))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            self.path.unlink(missing_ok=True)
        finally:
            lock.release()
        return True


def _utc(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="seconds")


def partial_downloads() -> list[PartialDownload]:
    """The unfinished downloads of the hub cache's model repos, oldest first."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    found: list[PartialDownload] = []
    for storage in root.glob("models--*"):
        repo_id = storage.name.removeprefix("models--").replace("--", "/")
        for path in (storage / "blobs").glob("*.incomplete"):
            try:
                stat = path.stat()
            except OSError:
                continue  # finished or removed meanwhile
            etag = path.name.split(".", 1)[0]
            lock = root / ".locks" / storage.name / f"{etag}.lock"
            found.append(PartialDownload(repo_id, stat.st_size, stat.st_mtime, path, lock))
    return sorted(found, key=lambda partial: partial.last_written)


def cached_models(presets_file: Path | None, json_output: bool) -> list[CachedModel]:
    """Every GGUF in the hub cache, with its presets and whether the runtime has it loaded."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from skippyctl.events.identity import model_id_for

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    named = _preset_refs(presets_file, json_output)
    loaded = _loaded_ids(json_output)
    by_ref: dict[str, CachedModel] = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            for file in revision.files:
                if not file.file_name.lower().endswith(".gguf"):
                    continue
                ref = f"hf://{repo.repo_id}/{file.file_name}"
                known = by_ref.get(ref)
                links = (file.file_path,) if known is None else (*known.links, file.file_path)
                presets = tuple(sorted(named.get(ref, ())))
                model_id = str(model_id_for(file.file_name))
                by_ref[ref] = CachedModel(
                    ref=ref,
                    model_id=model_id,
                    size_bytes=file.size_on_disk,
                    last_used=file.blob_last_accessed,
                    links=links,
                    blob=file.blob_path,
                    presets=presets,
                    loaded=model_id in loaded or any(p in loaded for p in presets),
                )
    return sorted(by_ref.values(), key=lambda model: model.ref)


def _preset_refs(presets_file: Path | None, json_output: bool) -> dict[str, set[str]]:
    if presets_file is None:
        return {}
    from skippyctl.config.model_presets import PresetsError, read_presets

    try:
        presets = read_presets(presets_file.expanduser())
    except PresetsError as error:
        fail("models", ExitCode.INVALID_CONFIGURATION, f"--presets: {error}", json_output)
    named: dict[str, set[str]] = {}
    for model_id, preset in presets.items():
        if preset.from_hub:
            named.setdefault(preset.options.model, set()).add(str(model_id))
    return named


def _loaded_ids(json_output: bool) -> set[str]:
    """The running runtime's loaded (and loading) model ids; none running: none."""
    from skippyctl.cli.settings import runtime_settings
    from skippyctl.client.http import ApiError, RuntimeUnreachable
    from skippyctl.client.launch import connect

    try:
        client = connect(runtime_settings("models", json_output), autostart=False)
    except RuntimeUnreachable:
        return set()
    try:
        cards = client.models()
    except (ApiError, RuntimeUnreachable):
        return set()
    finally:
        client.close()
    return {str(card.get("id")) for card in cards if card.get("state") in ("loaded", "loading")}


def _remove(model: CachedModel, every: list[CachedModel]) -> None:
    """Its snapshot links, then its blob unless another cached file points at it."""
    for link in model.links:
        link.unlink(missing_ok=True)
    shared = any(other.blob == model.blob and other.ref != model.ref for other in every)
    if not shared:
        model.blob.unlink(missing_ok=True)


def _show(
    models: list[CachedModel],
    kind: str,
    json_output: bool,
    verb: str = "",
    partials: tuple[list[PartialDownload], str] = ([], ""),
) -> None:
    """One record (--json) or one line per file and per partial download (``partials``: them
    and their record kind); for people, a last line with the count and the size (``verb``:
    what happened to it)."""
    err = stderr_console()
    for model in models:
        if json_output:
            emit_json(model.record(kind))
        else:
            flags = ", ".join(
                [*(["loaded"] if model.loaded else []), *(f"preset {p}" for p in model.presets)]
            )
            err.print(
                f"{model.ref}  {format_bytes(model.size_bytes)}  last used "
                f"{model.record(kind)['last_used_at']}" + (f"  ({flags})" if flags else ""),
                markup=False,
            )
    unfinished, partial_kind = partials
    for partial in unfinished:
        if json_output:
            emit_json(partial.record(partial_kind))
        else:
            err.print(
                f"hf://{partial.repo_id}  {format_bytes(partial.size_bytes)}  partial download, "
                f"last written {partial.record(partial_kind)['last_written_at']}",
                markup=False,
            )
    if not json_output:
        total = format_bytes(
            sum(model.size_bytes for model in models)
            + sum(partial.size_bytes for partial in unfinished)
        )
        counted = f"{len(models)} file(s)" + (
            f" and {len(unfinished)} partial download(s)" if unfinished else ""
        )
        err.print(f"{counted}, {verb}{total}", markup=False)


@models_app.command("list")
def list_command(presets: PresetsOption = None, json_output: JsonOption = False) -> None:
    """List the GGUFs in the local model cache: size, last use, loaded, named by a preset.

    Then the partial downloads (a pull that stopped; the next pull of the same file resumes
    it): their repo, size and when last written (--json: records "partial_download").

    Example:

        skippyctl models list --json | jq -r 'select(.record == "cached_model") | .ref'
    """
    models = cached_models(presets, json_output)
    _show(models, "cached_model", json_output, partials=(partial_downloads(), "partial_download"))


@models_app.command("rm")
def rm_command(
    ref: Annotated[
        str,
        typer.Argument(help="hf://ORG/REPO/FILE.gguf, or ORG/REPO for all its GGUFs."),
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Remove it even when the runtime has it loaded.")
    ] = False,
    presets: PresetsOption = None,
    json_output: JsonOption = False,
) -> None:
    """Remove a cached model from the local cache (exit 12 when the cache has none such).

    A file the runtime has loaded is refused (exit 10) unless --force: loaded under its own
    name, or under a preset's id when --presets names the runtime's presets file. ORG/REPO
    also removes the repo's partial downloads (not one a pull is writing now).

    Example:

        skippyctl models rm hf://ggml-org/models/tinyllamas/stories15M-q4_0.gguf
    """
    every = cached_models(presets, json_output)
    prefix = ref.removeprefix("hf://").rstrip("/")
    chosen = [m for m in every if m.ref == f"hf://{prefix}" or m.ref.startswith(f"hf://{prefix}/")]
    unfinished = [p for p in partial_downloads() if p.repo_id == prefix]
    if not chosen and not unfinished:
        fail("models rm", ExitCode.MISSING_ARTIFACT, f"{ref}: not in the cache", json_output)
    busy = [m for m in chosen if m.loaded]
    if busy and not force:
        fail(
            "models rm",
            ExitCode.INVALID_CONFIGURATION,
            f"{busy[0].model_id} is loaded in the runtime: unload it first, or --force",
            json_output,
        )
    for model in chosen:
        _remove(model, every)
    removed = [p for p in unfinished if p.remove_unless_in_use()]
    _show(
        chosen,
        "cached_model_removed",
        json_output,
        "removed ",
        partials=(removed, "partial_download_removed"),
    )


@models_app.command("prune")
def prune_command(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Only files last used longer ago than this (seconds, or 7d, 12h, 30m).",
        ),
    ] = None,
    presets: PresetsOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Remove the cached models that are not loaded and that no preset names, and the partial
    downloads (not one a pull is writing now). --older-than: only what was last used (a
    partial download: last written) longer ago.

    Example:

        skippyctl models prune --older-than 30d --presets presets.toml --dry-run
    """
    cutoff = None if older_than is None else _cutoff(older_than, json_output)
    every = cached_models(presets, json_output)
    chosen = [
        model
        for model in every
        if not model.loaded and not model.presets and (cutoff is None or model.last_used < cutoff)
    ]
    unfinished = [p for p in partial_downloads() if cutoff is None or p.last_written < cutoff]
    if dry_run:
        _show(
            chosen,
            "cached_model_prunable",
            json_output,
            "would free ",
            partials=(unfinished, "partial_download_prunable"),
        )
        return
    for model in chosen:
        _remove(model, every)
    removed = [p for p in unfinished if p.remove_unless_in_use()]
    _show(
        chosen,
        "cached_model_pruned",
        json_output,
        "freed ",
        partials=(removed, "partial_download_pruned"),
    )


def _cutoff(text: str, json_output: bool) -> float:
    import time

    from skippyctl.config.durations import DurationError, parse_duration_s

    try:
        seconds = parse_duration_s(text)
    except DurationError:
        fail(
            "models prune",
            ExitCode.INVALID_CONFIGURATION,
            "--older-than: seconds, or a duration such as 7d, 12h or 30m",
            json_output,
        )
    if seconds < 0:
        fail(
            "models prune",
            ExitCode.INVALID_CONFIGURATION,
            "--older-than: not negative",
            json_output,
        )
    return time.time() - seconds
