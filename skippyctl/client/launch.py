"""Launch or attach: how a command finds the runtime, or starts one in the background.

`connect()` reads the discovery file: a live runtime → attach; none (or a stale one) → start a
background `skippyctl runtime serve` and attach. `ServeOptions` is what a runtime is started
with (its command line, the environment's fallbacks resolved): the composition root
(`skippyctl.daemon.serve`) runs with them in the foreground, and `start_background` turns them
into that command line (credentials through the environment, never argv). Where the runtime
directory is and which port a runtime launched on demand takes come from the caller's
`RuntimeSettings` (read once at its start); the background runtime inherits this process's
environment and reads its own. Errors surface as `RuntimeUnreachable`, never as a raw
traceback — also for an unusable runtime directory or a stale file that cannot be replaced.
Messages carry no absolute path (they may become JSON error records), except the runtime log's,
which the operator needs to read.

This module starts a process; it imports nothing of the runtime itself.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from skippyctl.client.discovery import (
    UNUSABLE_DIRECTORY,
    Discovery,
    DiscoveryProblem,
    discovery_path,
    ensure_runtime_dir,
    note_crashed_host,
    read_discovery,
    remove_if_stale,
    runtime_dir,
)
from skippyctl.client.http import RuntimeClient, RuntimeUnreachable
from skippyctl.config.runtime_settings import (
    DEFAULT_PORT,
    RuntimeSettings,
    inherited_environment,
    python_module_command,
)

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
START_TIMEOUT_S: Final = 60.0


class ServeError(Exception):
    """The server could not start; the message says why, `reason` is a stable token."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What `runtime serve` is asked for on its command line: each flag, or the setting it falls
    back to (`--port`: SKIPPY_PORT, `--api-key`: SKIPPY_API_KEY, `--debug-token-events`:
    SKIPPY_DEBUG_TOKEN_EVENTS) resolved by the CLI. The rest of the runtime's configuration is
    its `RuntimeSettings`."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model_root: Path | None = None
    max_queue: int = 64
    session_ttl_s: float = 600.0
    allow_remote: bool = False
    replay_records: int = 4096
    debug_token_events: bool = False
    """Opt-in debug evidence: one `generation_token_observed` per sampled token (no token ids or
    text), through the droppable debug lane (drops counted)."""
    plugins: tuple[str, ...] = ()
    """Serving plugins every model gets (``--plugin``: a C plugin's path or an entry-point
    name)."""
    models_dir: Path | None = None
    """A directory whose GGUFs requests may name to have them loaded on demand."""
    presets: Path | None = None
    """A TOML presets file: model ids and their loads, loaded on demand
    (config/model_presets.py)."""
    ttl_s: float = -1.0
    """Idle seconds before a model without its own ttl unloads; -1: never."""
    max_models: int | None = None
    """At most this many models loaded at once; None: no limit."""
    memory_budget: str = "auto"
    """What the loaded models may take in memory together: a size (``8G``), ``auto`` (a share
    of the memory available when the runtime starts) or ``off``."""


def _remove_stale(problem: DiscoveryProblem, settings: RuntimeSettings) -> None:
    """Delete a stale/corrupt/untrusted discovery file so a new runtime can take its place."""
    if problem.reason == UNUSABLE_DIRECTORY:
        raise RuntimeUnreachable(str(problem))
    note_crashed_host(settings)  # the next host reports the crash the file was evidence of
    try:
        discovery_path(settings).unlink(missing_ok=True)
    except OSError as error:
        raise RuntimeUnreachable(
            f"{problem} ({problem.reason}), and it cannot be replaced: the runtime directory "
            f"is not writable ({error.strerror})"
        ) from error


def connect(
    settings: RuntimeSettings, autostart: bool = True, options: ServeOptions | None = None
) -> RuntimeClient:
    """A client of the running runtime; with ``autostart``, one is started in the background
    when none runs (``options``, else the defaults on ``settings.port``)."""
    try:
        discovery = read_discovery(settings)
    except DiscoveryProblem as problem:
        _remove_stale(problem, settings)
        discovery = None
    if discovery is not None:
        client = RuntimeClient(discovery)
        if client.reachable():
            return client
        client.close()
        if not autostart:
            raise RuntimeUnreachable(f"the runtime at {discovery.url} does not answer")
    if not autostart:
        raise RuntimeUnreachable("no runtime is running (start one with `skippyctl runtime start`)")
    if options is None:
        options = ServeOptions(port=settings.port)
    return RuntimeClient(launch(options, settings, fall_back_to_any_port=True))


def launch(
    options: ServeOptions, settings: RuntimeSettings, fall_back_to_any_port: bool = False
) -> Discovery:
    """Start a background runtime and return its discovery; RuntimeUnreachable (never an
    OSError) when it cannot be started, e.g. the runtime directory is not writable."""
    try:
        ensure_runtime_dir(settings)
    except DiscoveryProblem as problem:
        raise RuntimeUnreachable(f"cannot start a runtime: {problem}") from problem
    try:
        try:
            return start_background(options, settings)
        except ServeError as error:
            if error.reason != "address_in_use" or not fall_back_to_any_port:
                raise RuntimeUnreachable(str(error)) from error
        try:
            return start_background(replace(options, port=0), settings)
        except ServeError as again:
            raise RuntimeUnreachable(str(again)) from again
    except OSError as error:
        raise RuntimeUnreachable(
            f"cannot start a runtime: {error.strerror or error} in the runtime directory"
        ) from error


def log_path(settings: RuntimeSettings) -> Path:
    return runtime_dir(settings) / "runtime.log"


def start_background(options: ServeOptions, settings: RuntimeSettings) -> Discovery:
    """Start `runtime serve` detached and wait until it answers; returns its discovery."""
    remove_if_stale(settings)
    directory = runtime_dir(settings)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    args = [
        *python_module_command("skippyctl"),
        "runtime",
        "serve",
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--max-queue",
        str(options.max_queue),
    ]
    if options.model_root is not None:
        args += ["--model-root", str(options.model_root)]
    if options.allow_remote:
        args.append("--allow-remote")
    if options.debug_token_events:
        args.append("--debug-token-events")
    for plugin in options.plugins:
        args += ["--plugin", plugin]
    if options.models_dir is not None:
        args += ["--models-dir", str(options.models_dir)]
    if options.presets is not None:
        args += ["--presets", str(options.presets)]
    if options.ttl_s != -1.0:
        args += ["--ttl", repr(options.ttl_s)]
    if options.max_models is not None:
        args += ["--max-models", str(options.max_models)]
    if options.memory_budget != "auto":
        args += ["--memory-budget", options.memory_budget]
    env = inherited_environment()
    if options.api_key:
        env["SKIPPY_API_KEY"] = options.api_key
    log = log_path(settings)
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeError(
                "start_failed",
                f"the runtime exited at start (status {process.returncode}); see {log}",
            )
        try:
            discovery = read_discovery(settings)
        except DiscoveryProblem:
            discovery = None
        if discovery is not None and discovery.pid == process.pid:
            probe = RuntimeClient(discovery)
            try:
                if probe.reachable():
                    return discovery
            finally:
                probe.close()
        time.sleep(0.05)
    process.kill()
    raise ServeError("start_timeout", f"the runtime did not answer within {START_TIMEOUT_S:.0f} s")
