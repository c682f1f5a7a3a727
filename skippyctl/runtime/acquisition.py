"""Model acquisition: a model reference becomes a checked local GGUF, told as events.

Reference forms (:func:`parse_ref`):

- a local path: a GGUF file, or the first part of a split set;
- ``hf://ORG/REPO/PATH.gguf``: one file of a Hugging Face model repo (the first part of a split
  set brings every part);
- ``ORG/REPO:QUANT``: the repo's one GGUF artifact whose file name contains QUANT
  (case-insensitive, e.g. ``Q4_K_M``); the parts of one split set count as one artifact. None or
  several: the resolution fails and the message lists the candidates.

Hugging Face files come through ``huggingface_hub`` and live in its cache (``HF_HUB_CACHE``, or
``HF_HOME``/hub); ``HF_ENDPOINT`` picks the hub and the token comes from where the hub library
looks (``HF_TOKEN``, the saved login). No token, URL or path ever enters an event.

Events: one operation ``pull-N`` with two child operations, ``pull-N.resolve`` and
``pull-N.download`` (their ``parent_operation_id`` is ``pull-N``; the id says it too, for the
NDJSON record, which carries no parent)::

    pull-N      model_queued → model_preparation_started → model_preparation_completed
                  | model_preparation_cache_reused | model_preparation_failed
                  | model_preparation_cancelled
    .resolve    model_resolution_started → model_resolution_completed | model_resolution_failed
    .download   model_download_started → model_download_progress* → model_download_completed
                  | model_download_failed | model_download_cancelled

``pull-N.download`` exists only when bytes are transferred. A failure or cancellation of a child
ends ``pull-N`` too (``model_preparation_failed``/``_cancelled`` with the same reason, without
a ``model_preparation_started``), so the last event of a pull is always its one terminal.

Invariants:

- ``pull-N`` ends in exactly one terminal whatever raises on the way, and every child that
  started ends in exactly one of its own.
- Download progress is coalesced: at most one ``model_download_progress`` per
  ``PROGRESS_MIN_INTERVAL_S`` *and* ``PROGRESS_MIN_STEP`` of the total, and always the last
  value before ``model_download_completed``; never one per chunk.
- Nothing half-written is taken as valid: ``huggingface_hub`` writes each blob to a
  process-unique ``*.incomplete`` file, renamed into ``blobs/`` only once the whole body
  arrived (``file_download._download_to_tmp_and_move``) and deleted on any failure, a Ctrl-C
  included. A blob is named by its hash (the LFS sha256, or the git blob sha1 of a small
  file); preparation hashes every newly downloaded blob and, on a mismatch, removes the blob and
  its snapshot link before reporting the failure.
- This module is core (no CLI, UI or web framework): events go to the ``emit`` callable it is
  given (the CLI's output codec today; ``Pipeline.submit`` in a host tomorrow).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, cast

from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import (
    Event,
    LogicalId,
    Progress,
    Scope,
    make_event,
    summaries,
)
from skippyctl.events.identity import OperationIds, model_id_for
from skippyctl.events.reasons import DeliveryClass, Outcome, ProgressUnit, ReasonCode
from skippyctl.runtime.artifacts import check_artifact, split_parts

if TYPE_CHECKING:
    from types import TracebackType

PROGRESS_MIN_INTERVAL_S: Final = 0.25
PROGRESS_MIN_STEP: Final = 0.01
"""A fraction of the total: progress moves at least 1 % between two events."""
HASH_CHUNK_BYTES: Final = 8 * 1024 * 1024
MAX_LISTED_CANDIDATES: Final = 12
DEFAULT_REVISION: Final = "main"

_REPO = r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*"
_HF_URI: Final = re.compile(rf"^hf://(?P<repo>{_REPO})/(?P<file>[^\s\\]+)$")
_QUANT_REF: Final = re.compile(rf"^(?P<repo>{_REPO}):(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]*)$")
_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1: Final = re.compile(r"^[0-9a-f]{40}$")


class RefKind(StrEnum):
    LOCAL = "local"
    HF_FILE = "hf_file"
    HF_QUANT = "hf_quant"


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed model reference."""

    kind: RefKind
    text: str
    repo_id: str | None = None
    filename: str | None = None
    """The file in the repo (``HF_FILE``)."""
    quant: str | None = None
    """The quant tag (``HF_QUANT``)."""

    @property
    def remote(self) -> bool:
        return self.kind is not RefKind.LOCAL


