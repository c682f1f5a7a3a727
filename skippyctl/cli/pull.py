"""`skippyctl pull REF`: fetch a model into the local cache and check it, told as events.

The pull runs in the runtime (`POST /api/runtime/models/pull`, runtime/pulls.py), started
first when none runs, as `load` starts one: its events are the runtime's, so `events --follow`,
the dashboard and telemetry see the download, and this command follows them on the live stream
(records with the stream's `seq`); Ctrl-C cancels it over HTTP. Only with `--embedded` does the
pull run in this process (acquisition/acquire.py, a core module that only emits events; a download
needs no llama.cpp) and its records carry no `seq`. Either way the same events go through
the same presenters and wire codec as `load`'s.

Ctrl-C: the first one stops the transfer at once (a KeyboardInterrupt in the download's socket
read, or at the next chunk when it lands while a record is being written — a record is never
cut in half) and the pull ends `model_download_cancelled` + `model_preparation_cancelled`, exit
130; later ones only wait for that cleanup.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from skippyctl.acquisition.acquire import Acquisition, Prepared
from skippyctl.acquisition.errors import PreparationCancelled, PreparationError
from skippyctl.acquisition.hub import HubSettings, quiet_hub_library
from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode, exit_code_for, exit_code_for_text
from skippyctl.cli.presenters import NdjsonPresenter, Presenter, PullProgressPresenter
from skippyctl.cli.settings import runtime_settings
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient

FORCE_QUIT_AFTER_S = 10.0
"""After a Ctrl-C, how long to wait for the runtime's cancellation before giving up."""

_PULL_ENDS = frozenset(
    {
        EventId.MODEL_PREPARATION_COMPLETED,
        EventId.MODEL_PREPARATION_CACHE_REUSED,
        EventId.MODEL_PREPARATION_FAILED,
        EventId.MODEL_PREPARATION_CANCELLED,
    }
)
"""The pull's own terminals: a Ctrl-C during their write changes nothing any more."""

REF_HELP = (
    "A local GGUF path, hf://ORG/REPO/FILE.gguf, or ORG/REPO:QUANT (the repo's one GGUF file "
    "whose name contains QUANT, e.g. Q4_K_M; a split set counts as one file)."
)


class _InterruptGate:
    """SIGINT during a pull: raise KeyboardInterrupt at once (it breaks a blocking socket
    read), except while a record is written — then right after that record (unless it was the
    pull's last). The acquisition is also asked to stop at its next chunk. After the first one,
    further signals are counted, never raised."""

    def __init__(self, presenter: Presenter) -> None:
        self.presenter = presenter
        self.acquisition: Acquisition | None = None
        self.count = 0
        self.writing = False
        self.pending = False
        self._previous: Any = None

    def show(self, event: Event) -> None:
        self.writing = True
        try:
            self.presenter.show(event, None)
        finally:
            self.writing = False
        if self.pending and event.id not in _PULL_ENDS:
            self.pending = False
            raise KeyboardInterrupt  # the Ctrl-C that came during the write, now it is whole

    def __enter__(self) -> _InterruptGate:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self.count += 1
        if self.acquisition is not None:
            self.acquisition.cancel()
        if self.count > 1:
            return
        if self.writing:
            self.pending = True
        else:
            raise KeyboardInterrupt


@dataclass(frozen=True, slots=True)
class PullResult:
    code: ExitCode
    message: str
    prepared: Prepared | None = None


def pull_ref(
    ref: str, presenter: Presenter, settings: RuntimeSettings, hub: HubSettings | None = None
) -> PullResult:
    """Run one pull, showing its events on `presenter`; never raises for a failed pull."""
    if not settings.hub_verbosity_set:
        quiet_hub_library()
    gate = _InterruptGate(presenter)
    acquisition = Acquisition(gate.show, hub)
    gate.acquisition = acquisition
    try:
        with gate:
            prepared = acquisition.prepare(ref)
    except PreparationCancelled:
        return PullResult(ExitCode.CANCELLED, "cancelled")
    except PreparationError as error:
        return PullResult(exit_code_for(error.reason), f"{error.reason.value}: {error.message}")
    except KeyboardInterrupt:  # a Ctrl-C that landed outside the acquisition's handlers
        return PullResult(ExitCode.CANCELLED, "cancelled (forced)")
    if prepared.reused:
        what = "reused from the cache"
    elif prepared.verified and "none" not in prepared.verified:
        what = "downloaded and verified"
    elif prepared.verified:
        what = "downloaded and checked (the hub gave no checksum)"
    else:
        what = "checked"
    return PullResult(ExitCode.SUCCESS, f"{prepared.model_id}: {what}", prepared)


