"""The Hugging Face hub, as an acquisition sees it: resolving a reference to the files of one
artifact, the cache, and the hub library's errors as reason codes (messages name no URL, path or
token). ``huggingface_hub`` is imported only inside the calls that use it."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final, cast

from skippyctl.acquisition.artifacts import first_part, part_names, split_group
from skippyctl.acquisition.errors import PreparationError
from skippyctl.acquisition.references import ModelRef, RefKind
from skippyctl.events.envelope import LogicalId
from skippyctl.events.identity import model_id_for
from skippyctl.events.reasons import ReasonCode

MAX_LISTED_CANDIDATES: Final = 12
DEFAULT_REVISION: Final = "main"


@dataclass(frozen=True, slots=True)
class HubSettings:
    """Where the hub is. None everywhere: what ``huggingface_hub`` reads from the environment."""

    endpoint: str | None = None
    cache_dir: str | None = None
    token: str | bool | None = None
    revision: str = DEFAULT_REVISION


@dataclass(frozen=True, slots=True)
class RemotePart:
    filename: str
    size: int | None
    etag: str | None
    commit: str | None = None
    """The commit the hub resolved the revision to (None: offline, the cache's ref)."""


@dataclass(slots=True)
class Resolved:
    model_id: LogicalId
    local: Path | None = None
    repo_id: str | None = None
    parts: tuple[RemotePart, ...] = ()
    offline: bool = False
    """The hub could not be reached; every part is in the cache."""

    @property
    def total_bytes(self) -> int | None:
        sizes = [p.size for p in self.parts]
        return None if not sizes or None in sizes else sum(cast(list[int], sizes))


class Hub:
    """Queries of one hub (its settings) for one acquisition."""

    def __init__(self, settings: HubSettings) -> None:
        self.settings = settings

    def resolve(self, ref: ModelRef) -> Resolved:
        if ref.kind is RefKind.LOCAL:
            path = Path(ref.text).expanduser()
            if not path.exists():
                raise PreparationError(ReasonCode.MISSING_ARTIFACT, "model file not found")
            return Resolved(model_id_for(ref.text), local=path)
        assert ref.repo_id is not None
        filename = ref.filename if ref.kind is RefKind.HF_FILE else self.pick_quant(ref)
        assert filename is not None
        names = part_names(filename)
        model_id = model_id_for(filename)
        try:
            parts = tuple(self.metadata(ref.repo_id, name) for name in names)
        except Unreachable:
            if all(self.cached(ref.repo_id, name, self.settings.revision) for name in names):
                offline = tuple(RemotePart(name, None, None) for name in names)
                return Resolved(model_id, repo_id=ref.repo_id, parts=offline, offline=True)
            raise PreparationError(
                ReasonCode.ARTIFACT_IO_FAILURE,
                "cannot reach the hub (see HF_ENDPOINT) and the file is not in the cache",
            ) from None
        return Resolved(model_id, repo_id=ref.repo_id, parts=parts)

    def pick_quant(self, ref: ModelRef) -> str:
        from huggingface_hub import HfApi

        assert ref.repo_id is not None
        assert ref.quant is not None
        api = HfApi(endpoint=self.settings.endpoint, token=self.settings.token)
        try:
            files = api.list_repo_files(ref.repo_id, revision=self.settings.revision)
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            files = self.cached_files(ref.repo_id) if is_unreachable(error) else []
            if not files:
                raise hub_error(error, f"cannot list the files of {ref.repo_id}") from None
        ggufs = [
            f
            for f in files
            if f.lower().endswith(".gguf")
            and not PurePosixPath(f).name.lower().startswith("mmproj")
        ]
        tag = ref.quant.lower()
        groups: dict[str, list[str]] = {}
        for name in ggufs:
            if tag in PurePosixPath(name).name.lower():
                groups.setdefault(split_group(name), []).append(name)
        if len(groups) == 1:
            return first_part(next(iter(groups.values())))
        if not groups:
            listed = listing(ggufs)
            raise PreparationError(
                ReasonCode.MISSING_ARTIFACT,
                f"no GGUF file in {ref.repo_id} matches {ref.quant!r}"
                + (f"; its GGUF files: {listed}" if listed else "; it has no GGUF file"),
            )
        candidates = listing([first_part(g) for g in groups.values()])
        raise PreparationError(
            ReasonCode.INVALID_CONFIGURATION,
            f"{ref.quant!r} matches several GGUF files in {ref.repo_id}: {candidates}; "
            "name one with hf://ORG/REPO/FILE.gguf",
        )

    def cached_files(self, repo_id: str) -> list[str]:
        """The files of the cache's snapshot of the revision (offline, for ``ORG/REPO:QUANT``)."""
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        root = Path(self.settings.cache_dir or constants.HF_HUB_CACHE)
        storage = root / repo_folder_name(repo_id=repo_id, repo_type="model")
        try:
            commit = (storage / "refs" / self.settings.revision).read_text().strip()
        except (OSError, ValueError):
            commit = self.settings.revision  # a commit hash has no ref file
        snapshot = storage / "snapshots" / commit
        if not snapshot.is_dir():
            return []
        return sorted(
            p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()
        )

    def metadata(self, repo_id: str, filename: str) -> RemotePart:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(
            repo_id, filename, revision=self.settings.revision, endpoint=self.settings.endpoint
        )
        try:
            meta = get_hf_file_metadata(
                url, token=self.settings.token, endpoint=self.settings.endpoint
            )
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            if is_unreachable(error):
                raise Unreachable from None
            raise hub_error(error, f"{repo_id}: {filename}") from None
        return RemotePart(filename, meta.size, meta.etag, meta.commit_hash)

    def cached(self, repo_id: str, filename: str, revision: str) -> str | None:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            repo_id, filename, cache_dir=self.settings.cache_dir, revision=revision
        )
        return found if isinstance(found, str) else None