class PreparationError(Exception):
    """The pull ended without a usable artifact; its terminal event was emitted already."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        """For people (stderr): names the problem, never a path, URL or token."""


class PreparationCancelled(PreparationError):
    """The pull was cancelled (Ctrl-C or `cancel`); its terminal event was emitted already."""

    def __init__(self, message: str = "cancelled") -> None:
        super().__init__(ReasonCode.CANCELLATION, message)


class RefError(ValueError):
    """A reference that cannot be parsed (``invalid_configuration``)."""


def parse_ref(text: str) -> ModelRef:
    """The reference `text` names: ``hf://`` first, then an existing local path, then
    ``ORG/REPO:QUANT``; anything else is a local path (whose absence preparation reports)."""
    if "\x00" in text:
        raise RefError("the model reference must not contain NUL characters")
    if text.startswith("hf://"):
        match = _HF_URI.match(text)
        if match is None:
            raise RefError("an hf:// reference is hf://ORG/REPO/FILE.gguf")
        filename = match["file"]
        parts = PurePosixPath(filename).parts
        if not filename.lower().endswith(".gguf") or any(p in ("", ".", "..") for p in parts):
            raise RefError("an hf:// reference must name a .gguf file inside the repo")
        return ModelRef(RefKind.HF_FILE, text, match["repo"], filename=filename)
    if Path(text).expanduser().exists():
        return ModelRef(RefKind.LOCAL, text)
    match = _QUANT_REF.match(text)
    if match is not None:
        return ModelRef(RefKind.HF_QUANT, text, match["repo"], quant=match["quant"])
    return ModelRef(RefKind.LOCAL, text)


def is_remote_ref(text: str) -> bool:
    """Whether `text` names a Hugging Face file (so it must be pulled before a load)."""
    try:
        return parse_ref(text).remote
    except RefError:
        return text.startswith("hf://")


@dataclass(frozen=True, slots=True)
class HubSettings:
    """Where the hub is. None everywhere: what ``huggingface_hub`` reads from the environment."""

    endpoint: str | None = None
    cache_dir: str | None = None
    token: str | bool | None = None
    revision: str = DEFAULT_REVISION


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked artifact: `path` is the file to load (a split set's first part)."""

    path: Path
    model_id: LogicalId
    operation_id: LogicalId
    reused: bool
    downloaded_bytes: int = 0
    total_bytes: int | None = None
    verified: tuple[str, ...] = ()
    """How each newly downloaded part was verified (``sha256``, ``git-sha1``), in part order."""


@dataclass(frozen=True, slots=True)
class _RemotePart:
    filename: str
    size: int | None
    etag: str | None
    commit: str | None = None
    """The commit the hub resolved the revision to (None: offline, the cache's ref)."""


@dataclass(slots=True)
class _Resolved:
    model_id: LogicalId
    local: Path | None = None
    repo_id: str | None = None
    parts: tuple[_RemotePart, ...] = ()
    offline: bool = False
    """The hub could not be reached; every part is in the cache."""

    @property
    def total_bytes(self) -> int | None:
        sizes = [p.size for p in self.parts]
        return None if not sizes or None in sizes else sum(cast(list[int], sizes))


class _Cancelled(Exception):
    """Raised inside the hub's download loop (from the progress meter) to stop it."""


@dataclass(slots=True)
class ProgressThrottle:
    """Decides which byte counts become `model_download_progress` events."""

    total: int | None
    clock: Callable[[], float] = time.monotonic
    min_interval_s: float = PROGRESS_MIN_INTERVAL_S
    min_step: float = PROGRESS_MIN_STEP
    last_value: int = -1
    last_at: float | None = None

    def offer(self, current: int) -> bool:
        """Whether `current` should be told now (it is recorded as told when so)."""
        now = self.clock()
        if current <= self.last_value:
            return False
        if self.last_at is not None:
            if now - self.last_at < self.min_interval_s:
                return False
            if self.total and current - self.last_value < self.min_step * self.total:
                return False
        self.last_value, self.last_at = current, now
        return True

    def final(self, current: int) -> bool:
        """The last value is always told (once)."""
        if current <= self.last_value:
            return False
        self.last_value, self.last_at = current, self.clock()
        return True