def pull_through(
    client: RuntimeClient, ref: str, revision: str, presenter: Presenter
) -> PullResult:
    """Run one pull in the runtime behind ``client``, showing its events as the live stream
    brings them; Ctrl-C asks the runtime to cancel it (a second one stops following)."""
    from skippyctl.cli.feeds import LiveStream, StreamItem
    from skippyctl.cli.follow import CancelThenForce, InterruptRequests, follow
    from skippyctl.client.http import ApiError

    feed = LiveStream(client)  # subscribed before the pull is asked for: no event missed
    feed.wait_connected()
    try:
        operation = client.pull(ref, revision)
    except ApiError as error:
        return PullResult(exit_code_for_text(error.reason_code), str(error))

    def mine(item: StreamItem) -> bool:
        event = item.event
        return event.operation_id == operation or event.parent_operation_id == operation

    def ends(item: StreamItem) -> PullResult | None:
        event = item.event
        if event.operation_id != operation or event.id not in _PULL_ENDS:
            return None
        if event.id is EventId.MODEL_PREPARATION_CANCELLED:
            return PullResult(ExitCode.CANCELLED, "cancelled")
        if event.id is EventId.MODEL_PREPARATION_FAILED:
            reason = event.reason_code.value if event.reason_code else "unknown_failure"
            return PullResult(exit_code_for(event.reason_code), f"{reason}: the pull failed")
        what = (
            "reused from the cache"
            if event.id is EventId.MODEL_PREPARATION_CACHE_REUSED
            else "ready in the runtime's cache"
        )
        return PullResult(ExitCode.SUCCESS, f"{event.scope.model_id}: {what}")

    with InterruptRequests() as interrupts:
        return follow(
            feed,
            relevant=mine,
            show=lambda item: presenter.show(item.event, item.sequence),
            ends=ends,
            stream_ended=lambda closed: PullResult(
                ExitCode.RUNTIME_UNREACHABLE, f"{closed} before the pull ended"
            ),
            interrupts=interrupts,
            on_interrupt=CancelThenForce(
                lambda: client.cancel(operation),
                PullResult(ExitCode.CANCELLED, "cancelled (forced)"),
                FORCE_QUIT_AFTER_S,
            ),
        )


def pull_command(
    ref: Annotated[str, typer.Argument(help=REF_HELP, show_default=False)],
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON events on stdout, one per line; nothing else.")
    ] = False,
    revision: Annotated[
        str, typer.Option("--revision", help="Branch, tag or commit of a Hugging Face repo.")
    ] = "main",
    embedded: Annotated[
        bool,
        typer.Option(
            "--embedded",
            help="Pull in this process, without a runtime (its event stream and the dashboard"
            " do not see it).",
        ),
    ] = False,
) -> None:
    """Fetch REF into the local model cache and check it, streaming model_preparation events.

    The pull runs in the runtime, which is started first when none runs: the runtime's event
    stream, `events --follow` and the dashboard show the download, and Ctrl-C cancels it there.
    With --embedded it runs in this process instead.

    Hugging Face files go through huggingface_hub and its cache (HF_HUB_CACHE, or HF_HOME/hub;
    default ~/.cache/huggingface/hub). HF_ENDPOINT picks the hub (a mirror, or a local one);
    the token, for private or gated repos, comes from HF_TOKEN or `hf auth login` and is never
    printed. A second pull of the same file reuses the cache without downloading. A downloaded
    file is checked against its sha256 (git sha1 for small files), its GGUF header and, for a
    split set, that every part is there.

    Exit code 0 once the file is ready; otherwise the code of the failure's reason (see the
    README's exit code table); 3 when no runtime answers. Ctrl-C cancels the download (exit
    130): its bytes stay in the cache as a partial file (never taken as complete) and the next
    pull of the same file resumes from them.

    Example:

        skippyctl pull hf://ggml-org/models/tinyllamas/stories15M-q4_0.gguf --json | jq -r .event
    """
    stderr = Console(stderr=True)
    settings = runtime_settings("pull", json_output)
    presenter: Presenter = NdjsonPresenter() if json_output else PullProgressPresenter(ref)
    client = None if embedded else attach_or_exit("pull", json_output)
    try:
        if client is not None:
            result = pull_through(client, ref, revision, presenter)
        else:
            result = pull_ref(ref, presenter, settings, HubSettings(revision=revision))
    finally:
        presenter.close()
        if client is not None:
            client.close()
    if result.code is ExitCode.SUCCESS:
        stderr.print(f"[green]✓[/] {result.message}", soft_wrap=True, highlight=False)
        if not json_output and result.prepared is not None:
            # For people only (never in an event): where the file is, to load or inspect it.
            stderr.print(f"  {result.prepared.path}", soft_wrap=True, highlight=False)
    else:
        stderr.print(f"[red]✗[/] {ref}: {result.message}", soft_wrap=True, highlight=False)
    raise typer.Exit(int(result.code))
