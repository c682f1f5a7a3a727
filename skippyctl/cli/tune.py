"""`skippyctl tune MODEL`: measure candidate threads × lanes on this machine and keep the best.

Each candidate is a real load in the runtime (its own id, ``tune-N``): a warm-up request, one
prompt of :data:`PREFILL_WORDS` words for the prefill rate (its receipt's figures), then one
greedy request per lane at once for the aggregate decode rate; then the candidate is unloaded.
The best is the highest aggregate decode tokens/s (prefill is reported beside it). With
``--apply`` it is written as the model's preset (``config/model_presets.py``): a runtime serving
that presets file reads it again when it changes, so its next on-demand load of the model uses
it. ``--seconds`` bounds the whole run: candidates not started by then are skipped and said so.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from skippyctl.cli.attach import attach_or_exit
from skippyctl.cli.exit_codes import ExitCode, exit_code_for_text
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json, fail, stderr_console
from skippyctl.config.load_options import LoadOptions
from skippyctl.reducer.state import SETTLED_MODEL_STATES

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient

CONTEXT_PER_LANE: Final = 1024
PREFILL_WORDS: Final = 200
SETTLE_TIMEOUT_S: Final = 300.0
SETTLED: Final = frozenset({"available", *(state.value for state in SETTLED_MODEL_STATES)})
"""A candidate's load or unload is over: it serves, or the reducer's settled states."""


def _numbers(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            "a comma-separated list of whole numbers", param_hint=flag
        ) from None
    if not values or any(value < 1 or value > 256 for value in values):
        raise typer.BadParameter("values from 1 to 256", param_hint=flag)
    return sorted(set(values))


def tune_command(
    model: Annotated[str, typer.Argument(help="A GGUF file on this machine.", show_default=False)],
    threads: Annotated[
        str, typer.Option("--threads", help="Thread counts to try, comma-separated.")
    ] = "1,2",
    lanes: Annotated[
        str, typer.Option("--lanes", help="Lane counts to try, comma-separated.")
    ] = "1,2,4",
    tokens: Annotated[
        int, typer.Option("--tokens", help="Tokens each decode request makes.", min=8, max=4096)
    ] = 64,
    seconds: Annotated[
        float,
        typer.Option("--seconds", help="Stop starting candidates after this long.", min=1),
    ] = 300.0,
    apply: Annotated[
        Path | None,
        typer.Option(
            "--apply",
            metavar="PRESETS.toml",
            help="Write the best as the model's preset in this presets file (created if"
            " missing; its other presets are kept, its comments are not).",
        ),
    ] = None,
    alias: Annotated[
        str | None,
        typer.Option("--as", help="The preset's model id (default: the file's name)."),
    ] = None,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="One tune_candidate record per candidate, then tune_result."),
    ] = False,
) -> None:
    """Measure prefill and decode tokens/s for each threads × lanes candidate and keep the best.

    Each candidate is loaded in the runtime, measured with real requests and unloaded; a
    running runtime's other models keep serving (their engines take turns with the candidate's,
    so measure on a quiet runtime). Exit 0 with a best candidate; otherwise the code of the
    failure's reason.

    Example:

        skippyctl tune model.gguf --threads 1,2 --lanes 1,2,4 --apply presets.toml --json
    """
    candidates = list(itertools.product(_numbers(threads, "--threads"), _numbers(lanes, "--lanes")))
    path = Path(model).expanduser()
    if not path.is_file():
        fail("tune", ExitCode.MISSING_ARTIFACT, f"{path.name}: no such file", json_output)
    from skippyctl.events.identity import model_id_for

    preset_id = alias or str(model_id_for(str(path)))
    client = attach_or_exit("tune", json_output)
    err = stderr_console()
    started = time.monotonic()
    measured: list[dict[str, Any]] = []
    try:
        for index, (thread_count, lane_count) in enumerate(candidates, start=1):
            if time.monotonic() - started > seconds:
                err.print(f"time is up: {len(candidates) - index + 1} candidate(s) not measured")
                break
            err.print(
                f"[{index}/{len(candidates)}] threads={thread_count} lanes={lane_count} …",
                end="",
            )
            record = _measure(client, path, index, thread_count, lane_count, tokens)
            measured.append(record)
            err.print(
                f" decode {record['decode_tokens_per_s']:.1f} tok/s,"
                f" prefill {record['prefill_tokens_per_s']:.1f} tok/s"
            )
            if json_output:
                emit_json(
                    {"schema_version": RECORD_SCHEMA_VERSION, "record": "tune_candidate", **record}
                )
    except _TuneFailed as failure:
        fail("tune", failure.code, failure.message, json_output)
    finally:
        client.close()
    if not measured:
        fail("tune", ExitCode.TIMEOUT, "no candidate was measured", json_output)
    best = max(measured, key=lambda record: record["decode_tokens_per_s"])
    applied = None
    if apply is not None:
        applied = _apply(apply, preset_id, path, best, json_output)
    result: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record": "tune_result",
        "model_id": preset_id,
        "best": {k: best[k] for k in ("threads", "lanes", "context_tokens")},
        "decode_tokens_per_s": best["decode_tokens_per_s"],
        "prefill_tokens_per_s": best["prefill_tokens_per_s"],
        "candidates": len(measured),
        "applied_to": applied,
    }
    if json_output:
        emit_json(result)
    where = f"; written as preset '{preset_id}'" if applied else ""
    err.print(
        f"[green]✓[/] best: threads={best['threads']} lanes={best['lanes']}"
        f" ({best['decode_tokens_per_s']:.1f} tok/s decode){where}"
    )
    raise typer.Exit(int(ExitCode.SUCCESS))


class _TuneFailed(Exception):
    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _measure(
    client: RuntimeClient, path: Path, index: int, threads: int, lanes: int, tokens: int
) -> dict[str, Any]:
    from skippyctl.client.http import ApiError

    model_id = f"tune-{index}"
    options = LoadOptions(
        str(path.resolve()),
        alias=model_id,
        threads=threads,
        lanes=lanes,
        ctx=lanes * CONTEXT_PER_LANE,
    )
    try:
        client.load(options)
        state = _settle(client, model_id, "available")
        if state != "available":
            raise _TuneFailed(ExitCode.MODEL_FORMAT_OR_LOAD_FAILURE, f"the load ended {state}")
        body = {"model": model_id, "temperature": 0, "prompt": "Hello", "max_tokens": 4}
        client.completion(body)  # warm-up: the first decode of a context builds its graph
        prefill_body = dict(body, prompt="word " * PREFILL_WORDS, max_tokens=1)
        _, request_id = client.completion(prefill_body)
        receipt = client.receipt(request_id) or {}
        prompt_tokens = float(receipt.get("prompt_tokens") or 0)
        prefill_ms = float(receipt.get("prefill_ms") or 0)
        decode_body = dict(body, prompt="Once upon a time", max_tokens=tokens)
        begun = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
            answers = list(pool.map(lambda _: client.completion(decode_body)[0], range(lanes)))
        wall_s = time.perf_counter() - begun
        generated = sum(int(answer["usage"]["completion_tokens"]) for answer in answers)
    except ApiError as error:
        raise _TuneFailed(exit_code_for_text(error.reason_code), str(error)) from error
    finally:
        _unload(client, model_id)
    return {
        "threads": threads,
        "lanes": lanes,
        "context_tokens": lanes * CONTEXT_PER_LANE,
        "decode_tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else 0.0,
        "prefill_tokens_per_s": round(prompt_tokens * 1000.0 / prefill_ms, 2)
        if prefill_ms > 0
        else 0.0,
    }


def _settle(client: RuntimeClient, model_id: str, wanted: str) -> str:
    """The model's state once it is ``wanted`` or settled otherwise (polled)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    state = "unknown"
    while time.monotonic() < deadline:
        _, health = client.health()
        state = str(health.get("models", {}).get(model_id, "unknown"))
        if state == wanted or state in SETTLED:
            return state
        time.sleep(0.05)
    return state


def _unload(client: RuntimeClient, model_id: str) -> None:
    from skippyctl.client.http import ApiError

    try:
        client.unload(model_id, force=True, drain_timeout_s=None)
    except ApiError:
        return  # not loaded (its load failed): nothing to unload
    _settle(client, model_id, "unloaded")


def _apply(
    presets: Path, preset_id: str, path: Path, best: dict[str, Any], json_output: bool
) -> str | None:
    from skippyctl.config.model_presets import PresetsError, write_preset
    from skippyctl.events.envelope import InvalidLogicalId, LogicalId

    values = {
        "model": str(path.resolve()),
        "threads": best["threads"],
        "lanes": best["lanes"],
        "ctx": best["context_tokens"],
    }
    try:
        write_preset(presets.expanduser(), LogicalId(preset_id), values)
    except (PresetsError, InvalidLogicalId, OSError) as error:
        fail(
            "tune", ExitCode.INVALID_CONFIGURATION, f"--apply {presets.name}: {error}", json_output
        )
    return presets.name