@dataclass(slots=True)
class _Transfer:
    """Byte accounting of one download operation across its parts (called from the hub's loop)."""

    acquisition: Acquisition
    operation_id: LogicalId
    parent: LogicalId
    model_id: LogicalId
    total: int | None
    base: int = 0
    """Bytes of the parts finished before the current one."""
    current_part: int = 0
    started_at: float | None = None
    throttle: ProgressThrottle = field(init=False)

    def __post_init__(self) -> None:
        self.throttle = ProgressThrottle(self.total, self.acquisition.clock)

    @property
    def current(self) -> int:
        return self.base + self.current_part

    def begin(self) -> None:
        if self.started_at is not None:
            return
        self.started_at = self.acquisition.clock()
        self.throttle.offer(0)
        self.acquisition.emit_event(
            EventId.MODEL_DOWNLOAD_STARTED,
            self.operation_id,
            self.model_id,
            parent=self.parent,
            progress=Progress(0, self.total, ProgressUnit.BYTES),
            summaries=summaries(model_size_bytes=self.total),
        )

    def add(self, delta: int) -> None:
        self.current_part = max(0, self.current_part + delta)
        if self.acquisition.cancel_requested.is_set():
            raise _Cancelled
        if self.throttle.offer(self.current):
            self._progress()

    def finish_part(self, size: int) -> None:
        self.base += size
        self.current_part = 0

    def finish(self) -> None:
        if self.throttle.final(self.current):
            self._progress()

    def _progress(self) -> None:
        self.acquisition.emit_event(
            EventId.MODEL_DOWNLOAD_PROGRESS,
            self.operation_id,
            self.model_id,
            parent=self.parent,
            progress=Progress(self.current, self.total, ProgressUnit.BYTES),
        )


class _Meter:
    """What ``huggingface_hub`` takes for a tqdm bar. It counts ``update(n)``: the bytes
    written to the file (per HTTP chunk; per flushed block of a Xet download), negative when a
    server ignored a Range and the body restarts. ``update_transfer`` (network bytes, which
    dedup and compression make differ from the file's) and the display calls are accepted and
    ignored."""

    def __init__(self, transfer: _Transfer, initial: int = 0) -> None:
        self._transfer = transfer
        transfer.begin()
        if initial:
            transfer.add(initial)

    def __enter__(self) -> _Meter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self._transfer.add(int(n or 0))

    def update_transfer(self, n: float | None = 1) -> None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def refresh(self) -> None:
        return None

    def close(self) -> None:
        return None


class _MeterFactory:
    """The ``tqdm_class`` given to the hub: called with a bar's keyword arguments.

    It has ``update_transfer``, which makes a Xet download use one aggregated bar (file bytes
    by ``update``, network bytes by ``update_transfer``) instead of two bars whose ``update``
    calls would each count the file (``utils/_xet_progress_reporting.py``)."""

    def __init__(self, transfer: _Transfer) -> None:
        self._transfer = transfer

    def __call__(self, **kwargs: Any) -> _Meter:
        initial = kwargs.get("initial")
        return _Meter(self._transfer, initial if isinstance(initial, int) else 0)

    def update_transfer(self, n: float | None = 1) -> None:
        return None


def _hash_kind(blob_name: str) -> str | None:
    if _SHA256.match(blob_name):
        return "sha256"
    if _GIT_SHA1.match(blob_name):
        return "git-sha1"
    return None


def _split_group(name: str) -> str:
    """The artifact a file belongs to: a split set's parts share one key (its first part)."""
    parts = _part_names(name)
    return parts[0]


def _first_part(names: Sequence[str]) -> str:
    return sorted(names)[0]


def _part_names(filename: str) -> list[str]:
    parts = split_parts(Path(filename))
    if parts is None:
        return [filename]
    parent = PurePosixPath(filename).parent
    return [str(parent / p.name) if str(parent) != "." else p.name for p in parts]


