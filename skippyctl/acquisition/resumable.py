"""One hub file into the hub cache, resumable: a download that stops (cancelled, Ctrl-C, the
connection lost) keeps its bytes, and the next pull of the same file asks for
the rest with a ``Range`` request.

``hf_hub_download`` cannot do this: it writes each blob to a process-unique temporary file and
deletes it on any failure (``file_download._download_to_tmp_and_move``). This module writes the
same cache layout the hub library reads (``try_to_load_from_cache``, ``scan_cache_dir``)::

    <cache>/models--ORG--REPO/blobs/<etag>                  the file, once whole
    <cache>/models--ORG--REPO/blobs/<etag>.incomplete       its bytes so far (a stable name)
    <cache>/models--ORG--REPO/snapshots/<commit>/<filename> -> ../../blobs/<etag> (relative)
    <cache>/models--ORG--REPO/refs/<revision>               the commit a branch or tag names

and takes the hub library's own lock of the blob (``<cache>/.locks/models--ORG--REPO/<etag>.lock``)
so a pull here and an ``hf download`` of the same blob never write it at once. The body comes
through the hub library's HTTP client (its headers, token, redirects and errors); a connection
lost mid-body is resumed within the same pull, and a server that ignores the ``Range`` gets the
file from zero. Bytes are written as the network hands them over, so a cancellation lands
within one network read and keeps what arrived. The bytes are checked by the caller:
the blob's name is its sha256 (or git sha1), hashed once the file is whole. A full disk is the
one stop whose partial file is removed (it would keep the disk full).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Final

from skippyctl.acquisition.errors import PreparationError
from skippyctl.acquisition.hub import HubSettings, RemotePart
from skippyctl.acquisition.transfer import Meter, MeterFactory, TransferCancelled
from skippyctl.events.reasons import ReasonCode

PARTIAL_SUFFIX: Final = ".incomplete"
LOCK_POLL_S: Final = 0.25
"""How often a pull that waits for another's lock of the same blob looks for its cancellation."""
RETRIES: Final = 5
"""Lost connections in a row (no byte between them) a download survives, as the hub library's."""
RETRY_PAUSE_S: Final = 1.0
_CACHE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""An ETag or a commit as a file name in the cache (a sha256, a git sha1, a mirror's token)."""
CACHEDIR_TAG: Final = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by skippyctl.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)


def fetch_into_cache(
    settings: HubSettings,
    repo_id: str,
    part: RemotePart,
    meter: MeterFactory,
    cancel_requested: threading.Event,
    *,
    force: bool,
) -> Path:
    """The snapshot path of ``part`` at the commit the hub named, its bytes downloaded (or
    resumed) first unless the blob is already whole. ``force``: the cached blob is stale; it and
    any partial of it are dropped first. Errors are the hub library's (the caller maps them)."""
    from filelock import FileLock, Timeout
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if part.etag is None or part.commit is None:
        raise PreparationError(
            ReasonCode.ARTIFACT_IO_FAILURE,
            f"{part.filename}: the hub named no version of the file (ETag or commit missing)",
        )
    if not _stays_inside(part):
        # What the hub answers becomes paths in the cache: none may lead out of it.
        raise PreparationError(
            ReasonCode.ARTIFACT_IO_FAILURE,
            "the hub answered a file name, ETag or commit that cannot be a cache path",
        )
    root = Path(settings.cache_dir or constants.HF_HUB_CACHE)
    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    storage = root / folder
    blob = storage / "blobs" / part.etag
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    pointer = storage / "snapshots" / part.commit / part.filename
    lock_path = root / ".locks" / folder / f"{part.etag}.lock"
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock_path.parent.mkdir(parents=True, exist_ok=True)

    lock = FileLock(str(lock_path))
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            break
        except Timeout:
            if cancel_requested.is_set():
                raise TransferCancelled from None
    try:
        if force:
            for stale in (blob, partial):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
        if not blob.exists():
            _download(settings, repo_id, part, partial, meter, cancel_requested)
            os.replace(partial, blob)
        _link(blob, pointer)
        _remember_revision(storage, settings.revision, part.commit)
        _tag(root)
    finally:
        lock.release()
    return pointer


