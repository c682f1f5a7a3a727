"""`skippyctl load MODEL`: load a GGUF model and follow its events to one outcome.

By default it attaches to the runtime host (starting one in the background when none runs);
`--embedded` runs a host inside this process for one-shot use (the engine is still its own
process). Either way the same events are shown, and the exit code comes from the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from skippyctl.acquisition.artifacts import split_parts
from skippyctl.acquisition.references import is_remote_ref
from skippyctl.cli.exit_codes import ExitCode, exit_code_for, exit_code_for_text
from skippyctl.cli.feeds import EventFeed, LiveStream, StreamItem, SubscriptionFeed
from skippyctl.cli.fleet_flags import FleetFileOption, NodeOption, attach_node_or_exit
from skippyctl.cli.follow import CancelThenForce, InterruptRequests, every_event, follow
from skippyctl.cli.load_flags import load_flags
from skippyctl.cli.output import fail
from skippyctl.cli.plugin_flags import plugin_specs
from skippyctl.cli.presenters import (
    LoadProgressPresenter,
    NdjsonPresenter,
    Presenter,
    PullProgressPresenter,
)
from skippyctl.cli.pull import PullResult, pull_ref
from skippyctl.cli.settings import runtime_settings
from skippyctl.config.fleet import LOCAL_NODE
from skippyctl.config.load_options import LoadOptions, SpecMode
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category, ReasonCode
from skippyctl.output.summary import format_bytes, reason_message, render_summary

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient

TERMINALS = frozenset(
    {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}
)
FORCE_QUIT_AFTER_S = 5.0
_LOAD_CATEGORIES = frozenset(
    {Category.MODEL_LOADING, Category.MODEL_AVAILABILITY, Category.NATIVE_RUNTIME}
)


@load_flags
def load_command(
    model: Annotated[
        str,
        typer.Argument(
            help="Path to a GGUF file (first part of a split set), hf://ORG/REPO/FILE.gguf or "
            "ORG/REPO:QUANT (pulled first, as `skippyctl pull` does), or the id of a model the "
            "runtime may load on demand (a preset, a --models-dir file, a cached hub file: "
            "its options, with the flags given here on top).",
            show_default=False,
        ),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON events on stdout, one per line; nothing else.")
    ] = False,
    options: LoadOptions | None = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait", help="Follow the load to its outcome, or return once it started."
        ),
    ] = True,
    embedded: Annotated[
        bool, typer.Option("--embedded", help="Run a one-shot host inside this process.")
    ] = False,
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate",
            help="Say what the load would take in memory (weights, KV cache per lane, compute"
            " buffers) beside the runtime's memory budget, read from the file's header; load"
            " nothing.",
        ),
    ] = False,
    node: NodeOption = None,
    fleet_file: FleetFileOption = None,
) -> None:
    """Load MODEL and stream its load events until it is available or has failed.

    Exit code 0 once the model is available; otherwise the code of the failure's reason
    (see the README's exit code table). Ctrl-C cancels the load. The options are those of
    `POST /api/runtime/models/load`.

    With --node NAME (a `skippyctl fleet` member) the load happens on that runtime: MODEL and
    --draft are then paths (or model ids) on that machine, taken as given.

    Example:

        skippyctl load fixtures/tiny.gguf --json | jq -r .event

        skippyctl load /models/qwen.gguf --node gpu1 --json | jq -r .event
    """
    assert options is not None  # given by load_flags
    stderr = Console(stderr=True)
    options = options.replace(plugins=plugin_specs(list(options.plugins)))
    remote = node is not None and node != LOCAL_NODE
    if remote and (embedded or is_remote_ref(model) or estimate):
        what = "--embedded" if embedded else "--estimate" if estimate else "a hub reference"
        fail(
            "load",
            ExitCode.INVALID_CONFIGURATION,
            f"{what} works on this machine only, not with --node (pull on that node, then "
            "load the file or its id)",
            json_output,
            ReasonCode.INVALID_CONFIGURATION.value,
        )
    if options.draft is not None:
        # A draft implies its mode; it is a file on this machine, named for the runtime (on
        # a --node, a file on that one, as given).
        spec = SpecMode.DRAFT if options.spec is SpecMode.OFF else options.spec
        draft = options.draft if remote else str(Path(options.draft).expanduser().resolve())
        options = options.replace(draft=draft, spec=spec)
    problem = options.problem()
    if problem is not None:
        # Refused before any runtime is asked: no event says why, so with --json an error record
        # does (the message names no path; stderr says the same).
        reason = ReasonCode.INVALID_CONFIGURATION.value
        fail("load", ExitCode.INVALID_CONFIGURATION, problem, json_output, reason)
    settings = runtime_settings("load", json_output)
    shown = model
    if estimate:
        if is_remote_ref(model):
            fail(
                "load",
                ExitCode.INVALID_CONFIGURATION,
                "--estimate reads a local file: pull the reference first (skippyctl pull)",
                json_output,
                ReasonCode.INVALID_CONFIGURATION.value,
            )
        raise typer.Exit(int(_estimate(options, settings, json_output)))
    if is_remote_ref(model):
        # Resolve and download first (this process, as `pull`), then load the local file by
        # the id of the file's name (its cache path is a hash).
        pulled = _pull_first(model, json_output, settings)
        if pulled.prepared is None:
            stderr.print(f"[red]✗[/] {model}: {pulled.message}", soft_wrap=True, highlight=False)
            raise typer.Exit(int(pulled.code))
        if split_parts(pulled.prepared.path) is not None:
            # The host loads the resolved path, and the cache's links resolve to blobs named by
            # hash, where llama.cpp cannot find a split set's other parts by name.
            stderr.print(
                f"[red]✗[/] {model}: loading a split set from the Hugging Face cache is not "
                "supported yet; it is pulled: copy (or hard-link) its parts into one directory "
                "and load the first part",
                soft_wrap=True,
                highlight=False,
            )
            raise typer.Exit(int(ExitCode.UNSUPPORTED_CAPABILITY))
        options = options.replace(
            model=str(pulled.prepared.path),
            alias=options.alias or str(pulled.prepared.model_id),
        )
    with InterruptRequests() as interrupts:
        if embedded:
            code, message = _embedded(options, settings, json_output, interrupts)
        elif remote:
            code, message = _attached(
                options,
                lambda: attach_node_or_exit("load", json_output, node, fleet_file),
                json_output,
                wait,
                interrupts,
            )
        else:
            from skippyctl.client.launch import connect

            code, message = _attached(
                _absolute_if_here(options), lambda: connect(settings), json_output, wait, interrupts
            )
    if code is ExitCode.SUCCESS:
        stderr.print(f"[green]✓[/] {message}", soft_wrap=True, highlight=False)
    else:
        stderr.print(f"[red]✗[/] {shown}: {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(int(code))


def _pull_first(ref: str, json_output: bool, settings: RuntimeSettings) -> PullResult:
    presenter: Presenter = NdjsonPresenter() if json_output else PullProgressPresenter(ref)
    try:
        return pull_ref(ref, presenter, settings)
    finally:
        presenter.close()


def _presenter(json_output: bool, label: str) -> Presenter:
    return NdjsonPresenter() if json_output else LoadProgressPresenter(label)


def _embedded(
    options: LoadOptions,
    settings: RuntimeSettings,
    json_output: bool,
    interrupts: InterruptRequests,
) -> tuple[ExitCode, str]:
    from skippyctl.runtime.host import RuntimeHost

    host = RuntimeHost(settings=settings).start()
    subscription = host.pipeline.subscribe("cli-load", max_queue_size=65536, replay=True)
    handle = host.load_model(options)
    if handle.already_available:  # cannot happen in a fresh host, kept for symmetry
        return ExitCode.SUCCESS, f"{handle.model_id}: already available"
    presenter = _presenter(json_output, handle.model_id or options.model)
    feed = SubscriptionFeed(subscription, host.pipeline.dispatcher.cursor)
    try:
        return _follow(
            feed,
            str(handle.operation_id),
            handle.model_id,
            handle.problem,
            presenter,
            interrupts,
            lambda: host.cancel(handle.operation_id, ReasonCode.CANCELLATION),
            everything=True,  # a one-shot host exists for this load: all it says is relevant
        )
    finally:
        presenter.close()
        host.shutdown()


def _estimate(options: LoadOptions, settings: RuntimeSettings, json_output: bool) -> ExitCode:
    """``load --estimate``: the runtime reads the file's header and says what the load would
    take; one ``load_estimate`` record with --json."""
    from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json, stderr_console
    from skippyctl.client.http import ApiError, RuntimeUnreachable
    from skippyctl.client.launch import connect

    if Path(options.model).expanduser().exists():
        options = options.replace(model=str(Path(options.model).expanduser().resolve()))
    try:
        client = connect(settings)
        try:
            found = client.estimate(options)
        finally:
            client.close()
    except ApiError as error:
        code = exit_code_for_text(error.reason_code)
        fail("load", code, str(error), json_output, error.reason_code)
    except RuntimeUnreachable as error:
        fail("load", ExitCode.RUNTIME_UNREACHABLE, str(error), json_output)
    if json_output:
        emit_json({"schema_version": RECORD_SCHEMA_VERSION, "record": "load_estimate", **found})
        return ExitCode.SUCCESS
    lanes, per_lane = found.get("lanes"), found.get("kv_bytes_per_lane")
    kv = format_bytes(found["kv_bytes"])
    if lanes and per_lane is not None:
        kv += f" ({format_bytes(per_lane)} per lane × {lanes}, {found['context_tokens']} tokens)"
    budget = found.get("memory_budget_bytes")
    lines = [
        f"{found['model_id']}: about {format_bytes(found['total_bytes'])} once loaded",
        f"  weights  {format_bytes(found['weights_bytes'])}",
        f"  KV cache {kv}",
        f"  compute  {format_bytes(found['compute_bytes'])}",
        "  budget   none"
        if budget is None
        else f"  budget   {format_bytes(found['memory_budget_used_bytes'])} of "
        f"{format_bytes(budget)} in use",
    ]
    stderr_console().print("\n".join(lines), highlight=False, markup=False)
    return ExitCode.SUCCESS


def _absolute_if_here(options: LoadOptions) -> LoadOptions:
    """The runtime resolves relative paths against its model root; a path that exists from here
    is made absolute so it means what the user typed."""
    if Path(options.model).expanduser().exists():
        return options.replace(model=str(Path(options.model).resolve()))
    return options


def _attached(
    options: LoadOptions,
    reach: Callable[[], RuntimeClient],
    json_output: bool,
    wait: bool,
    interrupts: InterruptRequests,
) -> tuple[ExitCode, str]:
    """The load in the runtime `reach` connects to (local, or a fleet node)."""
    from skippyctl.client.http import ApiError, RuntimeUnreachable

    model = options.model
    try:
        client = reach()
    except RuntimeUnreachable as error:
        return ExitCode.RUNTIME_UNREACHABLE, str(error)
    try:
        feed = LiveStream(client)  # subscribed before the load is asked for: no event missed
        feed.wait_connected()
        try:
            answer = client.load(options)
        except ApiError as error:
            return exit_code_for_text(error.reason_code), str(error)
        operation = str(answer["operation_id"])
        model_id = answer.get("model_id")
        if answer.get("already_available"):
            return ExitCode.SUCCESS, f"{model_id}: already available"
        presenter = _presenter(json_output, model_id or model)
        if not wait:
            presenter.close()
            return ExitCode.SUCCESS, f"{model_id}: load started ({operation})"
        try:
            return _follow(
                feed,
                operation,
                model_id,
                answer.get("problem"),
                presenter,
                interrupts,
                lambda: client.cancel(operation),
            )
        finally:
            presenter.close()
    except RuntimeUnreachable as error:
        return ExitCode.RUNTIME_UNREACHABLE, str(error)
    finally:
        client.close()


def _relevant(event: Event, operation: str, model_id: str | None) -> bool:
    if event.operation_id == operation:
        return True
    return (
        model_id is not None
        and event.scope.model_id == model_id
        and event.category in _LOAD_CATEGORIES
    )


def _follow(
    feed: EventFeed,
    operation: str,
    model_id: str | None,
    problem: str | None,
    presenter: Presenter,
    interrupts: InterruptRequests,
    cancel: Callable[[], None],
    everything: bool = False,
) -> tuple[ExitCode, str]:
    def ends(item: StreamItem) -> tuple[ExitCode, str] | None:
        event = item.event
        if event.operation_id != operation or event.id not in TERMINALS:
            return None
        if event.id is EventId.MODEL_AVAILABLE:
            return ExitCode.SUCCESS, f"{model_id}: {render_summary(event)}"
        reason = event.reason_code.value if event.reason_code else "unknown_failure"
        detail = problem or reason_message(reason)
        return exit_code_for(event.reason_code), f"{event.id.value} ({reason}): {detail}"

    return follow(
        feed,
        relevant=every_event
        if everything
        else lambda item: _relevant(item.event, operation, model_id),
        show=lambda item: presenter.show(item.event, item.sequence),
        ends=ends,
        stream_ended=lambda closed: (
            ExitCode.RUNTIME_UNREACHABLE,
            f"{closed} before the load ended",
        ),
        interrupts=interrupts,
        on_interrupt=CancelThenForce(
            cancel, (ExitCode.CANCELLED, "cancelled (forced)"), FORCE_QUIT_AFTER_S
        ),
    )
