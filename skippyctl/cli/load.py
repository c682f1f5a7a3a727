"""`skippyctl load MODEL`: load a GGUF model and follow its events to one outcome.

By default it attaches to the runtime host (starting one in the background when none runs);
`--embedded` runs a host inside this process for one-shot use (the engine is still its own
process). Either way the same events are shown, and the exit code comes from the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from skippyctl.acquisition.artifacts import split_parts
from skippyctl.acquisition.references import is_remote_ref
from skippyctl.cli.common import (
    EventFeed,
    InterruptRequests,
    LiveStream,
    StreamEnded,
    SubscriptionFeed,
    plugin_specs,
)
from skippyctl.cli.events import fail
from skippyctl.cli.exit_codes import ExitCode, exit_code_for, exit_code_for_text
from skippyctl.cli.presenters import (
    LoadProgressPresenter,
    NdjsonPresenter,
    Presenter,
    PullProgressPresenter,
)
from skippyctl.cli.pull import PullResult, pull_ref
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event
from skippyctl.events.reasons import Category, ReasonCode
from skippyctl.output.summary import reason_message, render_summary
from skippyctl.stages.plan import stage_options_problem

TERMINALS = frozenset(
    {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}
)
FORCE_QUIT_AFTER_S = 5.0
_LOAD_CATEGORIES = frozenset(
    {Category.MODEL_LOADING, Category.MODEL_AVAILABILITY, Category.NATIVE_RUNTIME}
)


def load_command(
    model: Annotated[
        str,
        typer.Argument(
            help="Path to a GGUF file (first part of a split set), hf://ORG/REPO/FILE.gguf or "
            "ORG/REPO:QUANT (pulled first, as `skippyctl pull` does).",
            show_default=False,
        ),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="NDJSON events on stdout, one per line; nothing else.")
    ] = False,
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            help="Whole context in tokens, split evenly across the lanes (default: each lane "
            "gets the model's training context, at most 4096, within half the free memory).",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Give up (and cancel) after this many seconds."),
    ] = None,
    alias: Annotated[
        str | None, typer.Option("--alias", help="Model id to use instead of the file's name.")
    ] = None,
    lanes: Annotated[
        int | None,
        typer.Option(
            "--lanes",
            help="Parallel sequences (lanes) for serving (default: 4; with --ctx, as many of "
            "up to 4 as keep 1024 tokens each).",
        ),
    ] = None,
    gpu_layers: Annotated[
        int, typer.Option("--gpu-layers", help="Layers to offload to a GPU (-1: all).")
    ] = 0,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait", help="Follow the load to its outcome, or return once it started."
        ),
    ] = True,
    embedded: Annotated[
        bool, typer.Option("--embedded", help="Run a one-shot host inside this process.")
    ] = False,
    stage: Annotated[
        list[str] | None,
        typer.Option(
            "--stage",
            help="A ggml RPC stage (`skippyctl stage serve`) as IPv4 HOST:PORT to split the "
            "model across; repeat it for each stage, in order (at most 16).",
        ),
    ] = None,
    local_stages: Annotated[
        int,
        typer.Option(
            "--local-stages",
            help="Start N stage workers on loopback for this model (after any --stage); they "
            "stop when it is unloaded or its load fails.",
        ),
    ] = 0,
    mem: Annotated[
        int | None,
        typer.Option(
            "--mem",
            help="Memory (MiB) each local stage offers to the plan (as `stage serve --mem`; "
            "default: what its device reports free).",
        ),
    ] = None,
    replan: Annotated[
        bool,
        typer.Option(
            "--replan",
            help="When a --stage cannot be reached, plan onto the stages that remain instead "
            "of failing (the lost one is still reported as stage_unavailable).",
        ),
    ] = False,
    stage_link_p95_ms: Annotated[
        float | None,
        typer.Option(
            "--stage-link-p95-ms",
            show_default=False,
            help="A stage whose link p95 round trip (measured by the engine about once a "
            "second) goes above this many ms is stage_degraded; ready again below 0.8 x it. "
            "Default: 50.",
        ),
    ] = None,
    spec: Annotated[
        str,
        typer.Option(
            "--spec",
            help="Speculative decoding: 'ngram' proposes the tokens that followed the latest "
            "earlier occurrence of the text's last tokens (prompt lookup, no extra model: the "
            "built-in plugin 'ngram', run in the engine process) and verifies them in the same "
            "decode step; 'plugin' asks the --plugin plugins for "
            "proposals, under --spec-deadline-ms; 'draft' verifies the --draft model's "
            "continuation; the text is what decoding without it gives either way. 'off': one "
            "token per step.",
        ),
    ] = "off",
    spec_draft_tokens: Annotated[
        int | None,
        typer.Option(
            "--spec-draft-tokens",
            show_default=False,
            help="Most proposed tokens a lane verifies in one step (1-64; a lane starts at 4 "
            "and doubles while every proposal is accepted; a step verifies at most 64 over "
            "all lanes). Default: 64.",
        ),
    ] = None,
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            show_default=False,
            help="A serving plugin for this model (repeatable): a C plugin's .so file or a "
            "Python plugin's entry-point name (group skippyctl.plugins; built in: 'ngram'). "
            "Each runs in its own "
            "process beside the engine, sees every request's lifecycle and committed tokens, "
            "and with --spec plugin proposes; a failing plugin is reported and disabled, "
            "never fails a request. See examples/plugins.",
        ),
    ] = None,
    spec_deadline_ms: Annotated[
        float | None,
        typer.Option(
            "--spec-deadline-ms",
            show_default=False,
            help="How long a decode step waits for the plugins' proposals (0.1-1000 ms); a "
            "later answer is dropped and counted as late. Default: 8.",
        ),
    ] = None,
    draft: Annotated[
        str | None,
        typer.Option(
            "--draft",
            show_default=False,
            help="A draft model (a smaller GGUF with the same vocabulary) whose greedy "
            "continuation each decoding lane verifies in the same step (implies --spec draft); "
            "the text is what decoding without it gives.",
        ),
    ] = None,
    spec_runahead_tokens: Annotated[
        int | None,
        typer.Option(
            "--spec-runahead-tokens",
            show_default=False,
            help="With --spec plugin or ngram: proposals a query may ask for past the window "
            "(0-256). "
            "They become the next window without a query when the window verifies whole, and "
            "are discarded unexecuted (counted in the receipt) when it does not. Default: 0 "
            "(fixed depth: one query a window).",
        ),
    ] = None,
) -> None:
    """Load MODEL and stream its load events until it is available or has failed.

    Exit code 0 once the model is available; otherwise the code of the failure's reason
    (see the README's exit code table). Ctrl-C cancels the load.

    Example:

        skippyctl load fixtures/tiny.gguf --json | jq -r .event
    """
    stderr = Console(stderr=True)
    from skippyctl.runtime.host import speculation_problem

    plugins = plugin_specs(plugin)
    if draft is not None:
        spec = "draft" if spec == "off" else spec
        draft = str(Path(draft).expanduser().resolve())
    stages = ServingArgs(
        tuple(stage or ()),
        local_stages,
        mem,
        replan,
        stage_link_p95_ms,
        spec,
        spec_draft_tokens,
        plugins,
        spec_deadline_ms,
        spec_runahead_tokens,
        draft,
    )
    problem = speculation_problem(
        spec, spec_draft_tokens, plugins, spec_deadline_ms, spec_runahead_tokens, draft
    ) or stages.problem(gpu_layers)
    if problem is not None:
        # Refused before any runtime is asked: no event says why, so with --json an error record
        # does (the message names no path; stderr says the same).
        reason = ReasonCode.INVALID_CONFIGURATION.value
        fail("load", ExitCode.INVALID_CONFIGURATION, problem, json_output, reason)
    shown = model
    if is_remote_ref(model):
        # Resolve and download first (this process, as `pull`), then load the local file by
        # the id of the file's name (its cache path is a hash).
        pulled = _pull_first(model, json_output)
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
        alias = alias or str(pulled.prepared.model_id)
        model = str(pulled.prepared.path)
    with InterruptRequests() as interrupts:
        if embedded:
            code, message = _embedded(
                model, json_output, ctx, timeout, alias, lanes, gpu_layers, interrupts, stages
            )
        else:
            code, message = _attached(
                model,
                json_output,
                ctx,
                timeout,
                alias,
                lanes,
                gpu_layers,
                wait,
                interrupts,
                stages,
            )
    if code is ExitCode.SUCCESS:
        stderr.print(f"[green]✓[/] {message}", soft_wrap=True, highlight=False)
    else:
        stderr.print(f"[red]✗[/] {shown}: {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(int(code))


def _pull_first(ref: str, json_output: bool) -> PullResult:
    presenter: Presenter = NdjsonPresenter() if json_output else PullProgressPresenter(ref)
    try:
        return pull_ref(ref, presenter)
    finally:
        presenter.close()


@dataclass(frozen=True, slots=True)
class ServingArgs:
    """The engine-shaping options of a load: ``--stage`` endpoints, ``--local-stages``,
    ``--mem``, ``--replan``, the link threshold, and ``--spec``."""

    endpoints: tuple[str, ...] = ()
    local_stages: int = 0
    mem_mib: int | None = None
    replan: bool = False
    link_p95_ms: float | None = None
    speculation: str = "off"
    spec_draft_tokens: int | None = None
    plugins: tuple[str, ...] = ()
    spec_deadline_ms: float | None = None
    spec_runahead_tokens: int | None = None
    draft: str | None = None

    def problem(self, gpu_layers: int = 0) -> str | None:
        """Why the options are invalid (before any runtime is reached), or None."""
        return stage_options_problem(
            self.endpoints,
            self.local_stages,
            self.mem_mib,
            self.replan,
            self.link_p95_ms,
            gpu_layers,
        )


def _presenter(json_output: bool, label: str) -> Presenter:
    return NdjsonPresenter() if json_output else LoadProgressPresenter(label)


def _embedded(
    model: str,
    json_output: bool,
    ctx: int | None,
    timeout: float | None,
    alias: str | None,
    lanes: int | None,
    gpu_layers: int,
    interrupts: InterruptRequests,
    stages: ServingArgs,
) -> tuple[ExitCode, str]:
    from skippyctl.runtime.host import LoadRequest, RuntimeHost

    host = RuntimeHost().start()
    subscription = host.pipeline.subscribe("cli-load", max_queue_size=65536, replay=True)
    request = LoadRequest(
        model,
        alias,
        ctx,
        lanes,
        gpu_layers,
        timeout,
        stages=stages.endpoints,
        local_stages=stages.local_stages,
        local_stage_mem_mib=stages.mem_mib,
        replan=stages.replan,
        stage_link_p95_ms=stages.link_p95_ms,
        speculation=stages.speculation,
        spec_draft_tokens=stages.spec_draft_tokens,
        plugins=stages.plugins,
        spec_deadline_ms=stages.spec_deadline_ms,
        spec_runahead_tokens=stages.spec_runahead_tokens,
        draft=stages.draft,
    )
    handle = host.load_model(request)
    if handle.already_available:  # cannot happen in a fresh host, kept for symmetry
        return ExitCode.SUCCESS, f"{handle.model_id}: already available"
    presenter = _presenter(json_output, handle.model_id or model)
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


def _attached(
    model: str,
    json_output: bool,
    ctx: int | None,
    timeout: float | None,
    alias: str | None,
    lanes: int | None,
    gpu_layers: int,
    wait: bool,
    interrupts: InterruptRequests,
    stages: ServingArgs,
) -> tuple[ExitCode, str]:
    from skippyctl.client.http import (
        ApiError,
        RuntimeConfigurationError,
        RuntimeUnreachable,
    )
    from skippyctl.client.launch import connect

    # The runtime resolves relative paths against its model root; a path that exists from here
    # is made absolute so it means what the user typed.
    artifact = str(Path(model).resolve()) if Path(model).expanduser().exists() else model
    body: dict[str, Any] = {
        "model": artifact,
        "alias": alias,
        "ctx": ctx,
        "lanes": lanes,
        "gpu_layers": gpu_layers,
        "timeout_s": timeout,
    }
    if stages.endpoints:
        body["stages"] = list(stages.endpoints)
    if stages.local_stages:
        body["local_stages"] = stages.local_stages
    if stages.mem_mib is not None:
        body["local_stage_mem_mib"] = stages.mem_mib
    if stages.replan:
        body["replan"] = True
    if stages.link_p95_ms is not None:
        body["stage_link_p95_ms"] = stages.link_p95_ms
    if stages.speculation != "off":
        body["spec"] = stages.speculation
    if stages.spec_draft_tokens is not None:
        body["spec_draft_tokens"] = stages.spec_draft_tokens
    if stages.plugins:
        body["plugins"] = list(stages.plugins)
    if stages.spec_deadline_ms is not None:
        body["spec_deadline_ms"] = stages.spec_deadline_ms
    if stages.spec_runahead_tokens is not None:
        body["spec_runahead_tokens"] = stages.spec_runahead_tokens
    if stages.draft is not None:
        body["draft"] = stages.draft
    try:
        client = connect()
    except RuntimeConfigurationError as error:
        return ExitCode.INVALID_CONFIGURATION, str(error)
    except RuntimeUnreachable as error:
        return ExitCode.RUNTIME_UNREACHABLE, str(error)
    try:
        feed = LiveStream(client)  # subscribed before the load is asked for: no event missed
        feed.wait_connected()
        try:
            answer = client.load(body)
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
    cancel_requested_at: float | None = None
    while True:
        if interrupts.count and cancel_requested_at is None:
            cancel_requested_at = time.monotonic()
            cancel()
        if cancel_requested_at is not None and (
            interrupts.count > 1 or time.monotonic() - cancel_requested_at > FORCE_QUIT_AFTER_S
        ):
            return ExitCode.CANCELLED, "cancelled (forced)"
        try:
            fed = feed.next(0.1)
        except StreamEnded as closed:
            return ExitCode.RUNTIME_UNREACHABLE, f"{closed} before the load ended"
        if fed is None or not (everything or _relevant(fed.event, operation, model_id)):
            continue
        event = fed.event
        presenter.show(event, fed.sequence)
        if event.operation_id != operation or event.id not in TERMINALS:
            continue
        if event.id is EventId.MODEL_AVAILABLE:
            return ExitCode.SUCCESS, f"{model_id}: {render_summary(event)}"
        reason = event.reason_code.value if event.reason_code else "unknown_failure"
        detail = problem or reason_message(reason)
        return exit_code_for(event.reason_code), f"{event.id.value} ({reason}): {detail}"