def quiet_hub_library() -> None:
    """Silence the hub library's own warnings: they quote URLs, signed CDN ones among them, and
    a pull's events say what happened without them. (Imported first: its import sets its
    logger's level from HF_HUB_VERBOSITY; callers skip this when the operator set that.)"""
    import logging

    import huggingface_hub.utils.logging  # noqa: F401 - sets the level overridden here

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


class Unreachable(Exception):
    """The hub could not be reached (connection refused, DNS, offline mode, timeout)."""


def listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED_CANDIDATES])
    more = len(names) - MAX_LISTED_CANDIDATES
    return shown + (f" (and {more} more)" if more > 0 else "")


def is_unreachable(error: Exception) -> bool:
    import httpx
    from huggingface_hub.errors import OfflineModeIsEnabled

    return isinstance(error, httpx.ConnectError | httpx.TimeoutException | OfflineModeIsEnabled)


def hub_error(error: Exception, what: str) -> PreparationError:
    """The reason code (and a message without URL or token) of a hub or transfer error."""
    import httpx
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        return PreparationError(
            ReasonCode.MISSING_ARTIFACT,
            f"{what}: the repo is gated; accept its terms and log in (HF_TOKEN)",
        )
    if isinstance(error, RepositoryNotFoundError):
        return PreparationError(
            ReasonCode.MISSING_ARTIFACT,
            f"{what}: repository not found (or private without a token)",
        )
    if isinstance(error, RevisionNotFoundError):
        return PreparationError(ReasonCode.MISSING_ARTIFACT, f"{what}: revision not found")
    if isinstance(error, EntryNotFoundError):
        return PreparationError(ReasonCode.MISSING_ARTIFACT, f"{what}: file not found")
    if isinstance(error, httpx.TimeoutException):
        return PreparationError(ReasonCode.TIMEOUT, f"{what}: the hub stopped answering")
    if isinstance(error, OfflineModeIsEnabled):
        return PreparationError(
            ReasonCode.ARTIFACT_IO_FAILURE, f"{what}: HF_HUB_OFFLINE is set and it is not cached"
        )
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "?"
        return PreparationError(ReasonCode.ARTIFACT_IO_FAILURE, f"{what}: HTTP {status}")
    if isinstance(error, httpx.HTTPError):
        return PreparationError(
            ReasonCode.ARTIFACT_IO_FAILURE, f"{what}: {type(error).__name__} (network)"
        )
    if isinstance(error, OSError):
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return PreparationError(
                ReasonCode.ARTIFACT_IO_FAILURE, f"{what}: no space left in the hub cache"
            )
        detail = error.strerror or "size or transfer check failed"
        return PreparationError(ReasonCode.ARTIFACT_IO_FAILURE, f"{what}: {detail}")
    return PreparationError(ReasonCode.INTERNAL_RUNTIME_FAILURE, f"{what}: {type(error).__name__}")