def _stays_inside(part: RemotePart) -> bool:
    names = PurePosixPath(part.filename).parts
    return (
        bool(names)
        and not PurePosixPath(part.filename).is_absolute()
        and all(name not in (".", "..") and "\\" not in name and "\0" not in name for name in names)
        and all(_CACHE_NAME.fullmatch(value or "") for value in (part.etag, part.commit))
    )


def _download(
    settings: HubSettings,
    repo_id: str,
    part: RemotePart,
    partial: Path,
    meter: MeterFactory,
    cancel_requested: threading.Event,
) -> None:
    from huggingface_hub import hf_hub_url

    # At the commit the hub resolved: a branch that moves on mid-pull does not mix two files.
    url = hf_hub_url(repo_id, part.filename, revision=part.commit, endpoint=settings.endpoint)
    try:
        with open_partial(partial) as sink:
            _fill(url, settings, part.size, sink, meter, cancel_requested)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            # A full disk is the operator's to fix; holding it full meanwhile helps no one.
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        raise


def open_partial(path: Path) -> BinaryIO:
    """The partial file, for appending (its length is where the download goes on)."""
    return path.open("ab")


def _fill(
    url: str,
    settings: HubSettings,
    size: int | None,
    sink: BinaryIO,
    meter: MeterFactory,
    cancel_requested: threading.Event,
) -> None:
    """Append the rest of the file to ``sink``: a ``Range`` request from its length, a few
    retries after a lost connection (each from what has arrived), a restart from zero when the
    server sends the whole body anyway."""
    import httpx
    from huggingface_hub import constants, get_session, hf_raise_for_status

    # Documented here; the package's lazy __init__ hides the name from mypy.
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    have = sink.tell()
    if size is not None and have > size:  # not this file's bytes
        sink.truncate(0)
        have = 0
    if size is not None and have == size:
        meter(initial=have)  # whole already: its bytes still count as this pull's
        return
    bar: Meter | None = None
    retries = RETRIES
    while True:
        headers = build_hf_headers(token=settings.token)
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with get_session().stream(
                "GET",
                url,
                headers=headers,
                follow_redirects=True,
                timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
            ) as response:
                hf_raise_for_status(response)
                if have and response.status_code != 206:  # the Range was ignored: from zero
                    sink.seek(0)
                    sink.truncate(0)
                    if bar is not None:
                        bar.update(-have)
                    have = 0
                if bar is None:
                    bar = meter(initial=have)
                for chunk in response.iter_bytes():
                    sink.write(chunk)
                    have += len(chunk)
                    bar.update(len(chunk))  # raises TransferCancelled once cancelled
                    retries = RETRIES  # bytes came: the connection is worth retrying
        except (
            httpx.ConnectError,
            httpx.TimeoutException,
            httpx.RemoteProtocolError,
            httpx.ReadError,
        ):
            if retries <= 0:
                raise
            retries -= 1
            sink.flush()
            if cancel_requested.wait(RETRY_PAUSE_S):
                raise TransferCancelled from None
            continue
        if size is not None and have != size:
            raise OSError(errno.EIO, f"the transfer ended at {have} of {size} bytes")
        return


def _link(blob: Path, pointer: Path) -> None:
    """The snapshot's relative link to the blob, replaced atomically when one is there."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, pointer.parent)
    with contextlib.suppress(OSError):
        if os.readlink(pointer) == target:
            return
    staged = pointer.with_name(f".{pointer.name}.{os.getpid()}.link")
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    os.symlink(target, staged)
    os.replace(staged, pointer)


def _remember_revision(storage: Path, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = storage / "refs" / revision
    with contextlib.suppress(OSError):
        if ref.read_text() == commit:
            return
    ref.parent.mkdir(parents=True, exist_ok=True)
    staged = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    staged.write_text(commit)
    os.replace(staged, ref)


def _tag(root: Path) -> None:
    """``CACHEDIR.TAG``, as the hub library leaves it, so backup tools skip the cache."""
    tag = root / "CACHEDIR.TAG"
    if not tag.exists():
        with contextlib.suppress(OSError):
            tag.write_text(CACHEDIR_TAG)