class Acquisition:
    """Prepares one model reference at a time; events go to `emit` as they happen.

    `cancel()` (any thread) stops a download at its next chunk and a verification at its next
    block; a KeyboardInterrupt in the preparing thread (Ctrl-C) does the same at once.
    """

    def __init__(
        self,
        emit: Callable[[Event], None],
        hub: HubSettings | None = None,
        *,
        ids: OperationIds | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self.hub = hub or HubSettings()
        self._ids = ids or OperationIds()
        self.clock = clock
        self.cancel_requested = threading.Event()
        self._settled: set[LogicalId] = set()

    def cancel(self) -> None:
        self.cancel_requested.set()

    def emit_event(
        self,
        event_id: EventId,
        operation_id: LogicalId,
        model_id: LogicalId | None,
        *,
        parent: LogicalId | None = None,
        **fields: Any,
    ) -> None:
        if spec_of(event_id).delivery is DeliveryClass.TERMINAL:
            # Exactly one terminal per operation, even when Ctrl-C lands between a terminal
            # and the return that follows it (the handler would otherwise settle it again).
            if operation_id in self._settled:
                return
            self._settled.add(operation_id)
        self._emit(
            make_event(
                event_id,
                operation_id=operation_id,
                parent_operation_id=parent,
                scope=Scope(model_id=model_id),
                **fields,
            )
        )

    def _ms_since(self, start: float) -> float:
        return round((self.clock() - start) * 1000.0, 3)

    # -- the operation ---------------------------------------------------------------------------
    def prepare(self, text: str) -> Prepared:
        """Resolve, download when needed, and check `text`; raises PreparationError (or
        PreparationCancelled) after the pull's terminal event was emitted."""
        pull, _ = self._ids.next("pull")
        started = self.clock()
        try:
            ref: ModelRef | None = parse_ref(text)
        except RefError:
            ref = None
        early_id = self._early_model_id(ref)
        state: dict[str, LogicalId | None] = {"model": early_id}
        try:
            self.emit_event(EventId.MODEL_QUEUED, pull, early_id)
            return self._prepare(pull, text, ref, started, state)
        except PreparationError:
            raise
        except (KeyboardInterrupt, _Cancelled):
            self._end(pull, state["model"], EventId.MODEL_PREPARATION_CANCELLED, started)
            raise PreparationCancelled() from None
        except Exception as error:
            self._end(
                pull,
                state["model"],
                EventId.MODEL_PREPARATION_FAILED,
                started,
                ReasonCode.INTERNAL_RUNTIME_FAILURE,
            )
            raise PreparationError(
                ReasonCode.INTERNAL_RUNTIME_FAILURE,
                f"preparation failed unexpectedly ({type(error).__name__})",
            ) from error

    def _early_model_id(self, ref: ModelRef | None) -> LogicalId | None:
        if ref is None or ref.kind is RefKind.HF_QUANT:
            return None  # unknown until the repo's files are listed
        return model_id_for(ref.filename or ref.text)

    def _end(
        self,
        pull: LogicalId,
        model_id: LogicalId | None,
        event_id: EventId,
        started: float,
        reason: ReasonCode | None = None,
        **extra: Any,
    ) -> None:
        outcome = {
            EventId.MODEL_PREPARATION_FAILED: Outcome.FAILURE,
            EventId.MODEL_PREPARATION_CANCELLED: Outcome.CANCELLED,
        }.get(event_id, Outcome.SUCCESS)
        if event_id is EventId.MODEL_PREPARATION_CANCELLED:
            reason = ReasonCode.CANCELLATION
        self.emit_event(
            event_id,
            pull,
            model_id,
            outcome=outcome,
            reason_code=reason,
            duration_ms=self._ms_since(started),
            **extra,
        )

    def _fail(
        self,
        pull: LogicalId,
        model_id: LogicalId | None,
        started: float,
        reason: ReasonCode,
        message: str,
    ) -> PreparationError:
        self._end(pull, model_id, EventId.MODEL_PREPARATION_FAILED, started, reason)
        return PreparationError(reason, message)

    def _prepare(
        self,
        pull: LogicalId,
        text: str,
        ref: ModelRef | None,
        started: float,
        state: dict[str, LogicalId | None],
    ) -> Prepared:
        resolve = LogicalId(f"{pull}.resolve")
        resolve_started = self.clock()
        self.emit_event(EventId.MODEL_RESOLUTION_STARTED, resolve, state["model"], parent=pull)
        try:
            if ref is None:
                parse_ref(text)  # raises the RefError with its message
                raise RefError("the model reference cannot be parsed")
            resolved = self._resolve(ref)
        except (RefError, PreparationError) as error:
            reason = (
                error.reason
                if isinstance(error, PreparationError)
                else ReasonCode.INVALID_CONFIGURATION
            )
            self.emit_event(
                EventId.MODEL_RESOLUTION_FAILED,
                resolve,
                state["model"],
                parent=pull,
                outcome=Outcome.FAILURE,
                reason_code=reason,
                duration_ms=self._ms_since(resolve_started),
            )
            raise self._fail(pull, state["model"], started, reason, str(error)) from None
        except BaseException as error:
            # Ctrl-C (or anything unforeseen) during a hub request: the child ends too, then
            # prepare() ends the pull. The family has no resolution_cancelled: failed, with
            # outcome and reason saying cancelled.
            cancelled = isinstance(error, KeyboardInterrupt | _Cancelled)
            self.emit_event(
                EventId.MODEL_RESOLUTION_FAILED,
                resolve,
                state["model"],
                parent=pull,
                outcome=Outcome.CANCELLED if cancelled else Outcome.FAILURE,
                reason_code=ReasonCode.CANCELLATION
                if cancelled
                else ReasonCode.INTERNAL_RUNTIME_FAILURE,
                duration_ms=self._ms_since(resolve_started),
            )
            raise
        state["model"] = resolved.model_id
        self.emit_event(
            EventId.MODEL_RESOLUTION_COMPLETED,
            resolve,
            resolved.model_id,
            parent=pull,
            outcome=Outcome.SUCCESS,
            duration_ms=self._ms_since(resolve_started),
            summaries=summaries(
                model_size_bytes=resolved.total_bytes,
                count=len(resolved.parts) if len(resolved.parts) > 1 else None,
            ),
        )
        if resolved.local is not None:
            self.emit_event(EventId.MODEL_PREPARATION_STARTED, pull, resolved.model_id)
            self._check(pull, resolved.model_id, resolved.local, started)
            self._end(pull, resolved.model_id, EventId.MODEL_PREPARATION_COMPLETED, started)
            return Prepared(resolved.local, resolved.model_id, pull, reused=False)
        return self._acquire(pull, resolved, started)

    # -- resolution ------------------------------------------------------------------------------
    def _resolve(self, ref: ModelRef) -> _Resolved:
        if ref.kind is RefKind.LOCAL:
            path = Path(ref.text).expanduser()
            if not path.exists():
                raise PreparationError(ReasonCode.MISSING_ARTIFACT, "model file not found")
            return _Resolved(model_id_for(ref.text), local=path)
        assert ref.repo_id is not None
        filename = ref.filename if ref.kind is RefKind.HF_FILE else self._pick_quant(ref)
        assert filename is not None
        names = _part_names(filename)
        model_id = model_id_for(filename)
        try:
            parts = tuple(self._metadata(ref.repo_id, name) for name in names)
        except _Unreachable:
            if all(self._cached(ref.repo_id, name, self.hub.revision) for name in names):
                offline = tuple(_RemotePart(name, None, None) for name in names)
                return _Resolved(model_id, repo_id=ref.repo_id, parts=offline, offline=True)
            raise PreparationError(
                ReasonCode.ARTIFACT_IO_FAILURE,
                "cannot reach the hub (see HF_ENDPOINT) and the file is not in the cache",
            ) from None
        return _Resolved(model_id, repo_id=ref.repo_id, parts=parts)

    def _pick_quant(self, ref: ModelRef) -> str:
        from huggingface_hub import HfApi

        assert ref.repo_id is not None
        assert ref.quant is not None
        api = HfApi(endpoint=self.hub.endpoint, token=self.hub.token)
        try:
            files = api.list_repo_files(ref.repo_id, revision=self.hub.revision)
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            files = self._cached_files(ref.repo_id) if _is_unreachable(error) else []
            if not files:
                raise _hub_error(error, f"cannot list the files of {ref.repo_id}") from None
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
                groups.setdefault(_split_group(name), []).append(name)
        if len(groups) == 1:
            return _first_part(next(iter(groups.values())))
        if not groups:
            listed = _listing(ggufs)
            raise PreparationError(
                ReasonCode.MISSING_ARTIFACT,
                f"no GGUF file in {ref.repo_id} matches {ref.quant!r}"
                + (f"; its GGUF files: {listed}" if listed else "; it has no GGUF file"),
            )
        candidates = _listing([_first_part(g) for g in groups.values()])
        raise PreparationError(
            ReasonCode.INVALID_CONFIGURATION,
            f"{ref.quant!r} matches several GGUF files in {ref.repo_id}: {candidates}; "
            "name one with hf://ORG/REPO/FILE.gguf",
        )

    def _cached_files(self, repo_id: str) -> list[str]:
        """The files of the cache's snapshot of the revision (offline, for ``ORG/REPO:QUANT``)."""
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        root = Path(self.hub.cache_dir or constants.HF_HUB_CACHE)
        storage = root / repo_folder_name(repo_id=repo_id, repo_type="model")
        try:
            commit = (storage / "refs" / self.hub.revision).read_text().strip()
        except (OSError, ValueError):
            commit = self.hub.revision  # a commit hash has no ref file
        snapshot = storage / "snapshots" / commit
        if not snapshot.is_dir():
            return []
        return sorted(
            p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()
        )

    def _metadata(self, repo_id: str, filename: str) -> _RemotePart:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(repo_id, filename, revision=self.hub.revision, endpoint=self.hub.endpoint)
        try:
            meta = get_hf_file_metadata(url, token=self.hub.token, endpoint=self.hub.endpoint)
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            if _is_unreachable(error):
                raise _Unreachable from None
            raise _hub_error(error, f"{repo_id}: {filename}") from None
        return _RemotePart(filename, meta.size, meta.etag, meta.commit_hash)

    def _cached(self, repo_id: str, filename: str, revision: str) -> str | None:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            repo_id, filename, cache_dir=self.hub.cache_dir, revision=revision
        )
        return found if isinstance(found, str) else None

    # -- download and verification ---------------------------------------------------------------
    def _acquire(self, pull: LogicalId, resolved: _Resolved, started: float) -> Prepared:
        assert resolved.repo_id is not None
        model_id = resolved.model_id
        paths: list[Path] = []
        missing: list[tuple[int, _RemotePart, bool]] = []
        for index, part in enumerate(resolved.parts):
            # At the commit the hub names now: a branch that moved on is not served stale.
            cached = self._cached(resolved.repo_id, part.filename, part.commit or self.hub.revision)
            stale = cached is not None and part.size is not None and _size(cached) != part.size
            paths.append(Path(cached) if cached is not None else Path())
            if cached is None or stale:
                missing.append((index, part, stale))
        transfer: _Transfer | None = None
        verified: list[str] = []
        if missing:
            download = LogicalId(f"{pull}.download")
            transfer = _Transfer(self, download, pull, model_id, resolved.total_bytes)
            downloaded: list[Path] = []
            try:
                for index, part, stale in missing:
                    path = self._download(resolved.repo_id, part, transfer, force=stale)
                    paths[index] = path
                    downloaded.append(path)
                    transfer.finish_part(part.size if part.size is not None else _size(path))
            except (KeyboardInterrupt, _Cancelled):
                if transfer.started_at is not None:
                    self._end_download(transfer, EventId.MODEL_DOWNLOAD_CANCELLED)
                self._end(pull, model_id, EventId.MODEL_PREPARATION_CANCELLED, started)
                raise PreparationCancelled() from None
            except PreparationError as error:
                if transfer.started_at is not None:
                    self._end_download(transfer, EventId.MODEL_DOWNLOAD_FAILED, error.reason)
                raise self._fail(pull, model_id, started, error.reason, error.message) from None
            if transfer.started_at is not None:
                transfer.finish()
                self._end_download(transfer, EventId.MODEL_DOWNLOAD_COMPLETED)
            self.emit_event(EventId.MODEL_PREPARATION_STARTED, pull, model_id)
            for path in downloaded:
                verified.append(self._verify(pull, model_id, path, started))
        else:
            self.emit_event(EventId.MODEL_PREPARATION_STARTED, pull, model_id)
        first = paths[0]
        self._check(pull, model_id, first, started)
        downloaded_bytes = 0 if transfer is None else transfer.current
        reused = transfer is None or transfer.started_at is None
        self._end(
            pull,
            model_id,
            EventId.MODEL_PREPARATION_CACHE_REUSED
            if reused
            else EventId.MODEL_PREPARATION_COMPLETED,
            started,
            summaries=summaries(model_size_bytes=resolved.total_bytes),
        )
        return Prepared(
            first,
            model_id,
            pull,
            reused=reused,
            downloaded_bytes=downloaded_bytes,
            total_bytes=resolved.total_bytes,
            verified=tuple(verified),
        )

    def _end_download(
        self, transfer: _Transfer, event_id: EventId, reason: ReasonCode | None = None
    ) -> None:
        outcome = {
            EventId.MODEL_DOWNLOAD_COMPLETED: Outcome.SUCCESS,
            EventId.MODEL_DOWNLOAD_CANCELLED: Outcome.CANCELLED,
        }.get(event_id, Outcome.FAILURE)
        if event_id is EventId.MODEL_DOWNLOAD_CANCELLED:
            reason = ReasonCode.CANCELLATION
        assert transfer.started_at is not None
        self.emit_event(
            event_id,
            transfer.operation_id,
            transfer.model_id,
            parent=transfer.parent,
            outcome=outcome,
            reason_code=reason,
            duration_ms=self._ms_since(transfer.started_at),
            progress=Progress(transfer.current, transfer.total, ProgressUnit.BYTES),
        )

    def _download(
        self, repo_id: str, part: _RemotePart, transfer: _Transfer, *, force: bool
    ) -> Path:
        from huggingface_hub import hf_hub_download

        try:
            found = hf_hub_download(
                repo_id,
                part.filename,
                revision=self.hub.revision,
                cache_dir=self.hub.cache_dir,
                endpoint=self.hub.endpoint,
                token=self.hub.token,
                force_download=force,
                # Not a tqdm subclass: the hub calls it with a bar's keyword arguments
                # (tqdm._create_progress_bar); its signature names a class, any callable works.
                tqdm_class=cast(Any, _MeterFactory(transfer)),
            )
        except (KeyboardInterrupt, _Cancelled):
            raise
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            raise _hub_error(error, f"downloading {part.filename} failed") from None
        return Path(str(found))

    def _verify(self, pull: LogicalId, model_id: LogicalId, path: Path, started: float) -> str:
        """Hash a downloaded blob against its name; on a mismatch remove it (and the snapshot
        link to it) so no later pull or load takes it as valid."""
        blob = Path(os.path.realpath(path))
        kind = _hash_kind(blob.name)
        if kind is None:
            return "none"
        digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1()  # git's blob id
        try:
            with blob.open("rb") as handle:
                if kind == "git-sha1":
                    digest.update(f"blob {os.fstat(handle.fileno()).st_size}\0".encode())
                while block := handle.read(HASH_CHUNK_BYTES):
                    if self.cancel_requested.is_set():
                        raise _Cancelled
                    digest.update(block)
        except (KeyboardInterrupt, _Cancelled):
            _remove(path, blob)  # complete but unverified: the next pull downloads it again
            raise
        except OSError as error:
            raise self._fail(
                pull,
                model_id,
                started,
                ReasonCode.ARTIFACT_IO_FAILURE,
                f"cannot read the downloaded file ({error.strerror})",
            ) from None
        if digest.hexdigest() == blob.name:
            return kind
        _remove(path, blob)
        raise self._fail(
            pull,
            model_id,
            started,
            ReasonCode.ARTIFACT_IO_FAILURE,
            f"the downloaded file does not match its {kind} checksum; it was removed",
        )

    def _check(self, pull: LogicalId, model_id: LogicalId, path: Path, started: float) -> None:
        problem = check_artifact(path)
        if problem is not None:
            raise self._fail(pull, model_id, started, problem.reason, problem.message)


class _Unreachable(Exception):
    """The hub could not be reached (connection refused, DNS, offline mode, timeout)."""


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _size(path: str | Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED_CANDIDATES])
    more = len(names) - MAX_LISTED_CANDIDATES
    return shown + (f" (and {more} more)" if more > 0 else "")


def _is_unreachable(error: Exception) -> bool:
    import httpx
    from huggingface_hub.errors import OfflineModeIsEnabled

    return isinstance(error, httpx.ConnectError | httpx.TimeoutException | OfflineModeIsEnabled)


def _hub_error(error: Exception, what: str) -> PreparationError:
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
