"""Model acquisition: a model reference becomes a checked local GGUF, told as events.

Reference forms (:func:`parse_ref`):

- a local path: a GGUF file, or the first part of a split set;
- ``hf://ORG/REPO/PATH.gguf``: one file of a Hugging Face model repo (the first part of a split
  set brings every part);
- ``ORG/REPO:QUANT``: the repo's one GGUF artifact whose file name contains QUANT
  (case-insensitive, e.g. ``Q4_K_M``); the parts of one split set count as one artifact. None or
  several: the resolution fails and the message lists the candidates.

Hugging Face files are found through ``huggingface_hub`` and live in its cache (``HF_HUB_CACHE``, or
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
- Nothing half-written is taken as valid, and nothing downloaded is lost: a blob's bytes go to
  ``blobs/<etag>.incomplete``, renamed into ``blobs/`` only once the whole body arrived; a
  download that stops (cancelled, Ctrl-C, the connection or the disk gave out) keeps that file
  and the next pull of the same file resumes it with a ``Range`` request
  (``acquisition/resumable.py``). A blob is named by its hash (the LFS sha256, or the git blob
  sha1 of a small file); preparation hashes every newly downloaded blob and, on a mismatch,
  removes the blob and its snapshot link before reporting the failure.
- This module is core (no CLI, UI or web framework): events go to the ``emit`` callable it is
  given (the CLI's output codec today; ``Pipeline.submit`` in a host tomorrow).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.acquisition.artifacts import check_artifact
from skippyctl.acquisition.errors import PreparationCancelled, PreparationError
from skippyctl.acquisition.hub import Hub, HubSettings, RemotePart, Resolved, hub_error
from skippyctl.acquisition.references import ModelRef, RefError, RefKind, parse_ref
from skippyctl.acquisition.resumable import fetch_into_cache
from skippyctl.acquisition.transfer import MeterFactory, Transfer, TransferCancelled
from skippyctl.events.catalog import EventId, spec_of
from skippyctl.events.envelope import Event, LogicalId, Progress, Scope, make_event, summaries
from skippyctl.events.identity import OperationIds, model_id_for
from skippyctl.events.reasons import DeliveryClass, Outcome, ProgressUnit, ReasonCode

HASH_CHUNK_BYTES: Final = 8 * 1024 * 1024
_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1: Final = re.compile(r"^[0-9a-f]{40}$")


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


def _hash_kind(blob_name: str) -> str | None:
    if _SHA256.match(blob_name):
        return "sha256"
    if _GIT_SHA1.match(blob_name):
        return "git-sha1"
    return None


class Acquisition:
    """Prepares one model reference at a time; events go to `emit` as they happen.

    `cancel()` (any thread) stops a download at its next chunk and a verification at its next
    block; a KeyboardInterrupt in the preparing thread (Ctrl-C) does the same at once.
    """

    def __init__(
        self,
        emit: Callable[[Event], object],
        hub: HubSettings | None = None,
        *,
        ids: OperationIds | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self.hub = hub or HubSettings()
        self._hub = Hub(self.hub)
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
    def prepare(self, text: str, operation_id: LogicalId | None = None) -> Prepared:
        """Resolve, download when needed, and check `text`; raises PreparationError (or
        PreparationCancelled) after the pull's terminal event was emitted. `operation_id`: the
        pull's id when the caller made it (a runtime answers with it before the pull runs)."""
        pull = operation_id if operation_id is not None else self._ids.next("pull")[0]
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
        except (KeyboardInterrupt, TransferCancelled):
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
            resolved = self._hub.resolve(ref)
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
            cancelled = isinstance(error, KeyboardInterrupt | TransferCancelled)
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

    # -- download and verification ---------------------------------------------------------------
    def _acquire(self, pull: LogicalId, resolved: Resolved, started: float) -> Prepared:
        assert resolved.repo_id is not None
        model_id = resolved.model_id
        paths: list[Path] = []
        missing: list[tuple[int, RemotePart, bool]] = []
        for index, part in enumerate(resolved.parts):
            # At the commit the hub names now: a branch that moved on is not served stale.
            cached = self._hub.cached(
                resolved.repo_id, part.filename, part.commit or self.hub.revision
            )
            stale = cached is not None and part.size is not None and _size(cached) != part.size
            paths.append(Path(cached) if cached is not None else Path())
            if cached is None or stale:
                missing.append((index, part, stale))
        transfer: Transfer | None = None
        verified: list[str] = []
        if missing:
            download = LogicalId(f"{pull}.download")
            transfer = Transfer(self, download, pull, model_id, resolved.total_bytes)
            downloaded: list[Path] = []
            try:
                for index, part, stale in missing:
                    path = self._download(resolved.repo_id, part, transfer, force=stale)
                    paths[index] = path
                    downloaded.append(path)
                    transfer.finish_part(part.size if part.size is not None else _size(path))
            except (KeyboardInterrupt, TransferCancelled):
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
        self, transfer: Transfer, event_id: EventId, reason: ReasonCode | None = None
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

    def _download(self, repo_id: str, part: RemotePart, transfer: Transfer, *, force: bool) -> Path:
        try:
            return fetch_into_cache(
                self.hub, repo_id, part, MeterFactory(transfer), self.cancel_requested, force=force
            )
        except (KeyboardInterrupt, TransferCancelled, PreparationError):
            raise
        except Exception as error:  # noqa: BLE001 - mapped to a reason code
            raise hub_error(error, f"downloading {part.filename} failed") from None

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
                        raise TransferCancelled
                    digest.update(block)
        except (KeyboardInterrupt, TransferCancelled):
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


def _remove(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _size(path: str | Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1
