"""Launch or attach: how a command finds the runtime, or starts one in the background.

`connect()` reads the discovery file: a live runtime → attach; none (or a stale one) → start a
background `skippyctl runtime serve` and attach. `ServeOptions` is what a runtime is started
with: the composition root (`skippyctl.daemon.serve`) runs with them in the foreground, and
`start_background` turns them into that command line (credentials through the environment,
never argv). Errors surface as `RuntimeUnreachable` (`RuntimeConfigurationError` for an invalid
configuration), never as a raw traceback — also for an unusable runtime directory or a stale
file that cannot be replaced. Messages carry no absolute path (they may become JSON error
records), except the runtime log's, which the operator needs to read.

This module starts a process; it imports nothing of the runtime itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
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
from skippyctl.client.http import RuntimeClient, RuntimeConfigurationError, RuntimeUnreachable

MAX_PORT: Final = 65535
DEFAULT_PORT: Final = 8750
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
START_TIMEOUT_S: Final = 60.0


class ServeError(Exception):
    """The server could not start; the message says why, `reason` is a stable token."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ServeOptions:
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


def port_from_environment() -> int | None:
    """SKIPPY_PORT as a port number (0: any free port), None when unset or empty; raises
    RuntimeConfigurationError for anything else."""
    raw = os.environ.get("SKIPPY_PORT")
    if raw is None or not raw.strip():
        return None
    try:
        port = int(raw.strip())
    except ValueError:
        port = -1
    if not 0 <= port <= MAX_PORT:
        raise RuntimeConfigurationError(
            f"SKIPPY_PORT={raw.strip()[:32]!r} is not a port number "
            f"(0-{MAX_PORT}; 0: any free port)"
        )
    return port


def _remove_stale(problem: DiscoveryProblem) -> None:
    """Delete a stale/corrupt/untrusted discovery file so a new runtime can take its place."""
    if problem.reason == UNUSABLE_DIRECTORY:
        raise RuntimeUnreachable(str(problem))
    note_crashed_host()  # the next host reports the crash the file was evidence of
    try:
        discovery_path().unlink(missing_ok=True)
    except OSError as error:
        raise RuntimeUnreachable(
            f"{problem} ({problem.reason}), and it cannot be replaced: the runtime directory "
            f"is not writable ({error.strerror})"
        ) from error


def connect(autostart: bool = True, options: ServeOptions | None = None) -> RuntimeClient:
    try:
        discovery = read_discovery()
    except DiscoveryProblem as problem:
        _remove_stale(problem)
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
        port = port_from_environment()
        options = ServeOptions(port=DEFAULT_PORT if port is None else port)
    return RuntimeClient(launch(options, fall_back_to_any_port=True))


def launch(options: ServeOptions, fall_back_to_any_port: bool = False) -> Discovery:
    """Start a background runtime and return its discovery; RuntimeUnreachable (never an
    OSError) when it cannot be started, e.g. the runtime directory is not writable."""
    try:
        ensure_runtime_dir()
    except DiscoveryProblem as problem:
        raise RuntimeUnreachable(f"cannot start a runtime: {problem}") from problem
    try:
        try:
            return start_background(options)
        except ServeError as error:
            if error.reason != "address_in_use" or not fall_back_to_any_port:
                raise RuntimeUnreachable(str(error)) from error
        try:
            return start_background(replace(options, port=0))
        except ServeError as again:
            raise RuntimeUnreachable(str(again)) from again
    except OSError as error:
        raise RuntimeUnreachable(
            f"cannot start a runtime: {error.strerror or error} in the runtime directory"
        ) from error


def log_path() -> Path:
    return runtime_dir() / "runtime.log"


def start_background(options: ServeOptions) -> Discovery:
    """Start `runtime serve` detached and wait until it answers; returns its discovery."""
    import httpx

    remove_if_stale()
    directory = runtime_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    args = [
        sys.executable,
        "-m",
        "skippyctl",
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
    env = dict(os.environ)
    if options.api_key:
        env["SKIPPY_API_KEY"] = options.api_key
    with open(log_path(), "ab") as log:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeError(
                "start_failed",
                f"the runtime exited at start (status {process.returncode}); see {log_path()}",
            )
        try:
            discovery = read_discovery()
        except DiscoveryProblem:
            discovery = None
        if discovery is not None and discovery.pid == process.pid:
            try:
                httpx.get(f"{discovery.url}/health", timeout=2.0)
            except httpx.HTTPError:
                pass
            else:
                return discovery
        time.sleep(0.05)
    process.kill()
    raise ServeError("start_timeout", f"the runtime did not answer within {START_TIMEOUT_S:.0f} s")
